"""Log a finished run to MLflow (optional: ``pip install 'sparkdl[mlflow]'``).

Nothing here imports mlflow until :func:`log_run` is called, so ``import sparkdl`` works
without it. All calls go through an :class:`mlflow.tracking.MlflowClient` bound to the given
tracking URI: the process-wide ``mlflow.set_tracking_uri`` / active run are left alone.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from sparkdl.errors import ConfigurationError, DataError, SparkDLError
from sparkdl.run_output import EVALUATION_FILE, HISTORY_FILE, METRICS_FILE, REPORT_FILE

#: Files of a run directory logged as artifacts when present.
RUN_FILES = (METRICS_FILE, EVALUATION_FILE, REPORT_FILE, HISTORY_FILE)

_BATCH = 100  # MLflow's log_batch takes at most 100 params and 1000 metrics per call
_BAD_KEY_CHARS = re.compile(r"[^\w\-. /]")


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"training": {"mode": "sharing"}}`` → ``{"training.mode": "sharing"}``.

    Leaves are strings as MLflow stores params: ``str`` values as they are, everything else
    (numbers, ``None``, lists) as JSON.
    """
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


def log_run(
    tracking_uri: str,
    experiment: str,
    config: Mapping[str, Any] | Any,
    history: Mapping[str, Sequence[float]],
    run_dir: str | os.PathLike[str],
    model_path: str | os.PathLike[str] | None,
) -> str:
    """Log one run to MLflow and return its run id.

    Logs the flattened configuration as params (dotted keys), every history series as a
    metric with ``step=epoch`` (epochs without a value, e.g. no validation, are skipped), the
    numeric job figures of ``run_dir/metrics.json`` that are not history series (e.g.
    ``test_accuracy``) at step 0, the files of :data:`RUN_FILES` found in ``run_dir`` and the
    model file (under ``model/``) as artifacts. The run ends ``FINISHED``, or ``FAILED`` when
    logging fails part way.

    A ``file://`` (or plain path) tracking URI uses MLflow's file store; MLflow 3 refuses it
    unless ``MLFLOW_ALLOW_FILE_STORE`` is set, which is done for this call only.

    Args:
        tracking_uri: MLflow tracking URI (``tracking.mlflow``).
        experiment: experiment name, created when missing (``tracking.experiment``).
        config: the job configuration: a nested dict or a :class:`sparkdl.config.JobConfig`.
        history: the fit's ``History.history``.
        run_dir: the run's local output directory.
        model_path: the saved model file, or ``None``.
    """
    try:
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise ConfigurationError(
            "tracking.mlflow is set but MLflow is not installed: pip install 'sparkdl[mlflow]'"
        ) from None
    from sparkdl.report import align_history, read_run

    run = Path(run_dir)
    if not run.is_dir():
        raise DataError(f"run directory {run} does not exist")
    model = Path(model_path) if model_path is not None else None
    if model is not None and not model.exists():
        raise DataError(f"model file {model} does not exist")
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    params = [Param(_key(k), v) for k, v in flatten(config).items()]
    job_figures = {}
    if (run / METRICS_FILE).is_file():
        job_figures = {k: float(v) for k, v in read_run(run)[0].items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and k not in history and math.isfinite(v)}
    aligned = align_history(history)

    with _file_store_allowed(tracking_uri):
        try:
            client = MlflowClient(tracking_uri=tracking_uri)
            experiment_id = _experiment_id(client, experiment, MlflowException)
            created = client.create_run(experiment_id, run_name=run.resolve().name,
                                        tags={"sparkdl.run_dir": str(run.resolve())})
        except MlflowException as exc:
            raise ConfigurationError(
                f"MLflow at {tracking_uri} (experiment {experiment!r}): {exc.message}"
            ) from None
        run_id = created.info.run_id
        status = "FAILED"
        try:
            timestamp = created.info.start_time
            metrics = [Metric(_key(k), v, timestamp, 0) for k, v in job_figures.items()]
            metrics += [Metric(_key(key), value, timestamp, epoch)
                        for key, values in aligned.items()
                        for epoch, value in enumerate(values) if not math.isnan(value)]
            for start in range(0, max(len(params), len(metrics)), _BATCH):
                client.log_batch(run_id, metrics=metrics[start:start + _BATCH],
                                 params=params[start:start + _BATCH])
            for name in RUN_FILES:
                if (run / name).is_file():
                    client.log_artifact(run_id, str(run / name))
            if model is not None:
                if model.is_dir():
                    client.log_artifacts(run_id, str(model), f"model/{model.name}")
                else:
                    client.log_artifact(run_id, str(model), "model")
            status = "FINISHED"
        except (MlflowException, OSError) as exc:
            raise DataError(
                f"logging run {run_id} to MLflow at {tracking_uri} failed: {exc}"
            ) from None
        finally:
            with contextlib.suppress(MlflowException, OSError, SparkDLError):
                client.set_terminated(run_id, status)
    return run_id


def _experiment_id(client: Any, name: str, error: type[Exception]) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except error:  # created meanwhile by another job
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


@contextlib.contextmanager
def _file_store_allowed(tracking_uri: str) -> Iterator[None]:
    scheme = urlparse(tracking_uri).scheme.lower()
    if scheme not in ("", "file") or "MLFLOW_ALLOW_FILE_STORE" in os.environ:
        yield
        return
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)


def _key(name: str) -> str:
    """An MLflow param/metric key: letters, digits, ``_ - . /`` and spaces."""
    return _BAD_KEY_CHARS.sub("_", name)
