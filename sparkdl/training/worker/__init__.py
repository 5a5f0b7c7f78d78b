"""A worker's side of a fit (no Spark): the task body every launcher runs, the worker that
sets TensorFlow up and trains, its loop, checkpoints, timeline and loss scaling."""
