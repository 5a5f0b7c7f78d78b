"""The per-step update exchanges (no Spark): the template every exchange shares
(``exchange.py``), threshold sharing, dense allreduce, parameter averaging, PowerSGD, overlap,
and the views of the optimizer's update and the model's variables they work on."""
