"""The driver's side of a fit, shared by every launcher (no Spark): the options a fit takes
(``fit.py``), Keras's ``fit`` over them (``keras_fit.py``), the run of the workers through a
launcher (``run_fit.py``, ``launcher.py``), the events the workers send to Keras callbacks
(``events.py``) and the progress line (``progress.py``)."""
