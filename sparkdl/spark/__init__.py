"""Everything in sparkdl that talks to Spark: launcher, executor task, attempts, inference, session."""
