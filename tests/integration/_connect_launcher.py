"""Run as a script: SparkModel.fit on a Spark Connect session (``remote("local[2]")``), in a
process of its own (a classic and a Connect session cannot share one). Prints one JSON line.

    python tests/integration/_connect_launcher.py <train shard URI>
"""

from __future__ import annotations

import json
import os
import sys


def main(train: str) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # an ephemeral Connect port (the client reads it back from the local server only with
    # SPARK_TESTING set), so that concurrent runs do not collide on 15002
    os.environ["SPARK_TESTING"] = "1"
    import keras
    from pyspark.sql import SparkSession

    from sparkdl import DenseTrainingMaster, SharedTrainingMaster, SparkModel
    from sparkdl.errors import TrainingError
    from sparkdl.models import mlp
    from sparkdl.spark.session import is_connect

    spark = (SparkSession.builder.remote("local[2]")
             .config("spark.connect.grpc.binding.port", "0")
             .config("spark.ui.enabled", "false")
             .config("spark.stage.maxConsecutiveAttempts", "2")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    out: dict[str, object] = {"connect": is_connect(spark)}

    keras.utils.set_random_seed(7)
    model = mlp((8, 8, 1), 10, hidden=(32,))
    model.compile(optimizer=keras.optimizers.Adam(0.002),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit = SparkModel(spark, model, SharedTrainingMaster(num_workers=2)).fit(
        train, epochs=2, verbose=0)
    out["loss"] = fit.history["loss"]
    out["accuracy"] = fit.history["accuracy"]
    out["checksums"] = [w.checksum for w in fit.workers]
    out["ranks"] = [w.rank for w in fit.workers]

    broken = mlp((8, 8, 1), 10, hidden=(8,))
    broken.compile(optimizer=keras.optimizers.SGD(1e12), loss="sparse_categorical_crossentropy")
    try:
        SparkModel(spark, broken, DenseTrainingMaster(num_workers=2)).fit(train, epochs=2,
                                                                           verbose=0)
        out["error"] = None
    except TrainingError as exc:
        out["error"] = str(exc)
    try:
        SparkModel(spark, model, SharedTrainingMaster(num_workers=3)).fit(train, verbose=0)
        out["slots_error"] = None
    except Exception as exc:
        out["slots_error"] = f"{type(exc).__name__}: {exc}"
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
