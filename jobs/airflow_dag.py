"""Airflow DAG ``sparkdl_pipeline``: etl → train → evaluate → predict, one spark-submit each.

Every run works in ``<output_root>/<ds>`` (the run's logical date): shards in ``data/``, the
model, ``metrics.json``, ``evaluation.json`` and ``predictions/`` beside them, and each stage's
result JSON in ``<stage>.json``, which is also the task's return value (XCom ``return_value``).

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

import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param

STAGES = ("etl", "train", "evaluate", "predict")
JOBS_DIR = Path(os.environ.get("SPARKDL_JOBS_DIR") or Path(__file__).resolve().parent)
DEFAULT_CONF = os.environ.get("SPARKDL_CONF") or str(JOBS_DIR.parent / "conf" / "digits.yaml")
DEFAULT_OUTPUT_ROOT = os.environ.get("SPARKDL_OUTPUT_ROOT") or "runs/airflow"
RUN_DIR = "{{ params.output_root }}/{{ ds }}"


class SparkDLStageOperator(SparkSubmitOperator):
    """spark-submit of ``jobs/<stage>.py`` in the run's directory; returns the stage's JSON."""

    template_fields = (*SparkSubmitOperator.template_fields, "run_dir")

    def __init__(self, *, stage: str, run_dir: str = RUN_DIR, **kwargs: Any) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        python = os.environ.get("SPARKDL_PYTHON")
        conf = {"spark.pyspark.python": python} if python else {}
        super().__init__(
            task_id=stage, application=str(JOBS_DIR / f"{stage}.py"), name=f"sparkdl-{stage}",
            conf=conf, **kwargs,
        )
        self.stage = stage
        self.run_dir = run_dir

    def execute(self, context: Any) -> dict[str, Any]:
        run_dir = Path(self.run_dir).absolute()
        run_dir.mkdir(parents=True, exist_ok=True)
        result_path = run_dir / f"{self.stage}.json"
        result_path.unlink(missing_ok=True)  # a failed submit never returns an older result
        args = ["--conf", str(context["params"]["conf"]),
                "--set", f"data.dir={run_dir / 'data'}", "--set", f"output.dir={run_dir}"]
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
                             description="run directories go to <output_root>/<ds>"),
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
