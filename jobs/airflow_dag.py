"""Airflow DAG ``sparkdl_pipeline``: etl → train → evaluate → predict, one spark-submit each.

Every run works in ``<output_root>/<ds>/<run_id>`` (its logical date, then its run id made
safe for a path, see ``airflow_run_dir.py``: two runs of one date never share a directory, a
task's retries do): shards in ``data/``, the model, ``metrics.json``, ``evaluation.json`` and
``predictions/`` beside them, and each stage's result JSON in ``<stage>.json``, which is also
the task's return value (XCom ``return_value``).

Params (override with the run's conf, e.g. ``airflow dags trigger sparkdl_pipeline -c '{...}'``):

- ``conf``: the job's YAML configuration (default ``$SPARKDL_CONF`` or the repository's
  ``conf/digits.yaml``);
- ``output_root``: where run directories go (default ``$SPARKDL_OUTPUT_ROOT`` or ``runs/airflow``);
- ``sets``: extra ``key=value`` overrides for every stage, e.g. ``["training.epochs=2"]``.

The Spark master is the ``spark_default`` connection's (e.g.
``AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'``, or
``spark://host:7077``, ``yarn``). ``spark-submit`` is found on ``PATH``: put the bin directory
of sparkdl's environment first; ``$SPARKDL_PYTHON`` (default: unset) becomes
``spark.pyspark.python``. The jobs are read from this file's directory unless
``$SPARKDL_JOBS_DIR`` says otherwise. This module imports only Airflow and the standard library,
so DAG parsing stays quick.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param


def _sibling_module(name: str) -> Any:
    """A module beside this file, whether Airflow's DAG folder is on ``sys.path`` or not."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_dir = _sibling_module("airflow_run_dir").run_dir

STAGES = ("etl", "train", "evaluate", "predict")
JOBS_DIR = Path(os.environ.get("SPARKDL_JOBS_DIR") or Path(__file__).resolve().parent)
DEFAULT_CONF = os.environ.get("SPARKDL_CONF") or str(JOBS_DIR.parent / "conf" / "digits.yaml")
DEFAULT_OUTPUT_ROOT = os.environ.get("SPARKDL_OUTPUT_ROOT") or "runs/airflow"


class SparkDLStageOperator(SparkSubmitOperator):
    """spark-submit of ``jobs/<stage>.py`` in the run's directory; returns the stage's JSON."""

    def __init__(self, *, stage: str, **kwargs: Any) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        python = os.environ.get("SPARKDL_PYTHON")
        conf = {"spark.pyspark.python": python} if python else {}
        super().__init__(
            task_id=stage, application=str(JOBS_DIR / f"{stage}.py"), name=f"sparkdl-{stage}",
            conf=conf, **kwargs,
        )
        self.stage = stage

    def execute(self, context: Any) -> dict[str, Any]:
        run = Path(run_dir(str(context["params"]["output_root"]), context["ds"],
                           context["run_id"])).absolute()
        run.mkdir(parents=True, exist_ok=True)
        result_path = run / f"{self.stage}.json"
        result_path.unlink(missing_ok=True)  # a failed submit never returns an older result
        args = ["--conf", str(context["params"]["conf"]),
                "--set", f"data.dir={run / 'data'}", "--set", f"output.dir={run}"]
        for override in context["params"].get("sets") or []:
            args += ["--set", str(override)]
        self.application_args = [*args, "--json-out", str(result_path)]
        super().execute(context)
        if not result_path.is_file():
            raise RuntimeError(f"stage {self.stage}: spark-submit succeeded but wrote no "
                               f"result to {result_path}")
        return json.loads(result_path.read_text())


with DAG(
    dag_id="sparkdl_pipeline",
    description="sparkdl: ETL → train → evaluate → predict on Spark, one directory per run",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "conf": Param(DEFAULT_CONF, type="string", description="job YAML configuration"),
        "output_root": Param(DEFAULT_OUTPUT_ROOT, type="string",
                             description="run directories go to <output_root>/<ds>/<run_id>"),
        "sets": Param([], type="array", description="extra key=value overrides"),
    },
    tags=["sparkdl"],
) as dag:
    previous = None
    for stage_name in STAGES:
        task = SparkDLStageOperator(stage=stage_name)
        if previous is not None:
            previous >> task
        previous = task
