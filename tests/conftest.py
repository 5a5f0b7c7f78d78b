"""Shared pytest fixtures."""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import _fork_guard
import pytest

_fork_guard.install()

# Each test run has a temporary directory of its own: this process's and every process it
# starts (the Spark session's JVM and Python workers, the jobs and notebooks the tests run)
# write their temporary files there, so a test that checks what sparkdl left behind sees this
# run's files alone, even with another test run on the same machine.
# pytest's own tmp_path directories stay where they were (PYTEST_DEBUG_TEMPROOT is where
# pytest puts them), so the paths the tests see keep their length.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
TEMP_ROOT = tempfile.mkdtemp(prefix="pytest-sparkdl-tmp-")
os.environ["TMPDIR"] = tempfile.tempdir = TEMP_ROOT


# Removed at exit after multiprocessing's own finalizers (its temporary directory, inside
# this one, is removed at priority -100; removing ours first made that one raise at exit).
multiprocessing.util.Finalize(None, shutil.rmtree, args=(TEMP_ROOT,),
                              kwargs={"ignore_errors": True}, exitpriority=-200)


@pytest.fixture(autouse=True)
def _no_fork_after_native_threads() -> Iterator[None]:
    """Fail a test that forked this process while TensorFlow, gRPC or the JVM gateway were
    imported (``tests/_fork_guard.py`` says why)."""
    _fork_guard.offences.clear()
    yield
    if _fork_guard.offences:
        found = "\n".join(_fork_guard.offences)
        _fork_guard.offences.clear()
        pytest.fail(f"the test forked the pytest process after native threads may exist "
                    f"(use the forkserver or spawn context):\n{found}", pytrace=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] SparkSession shared by the whole test session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparkdl-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def digits_shards(spark, tmp_path_factory) -> dict:
    """Digits train/test shards written once per test session by the real ETL pipeline."""
    from sparkdl.pipelines import digits

    out = tmp_path_factory.mktemp("digits")
    return digits.run(spark, out.as_uri() + "/data")


@pytest.fixture
def make_mlp():
    """Builds the default conf's MLP, compiled, with seeded initial weights."""
    return _make_mlp


def _make_mlp(input_shape, num_classes: int, learning_rate: float = 0.002, seed: int = 7):
    """The default conf's MLP, compiled, with seeded initial weights."""
    import keras

    from sparkdl.models import mlp

    keras.utils.set_random_seed(seed)
    model = mlp(input_shape, num_classes, hidden=(128, 64))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real S3-compatible server (moto's, over HTTP on 127.0.0.1) for the whole session.

    Yields its endpoint URL; ``AWS_ENDPOINT_URL`` and dummy credentials are set in this
    process's environment while it runs (child processes inherit them), and restored after.
    """
    import socket
    import time
    import urllib.request

    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # bounded wait until it answers
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                pytest.fail(f"moto S3 server did not start on {endpoint} within 30 s")
            time.sleep(0.1)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """A new empty bucket on :func:`s3_server`; returns its URI ``s3://name``."""
    import uuid

    import pyarrow.fs as pafs

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = pafs.S3FileSystem(endpoint_override=s3_server, allow_bucket_creation=True,
                           access_key="testing", secret_key="testing", region="us-east-1")
    fs.create_dir(name)
    return f"s3://{name}"
