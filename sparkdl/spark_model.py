"""SparkModel: fit, evaluate and predict a Keras model on Spark (DL4J's SparkDl4jMultiLayer).

``fit`` launches one barrier-mode task per worker; the tasks find each other through
``BarrierTaskContext.allGather``, open the configured transport and run the shared worker
loop (:mod:`sparkdl.training.worker`). Rank 0's trained model comes back to the driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import re
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from sparkdl.config import ClusterConfig
from sparkdl.data.files import read_metadata
from sparkdl.errors import ConfigurationError, TrainingError
from sparkdl.storage import spark_uri
from sparkdl.training.elastic import ElasticEvent, ElasticPolicy, replan
from sparkdl.training.launcher import KerasFit
from sparkdl.training.masters import TrainingMaster

if TYPE_CHECKING:
    from collections.abc import Mapping

    import keras
    from pyspark.sql import DataFrame, SparkSession

    from sparkdl.data.frames import FeaturesCol, LabelSpec
    from sparkdl.etl.normalizers import Normalizer
    from sparkdl.evaluation.plan import EvaluationRequest
    from sparkdl.training.driver import FitResult

log = logging.getLogger("sparkdl")


class SparkModel(KerasFit):
    """Train a compiled Keras model on Spark with a training master.

    >>> tm = SharedTrainingMaster(batch_size_per_worker=32, num_workers=2)
    >>> spark_model = SparkModel(spark, keras_model, tm)
    >>> spark_model.fit("file:///data/train", epochs=10)
    >>> print(spark_model.evaluate("file:///data/test").stats())

    ``fit``, ``evaluate`` and ``predict`` also take DataFrames (Spark ML vector, array or
    numeric feature columns): ``spark_model.fit(df, features_col="features",
    label_col="label")`` writes ``df`` as shards into a run store
    (:mod:`sparkdl.data.store`) and trains on them.
    """

    def __init__(
        self,
        spark: SparkSession,
        model: keras.Model,
        training_master: TrainingMaster,
        *,
        cluster: ClusterConfig | None = None,
        custom_objects: dict[str, Any] | None = None,
        elastic: ElasticPolicy | None = None,
    ) -> None:
        if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
            raise ConfigurationError("the Keras model must be compiled (model.compile(...))")
        if elastic is not None:
            if not isinstance(elastic, ElasticPolicy):
                raise ConfigurationError(
                    f"elastic must be an ElasticPolicy, got {type(elastic).__name__}"
                )
            elastic.check(training_master.num_workers)
        self.elastic = elastic
        self.spark = spark
        self.model = model
        self.training_master = training_master
        self.cluster = cluster or ClusterConfig()
        self.custom_objects = custom_objects
        self.last_fit: FitResult | None = None
        self.label_spec: LabelSpec | None = None  # what fit() learned about the labels

    # Training --------------------------------------------------------------------------

    def fit(  # type: ignore[override]
        self,
        data: str | DataFrame,
        epochs: int = 1,
        *,
        features_col: FeaturesCol = "features",
        label_col: str = "label",
        label_kind: str | None = None,
        store: str | None = None,
        keep_shards: bool = False,
        validation_data: str | DataFrame | None = None,
        sample_weight_col: str | None = None,
        **kwargs: Any,
    ) -> FitResult:
        """Train on a shard directory URI or a DataFrame, as Keras's ``Model.fit`` does.

        With ``elastic`` (an :class:`~sparkdl.training.elastic.ElasticPolicy`) a failed
        training stage is relaunched with the task slots still available (at least
        ``min_workers``), resuming from the latest checkpoint: ``checkpoint_dir`` is required.

        A DataFrame is written once as shards into the run store ``store`` (a filesystem URI;
        default: a temporary directory, local masters only) and reused when the same
        DataFrame is fitted or evaluated again and provably the same data
        (:mod:`sparkdl.data.fingerprint`); the last process using the shards deletes them when
        it exits unless ``keep_shards=True``. ``features_col`` names a Spark ML
        vector column, an ``array<numeric>`` column or numeric column(s); ``label_kind``
        (``"class"`` / ``"regression"``) overrides the inferred kind (see
        :mod:`sparkdl.data.frames`). ``validation_data`` may be a DataFrame too.
        ``sample_weight_col`` names a numeric column of per-row sample weights (Keras's
        ``sample_weight``, Horovod's ``sample_weight_col``), of the training DataFrame and of a
        validation DataFrame. The other arguments are :meth:`KerasFit.fit`'s.
        """
        if self.elastic is not None and not kwargs.get("checkpoint_dir"):
            raise ConfigurationError(
                "an elastic fit resumes from checkpoints: set checkpoint_dir "
                "(training.checkpoint_dir)"
            )
        if _is_dataframe(data):
            self.label_spec = None
            data = self._shards_of(data, features_col, label_col, label_kind, store, keep_shards,
                                   weight_col=sample_weight_col)
        elif isinstance(data, str):
            meta = read_metadata(data)
            from sparkdl.data.frames import LabelSpec

            self.label_spec = LabelSpec(meta.label_kind, list(meta.classes))
        else:
            raise ConfigurationError(
                "fit() takes a Spark DataFrame or the URI of a shard directory (str), "
                f"got {type(data).__name__}"
            )
        if _is_dataframe(validation_data):
            validation_data = self._shards_of(
                validation_data, features_col, label_col, label_kind, store, keep_shards,
                what="fit(validation_data)", weight_col=sample_weight_col,
            )
        return super().fit(data, epochs, validation_data=validation_data, **kwargs)

    def _shards_of(
        self, df: DataFrame, features_col: FeaturesCol, label_col: str,
        label_kind: str | None, store: str | None, keep_shards: bool, *, what: str = "fit()",
        weight_col: str | None = None,
    ) -> str:
        """Shards of ``df`` in the run store, written if the store has none for it yet; a
        failure while Spark computes ``df`` is one :class:`DataError` naming ``what``."""
        from sparkdl.data.spark_errors import dataframe_errors

        with dataframe_errors(what):
            return self._write_shards_of(df, features_col, label_col, label_kind, store,
                                         keep_shards, weight_col)

    def _write_shards_of(
        self, df: DataFrame, features_col: FeaturesCol, label_col: str,
        label_kind: str | None, store: str | None, keep_shards: bool,
        weight_col: str | None = None,
    ) -> str:
        from sparkdl.data.frames import label_spec, model_feature_shape, training_frame
        from sparkdl.data.store import fingerprint, open_store
        from sparkdl.data.writer import write_shards
        from sparkdl.session import spark_master

        run_store = open_store(store, keep=keep_shards)
        run_store.check_reachable(spark_master(self.spark))
        fitted = self.label_spec
        spec = label_spec(df, label_col, self.model, label_kind or (fitted and fitted.kind),
                          fitted.classes if fitted and fitted.kind == "class" else None)
        frame = training_frame(df, features_col, label_col, spec, weight_col)
        feature_shape = model_feature_shape(self.model)
        num_workers = self.training_master.num_workers
        options = {"label": spec.get_config(), "feature_shape": feature_shape,
                   "num_workers": num_workers, "sample_weight": weight_col is not None}
        uri = run_store.shards(
            fingerprint(frame, options),
            lambda target: write_shards(
                frame, target, feature_shape=feature_shape, label_kind=spec.kind,
                classes=spec.classes, num_workers=num_workers,
                sample_weight=weight_col is not None,
            ),
        )
        self.label_spec = self.label_spec or spec
        return uri

    def _launcher(self) -> _SparkLauncher:
        return _SparkLauncher(self)

    def _channel_settings(self) -> dict[str, Any]:
        from sparkdl.comm.network import parse_port_range

        return {"timeout_s": self.cluster.timeout_s,
                "port_range": parse_port_range(self.cluster.port_range)}

    def _task_cpus(self) -> int:
        return int(self.spark.sparkContext.getConf().get("spark.task.cpus", "1"))

    def _task_slots(self) -> int:
        """The task slots Spark has now: its total executor cores (``defaultParallelism``,
        which follows executors joining and leaving unless ``spark.default.parallelism``
        is set) over ``spark.task.cpus``. Public API only."""
        return max(1, self.spark.sparkContext.defaultParallelism // self._task_cpus())

    def _check_slots(self, num_workers: int) -> None:
        sc = self.spark.sparkContext
        slots = self._task_slots()
        if num_workers > slots:
            raise ConfigurationError(
                f"num_workers={num_workers} but Spark has only {slots} task slots "
                f"(spark.default.parallelism={sc.defaultParallelism}, "
                f"spark.task.cpus={self._task_cpus()}); barrier mode needs one slot per worker"
            )
        conf = sc.getConf()
        task_gpus = float(conf.get("spark.task.resource.gpu.amount", "0"))
        if task_gpus > 0:
            executor_gpus = int(conf.get("spark.executor.resource.gpu.amount", "0"))
            # the driver is listed too, except in local mode where it is the one executor
            executors = max(1, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)
            gpu_slots = executors * int(executor_gpus / task_gpus + 1e-9)
            if num_workers > gpu_slots:
                raise ConfigurationError(
                    f"num_workers={num_workers} but Spark has only {gpu_slots} GPU task slots "
                    f"({executors} executor(s) x spark.executor.resource.gpu.amount="
                    f"{executor_gpus} / spark.task.resource.gpu.amount={task_gpus:g}); "
                    "barrier mode needs one slot per worker"
                )

    # Evaluation and inference (sparkdl.spark.inference) -------------------------------

    def evaluate(
        self,
        data: str | DataFrame,
        batch_size: int = 256,
        *,
        evaluations: EvaluationRequest | None = None,
        features_col: FeaturesCol = "features",
        label_col: str = "label",
        store: str | None = None,
        keep_shards: bool = False,
    ) -> Any:
        """Evaluate on a shard directory or a DataFrame, on the executors, in one pass
        (:func:`sparkdl.spark.inference.evaluate`)."""
        from sparkdl.spark import inference

        return inference.evaluate(
            self, data, batch_size, evaluations=evaluations, features_col=features_col,
            label_col=label_col, store=store, keep_shards=keep_shards,
        )

    def predict(
        self,
        data: str | DataFrame,
        batch_size: int = 256,
        *,
        normalizer: Normalizer | dict[str, Any] | str | None = None,
        features_col: FeaturesCol | Mapping[str, FeaturesCol] = "features",
        label_kind: str | Mapping[str, str] | None = None,
        prediction_col: str = "prediction",
        probability_col: str = "probability",
    ) -> DataFrame:
        """Predict on a shard directory or a DataFrame; its rows with Spark ML columns, one
        ``<prediction_col>_<output>`` per output of a multi-output model
        (:func:`sparkdl.spark.inference.predict`)."""
        from sparkdl.spark import inference

        return inference.predict(
            self, data, batch_size, normalizer=normalizer, features_col=features_col,
            label_kind=label_kind, prediction_col=prediction_col,
            probability_col=probability_col,
        )


class _SparkLauncher:
    """Runs the workers as one barrier-mode Spark stage (one task per worker)."""

    def __init__(self, spark_model: SparkModel) -> None:
        self.spark = spark_model.spark
        self.cluster = spark_model.cluster
        self.mode = spark_model.training_master.mode
        self.threads_per_worker = spark_model._task_cpus()
        self.check_slots = spark_model._check_slots
        self.task_slots = spark_model._task_slots
        self.elastic = spark_model.elastic
        self.elastic_events: list[ElasticEvent] = []
        self._cancelled = False
        sc = self.spark.sparkContext
        if sc.master.startswith("local"):  # executors share the driver's machine
            self.driver_host = self.bind_host = "127.0.0.1"
        else:
            from sparkdl.comm.network import select_bind_address

            driver = sc.getConf().get("spark.driver.host", None) or socket.gethostname()
            self.driver_host = select_bind_address(self.cluster.network_mask, driver)
            self.bind_host = "0.0.0.0"
        self._group = f"sparkdl-fit-{secrets.token_hex(6)}"

    def cancel(self) -> None:
        self._cancelled = True
        self.spark.sparkContext.cancelJobGroup(self._group)

    def run(self, spec: Any, secret: bytes) -> list[Any]:
        if self.elastic is None:
            return self._run_stage(spec, secret, spark_retries=True)
        return self._run_elastic(spec, secret)

    def _run_elastic(self, spec: Any, secret: bytes) -> list[Any]:
        """Run the stage without Spark's retries (which would wait forever for the slots of
        a host that is gone); after a failure relaunch it with the slots still available,
        at most ``num_workers``, resuming from the latest checkpoint."""
        from sparkdl.training.checkpoint import CheckpointStore

        policy, wanted = self.elastic, len(spec.slices)
        assert policy is not None and spec.checkpoint is not None
        store = CheckpointStore(spec.checkpoint["uri"])
        spec = dataclasses.replace(spec, extra={**spec.extra, "elastic": True})
        current, failures = spec, 0
        while True:
            try:
                return self._run_stage(current, secret, spark_retries=False)
            except TrainingError as exc:
                failures += 1
                store.check_failure()  # a failure no relaunch can fix (non-finite values)
                if self._cancelled:
                    raise
                world = len(current.slices)
                if failures > policy.max_failures:
                    raise TrainingError(
                        f"elastic fit: the training stage failed {failures} time(s), more than "
                        f"training.elastic.max_failures={policy.max_failures}; last: {exc}"
                    ) from exc
                slots = self._settled_slots()
                if slots < policy.min_workers:
                    raise TrainingError(
                        f"elastic fit: only {slots} task slot(s) are left after the training "
                        f"stage failed, fewer than training.elastic.min_workers="
                        f"{policy.min_workers}; the failure: {exc}"
                    ) from exc
                new_world = min(wanted, slots)
                log.warning("elastic fit: relaunching the training stage with %d worker(s) "
                            "(was %d) after: %s", new_world, world, exc)
                if new_world != world:
                    latest = store.latest(spec.checkpoint["run_id"])
                    position = (latest.state.epoch, latest.state.step_in_epoch) if latest \
                        else (spec.initial_epoch, 0)
                    self.elastic_events.append(ElasticEvent(
                        *position, world, new_world, _short(str(exc))
                    ))
                    current = replan(spec, new_world)

    def _settled_slots(self, settle_s: float = 3.0) -> int:
        """The task slots once Spark's count has held still for ``settle_s`` (a lost host's
        executors leave a moment after the stage fails); bounded by ``cluster.timeout_s``."""
        deadline = time.monotonic() + max(self.cluster.timeout_s, settle_s)
        slots, since = self.task_slots(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < settle_s:
            time.sleep(0.25)
            now = self.task_slots()
            if now != slots:
                slots, since = now, time.monotonic()
        return slots

    def _run_stage(self, spec: Any, secret: bytes, *, spark_retries: bool) -> list[Any]:
        from pyspark.serializers import CloudPickleSerializer

        sc = self.spark.sparkContext
        cluster = self.cluster.model_dump()
        # by value (cloudpickle), not by reference as a broadcast pickles: a custom layer a
        # script or notebook defined in __main__ exists on no executor until it arrives
        spec_broadcast = sc.broadcast(CloudPickleSerializer().dumps(spec))
        num_workers = len(spec.slices)
        attempts = AttemptLog.create(spec.checkpoint["uri"] if spec.checkpoint else None)
        sc.setJobGroup(self._group, f"sparkdl fit ({self.mode}, {num_workers} workers)",
                       interruptOnCancel=True)
        try:
            # Spark retries a failed barrier stage only when it is a shuffle map stage (a
            # failed barrier *result* stage aborts the job), so results go through a
            # one-partition shuffle: a lost worker then retries the stage, which resumes
            # from the latest checkpoint.
            # An elastic fit relaunches the stage itself: there it is a result stage.
            rdd = sc.parallelize(range(num_workers), num_workers).barrier().mapPartitions(
                lambda _: _train_task(spec_broadcast, cluster, secret, attempts.uri)
            )
            if spark_retries:
                rdd = rdd.map(lambda result: (result.rank, result)).partitionBy(1).values()
            results = rdd.collect()
            failures = attempts.read()
            if failures:  # Spark's own task-failure logs are off in jobs: say why it retried
                log.warning("the training stage was retried after: %s", "; ".join(failures))
            return results
        except Exception as exc:
            failures = attempts.read()
            detail = "; ".join(failures) if failures else _root_cause(exc)
            attempt_count = len({line.split(",")[0] for line in failures}) or 1
            raise TrainingError(
                f"the training stage failed ({attempt_count} attempt(s)): {detail}"
            ) from exc
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setJobDescription(None)
            spec_broadcast.unpersist()
            attempts.close()


# Runs inside Spark tasks ------------------------------------------------------------------

def _train_task(spec_broadcast: Any, cluster: dict[str, Any], secret: bytes, attempts_uri: str):
    """One barrier task: join the ring, train, yield this worker's results."""
    from pyspark import BarrierTaskContext

    from sparkdl.comm import create_communicator
    from sparkdl.comm.network import parse_port_range
    from sparkdl.gpu import pin_gpus, task_gpu_addresses
    from sparkdl.training.worker import configure_tensorflow, run_worker

    context = BarrierTaskContext.get()
    rank = context.partitionId()
    infos = context.getTaskInfos()
    gpus = task_gpu_addresses()
    pin_gpus(gpus, role="train")  # before the spec (and TensorFlow with it) is loaded
    spec = pickle.loads(spec_broadcast.value)
    configure_tensorflow(spec.threads, gpus)
    host = infos[rank].address.rsplit(":", 1)[0]
    with contextlib.suppress(OSError):
        host = socket.gethostbyname(host)
    comm = create_communicator(
        cluster["transport"],
        rank,
        len(infos),
        lambda message: list(context.allGather(message)),
        secret=secret,
        timeout_s=cluster["timeout_s"],
        network_mask=cluster["network_mask"],
        default_host=host,
        port_range=parse_port_range(cluster["port_range"]),
        wire_integrity=cluster["wire_integrity"],
        topology=cluster.get("topology", "flat"),
        mesh=cluster.get("mesh", "plain"),
        host_id=host,
    )
    try:
        result = run_worker(spec, comm, secret=secret)
    except BaseException as exc:
        AttemptLog(attempts_uri).record(
            context.taskAttemptId(), rank, infos[rank].address, exc
        )
        raise
    finally:
        comm.close()
    result.executor_address = infos[rank].address
    yield result


# Driver-side helpers ------------------------------------------------------------------------


class AttemptLog:
    """Why each task attempt of a training stage failed, so that the driver's final error
    can say what failed each time (Spark itself reports only the last failure).

    Kept under the checkpoint directory when there is one (shared storage, reachable from
    every executor); else in a driver-local temporary directory, which executors on the
    driver's machine (local and local-cluster masters) reach.
    """

    def __init__(self, uri: str, owned_dir: str | None = None) -> None:
        self.uri = uri
        self._owned_dir = owned_dir

    @classmethod
    def create(cls, checkpoint_uri: str | None) -> AttemptLog:
        import tempfile
        import uuid

        if checkpoint_uri:
            return cls(f"{checkpoint_uri.rstrip('/')}/_attempts/{uuid.uuid4().hex[:12]}")
        tmp = tempfile.mkdtemp(prefix="sparkdl-attempts-")
        return cls(f"file://{tmp}", owned_dir=tmp)

    def record(self, task_id: int, rank: int, executor: str, exc: BaseException) -> None:
        """Record one failed task. A barrier stage attempt launches all its tasks at once,
        with consecutive task ids in partition order, so ``task_id - rank`` names the stage
        attempt (pyspark exposes no stage attempt number to Python)."""
        from sparkdl.data.metadata import resolve

        message = f"rank {rank} on {executor}: {type(exc).__name__}: {exc}"
        try:
            fs, root = resolve(self.uri)
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(f"{root}/{task_id - rank:012d}-{rank:05d}") as f:
                f.write(message.encode()[:4000])
        except Exception as error:  # the task's own failure matters more than this record
            log.warning("could not record a failed task in %s: %s", self.uri, error)

    def read(self) -> list[str]:
        """One line per failed task: ``attempt K, rank R on HOST: Error: message``."""
        import pyarrow.fs as pafs

        from sparkdl.data.metadata import resolve

        try:
            fs, root = resolve(self.uri)
            infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
            records = []
            for info in sorted(infos, key=lambda i: i.base_name):
                with fs.open_input_stream(info.path) as f:
                    text = f.read().decode(errors="replace")
                records.append((info.base_name.split("-")[0], text))
        except Exception as error:
            log.warning("could not read the failed tasks in %s: %s", self.uri, error)
            return []
        attempts = {key: index for index, key in enumerate(dict.fromkeys(k for k, _ in records))}
        return [f"attempt {attempts[key]}, {text}" for key, text in records]

    def close(self) -> None:
        import shutil

        from sparkdl.data.metadata import resolve

        if self._owned_dir:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
        else:
            with contextlib.suppress(Exception):
                fs, root = resolve(self.uri)
                fs.delete_dir(root)


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.*)$")


def _root_cause(exc: BaseException) -> str:
    """The Python exception raised in a task, out of a Py4J/Spark exception's text."""
    found = [m for m in map(_EXCEPTION_LINE.match, str(exc).splitlines()) if m]
    python = [m for m in found if not m.group(1).startswith(("Py4J", "Spark", "Task"))]
    for match in python or found:
        if match.group(1) in ("CommunicationError", "TrainingError", "DataError",
                              "ConfigurationError", "SparkDLError"):
            return f"{match.group(1)}: {match.group(2)}"
    if python or found:
        match = (python or found)[-1]
        return f"{match.group(1)}: {match.group(2)}"
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _short(text: str, limit: int = 300) -> str:
    """The first line of a failure's text, at most ``limit`` characters."""
    line = next((line for line in text.splitlines() if line.strip()), text)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _is_dataframe(data: Any) -> bool:
    from pyspark.sql import DataFrame

    return isinstance(data, DataFrame)


def _join(uri: str, relative: str) -> str:
    """``uri/relative`` as Spark reads it."""
    return spark_uri(uri.rstrip("/") + "/" + relative)


__all__ = ["SparkModel"]
