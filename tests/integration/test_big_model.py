"""A 42M-parameter model (504 MB of weights and Adam's slots) fits on ``local[2]`` with a
driver JVM of 1 GB, in sharing and in dense mode: the model travels through storage, never
through the driver's heap or a Spark message. Each fit's model is the one in its model
directory, bit for bit, and both workers end with the same weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = '''
import json, sys
import numpy as np
import pandas as pd
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "1g").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
from benchmarks.model_size import build_model, master_for
from sparkdl.data.writer import write_shards
from sparkdl.spark_model import SparkModel
from sparkdl.training.exchanges.variables import weights_checksum
from sparkdl.training.model_files import load_model

out, store = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
rows = 2 * 32 * 2
frame = pd.DataFrame({"features": list(rng.normal(0, 1, (rows, 64)).astype("float32")),
                      "label": rng.integers(0, 10, rows)})
uri = "file://" + out + "/shards"
write_shards(spark.createDataFrame(frame), uri, feature_shape=[64],
             classes=[str(i) for i in range(10)], num_files=2, rows_per_group=32)
found = {}
for mode in ("sharing", "dense"):
    model, _ = build_model("mlp-40m")
    spark_model = SparkModel(spark, model, master_for(mode, 32), store=store)
    fit = spark_model.fit(uri, epochs=1, verbose=0)
    stored = load_model(fit.model_file)
    found[mode] = {
        "parameters": fit.metrics["num_parameters"],
        "workers": [w.checksum for w in fit.workers],
        "returned": weights_checksum(spark_model.model.trainable_variables),
        "stored": weights_checksum(stored.trainable_variables),
        "file_bytes": fit.model_file.size,
        "file": fit.model_file.uri,
    }
print("RESULT " + json.dumps(found))
'''


def test_a_42m_parameter_model_fits_with_a_1g_driver_in_sharing_and_dense(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                      os.environ.get("PYTHONPATH")]))}
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(store)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout[-2000:], done.stderr[-4000:])
    found = json.loads(lines[-1][len("RESULT "):])
    for mode in ("sharing", "dense"):
        fit = found[mode]
        assert fit["parameters"] > 40_000_000
        assert fit["file_bytes"] > 3 * 4 * 40_000_000  # weights and Adam's two slots
        assert fit["file"].startswith(store.as_uri())
        assert fit["workers"][0] == fit["workers"][1], mode  # replicas identical
        assert fit["returned"] == fit["stored"] == fit["workers"][0], mode
    assert found["sharing"]["stored"] != found["dense"]["stored"]
