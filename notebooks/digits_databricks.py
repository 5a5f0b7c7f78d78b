# Databricks notebook source
# MAGIC %md
# MAGIC # sparkdl on Databricks: the digits data
# MAGIC
# MAGIC ETL with Spark → Parquet DataSet shards → threshold-compressed gradient sharing on 2
# MAGIC barrier-mode workers → distributed evaluation and inference, with the `spark` session the
# MAGIC cluster provides. Install first (a cluster library, or in the notebook):
# MAGIC `%pip install "sparkdl[cpu] @ git+<this repository>"`.
# MAGIC
# MAGIC Data and model go to a Unity Catalog Volume when `SPARKDL_DATA_ROOT` names one
# MAGIC (e.g. `/Volumes/main/default/sparkdl`), else to `/dbfs/tmp/sparkdl-digits`; both are
# MAGIC FUSE paths every node sees. Off Databricks (tests, a laptop) a local directory is used.

# COMMAND ----------

import os
import tempfile

root = os.environ.get("SPARKDL_DATA_ROOT")
if not root:
    if os.path.isdir("/dbfs"):
        root = "/dbfs/tmp/sparkdl-digits"
    else:  # local fallback: the tests' directory, or a fresh temporary one
        root = os.environ.get("SPARKDL_NOTEBOOK_DIR") or tempfile.mkdtemp(prefix="sparkdl-dbx-")
os.makedirs(root, exist_ok=True)
print("Spark", spark.version, "| master", spark.conf.get("spark.master", "?"), "| data root", root)

# COMMAND ----------

# MAGIC %md ## ETL: digits → normalized Parquet shards (train/test)

# COMMAND ----------

from sparkdl.pipelines import digits

shards = digits.run(spark, f"file://{root}/data", overwrite=True)
print(shards)

# COMMAND ----------

# MAGIC %md ## Training on 2 barrier-mode workers, gradient sharing with an adaptive threshold

# COMMAND ----------

import keras

from sparkdl import SharedTrainingMaster, SparkModel
from sparkdl.compression import AdaptiveThreshold
from sparkdl.data.files import read_metadata
from sparkdl.models import mlp

meta = read_metadata(shards["train"])
keras.utils.set_random_seed(7)
model = mlp(meta.feature_shape, meta.num_classes, hidden=(128, 64))
model.compile(optimizer=keras.optimizers.Adam(0.002), loss="sparse_categorical_crossentropy",
              metrics=["accuracy"])
training_master = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2,
                                       threshold=AdaptiveThreshold(initial=1e-3))
spark_model = SparkModel(spark, model, training_master)
# verbose=2: one line per epoch in the cell's output, as soon as the epoch ends
history = spark_model.fit(shards["train"], epochs=3, validation_data=shards["test"], verbose=2)
print({k: history.metrics[k] for k in ("samples_per_second", "bytes_per_step",
                                       "dense_bytes_per_step", "replicas_identical")})

# COMMAND ----------

# MAGIC %md ## Distributed evaluation and inference

# COMMAND ----------

evaluation = spark_model.evaluate(shards["test"])
print(evaluation.stats())
assert evaluation.accuracy() > 0.85, evaluation.accuracy()

predictions = spark_model.predict(shards["test"])
predictions.select("label", "prediction").show(5)

# COMMAND ----------

model_path = os.path.join(root, "model.keras")
spark_model.model.save(model_path)
print("saved", model_path)
