"""Runs jobs/airflow_dag.py's DAG once with ``dag.test()`` and writes what happened as JSON.

Run with Airflow's interpreter (its own environment, see docs/notebooks-and-airflow.md):
``python airflow_dag_driver.py DAG_FILE LOGICAL_DATE RUN_CONF_JSON OUT_JSON``. Needs
``AIRFLOW_HOME`` (a scratch directory) and the ``spark_default`` connection in the environment.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pendulum


def main(dag_file: str, logical_date: str, run_conf: str, out: str) -> int:
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True,
                   capture_output=True, timeout=300)
    spec = importlib.util.spec_from_file_location("sparkdl_airflow_dag", dag_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.dag
    run = dag.test(logical_date=pendulum.parse(logical_date), run_conf=json.loads(run_conf))

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        states = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
        xcoms = {
            row.task_id: XComModel.deserialize_value(row)
            for row in session.scalars(XComModel.get_many(
                run_id=run.run_id, dag_ids=dag.dag_id, key="return_value"))
        }
    report = {"run_id": run.run_id,
              "run_state": str(run.state), "task_order": [t.task_id for t in dag.topological_sort()]
              if hasattr(dag, "topological_sort") else list(dag.task_ids),
              "states": states, "xcoms": xcoms}
    with open(out, "w") as handle:
        json.dump(report, handle, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
