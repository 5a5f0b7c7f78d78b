"""The training stage: one barrier-mode task per worker, on classic Spark and Spark Connect.

The stage is a DataFrame ``mapInArrow(..., barrier=True)`` over ``spark.range(0, n, 1, n)``
(exactly ``n`` one-row partitions), as pyspark's ``TorchDistributor`` runs on Connect: no
Spark context, RDD or broadcast. The worker spec travels in the task function's closure
(cloudpickled), the results come back as Arrow rows, a fit is cancelled through a job tag
(``spark.addTag`` / ``spark.interruptTag``). With ``task_cpus`` / ``task_gpus`` the stage
carries its own ``ResourceProfile`` (stage-level scheduling): the ETL of the same
application runs on CPU slots, the training on GPU slots.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import re
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkdl import session
from sparkdl.errors import ConfigurationError, TrainingError
from sparkdl.spark.attempts import AttemptLog, short, stage_error
from sparkdl.spark.driver_address import channel_hosts
from sparkdl.spark.task import RESULT_SCHEMA, training_function
from sparkdl.spark.task_size import check_task_size
from sparkdl.training.elastic import ElasticEvent, ElasticPolicy
from sparkdl.training.worker.run_worker import replan

if TYPE_CHECKING:
    from pyspark.resource import ResourceProfile
    from pyspark.sql import DataFrame, Row, SparkSession

    from sparkdl.config import ClusterConfig
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker.run_worker import WorkerSpec

log = logging.getLogger("sparkdl")


class SparkLauncher:
    """Runs the workers as one barrier-mode Spark stage (a
    :class:`~sparkdl.training.worker.task.Launcher`)."""

    def __init__(
        self,
        spark: SparkSession,
        cluster: ClusterConfig,
        *,
        mode: str,
        elastic: ElasticPolicy | None = None,
        task_cpus: int | None = None,
        task_gpus: float | None = None,
        store: str | None = None,
    ) -> None:
        """``store``: where the model travels through (:mod:`sparkdl.spark.model_store`)."""
        self.spark = spark
        self.store = store
        self.cluster = cluster
        self.mode = mode
        self.elastic = elastic
        self.elastic_events: list[ElasticEvent] = []
        self.task_cpus = task_cpus if task_cpus is not None else cluster.task_cpus
        self.task_gpus = task_gpus if task_gpus is not None else cluster.task_gpus
        self.threads_per_worker = self.task_cpus or session.task_cpus(spark)
        self._cancelled = False
        self._tag = f"sparkdl-fit-{secrets.token_hex(6)}"
        self.driver_host, self.bind_host = channel_hosts(spark, cluster.network_mask)

    def model_dir(self, data_uri: str, checkpoint_dir: str | None) -> str:
        from sparkdl.spark.model_store import model_dir

        return model_dir(self.spark, store=self.store, checkpoint_dir=checkpoint_dir,
                         data_uri=data_uri)

    # Slots ------------------------------------------------------------------------------

    def task_slots(self) -> int | None:
        """The training stage's task slots now (cores over the task's CPUs); ``None`` where
        the session cannot say (Spark Connect to a cluster)."""
        cores = session.total_cores(self.spark)
        return None if cores is None else max(1, cores // self.threads_per_worker)

    def _gpu_amount(self) -> float:
        if self.task_gpus:
            return float(self.task_gpus)
        return float(session.conf_get(self.spark, "spark.task.resource.gpu.amount", "0") or 0)

    def check_slots(self, num_workers: int) -> None:
        """Fail fast when the stage cannot get ``num_workers`` slots at once (barrier mode
        waits for all of them); a figure the session does not offer is skipped, said once."""
        self._check_task_cpus()
        slots = self.task_slots()
        if slots is None:
            log.info("the task slots are unknown on this session: not checked "
                     "(barrier mode needs one slot per worker)")
        elif num_workers > slots:
            raise ConfigurationError(
                f"num_workers={num_workers} but Spark has only {slots} task slots "
                f"({session.total_cores(self.spark)} executor cores, "
                f"{self.threads_per_worker} per task); barrier mode needs one slot per worker"
            )
        task_gpus = self._gpu_amount()
        if task_gpus <= 0:
            return
        executor_gpus = int(float(
            session.conf_get(self.spark, "spark.executor.resource.gpu.amount", "0") or 0))
        executors = session.executor_count(self.spark)
        if executors is None:
            log.info("the executor count is unknown on this session: GPU slots not checked")
            return
        gpu_slots = executors * int(executor_gpus / task_gpus + 1e-9)
        if num_workers > gpu_slots:
            raise ConfigurationError(
                f"num_workers={num_workers} but Spark has only {gpu_slots} GPU task slots "
                f"({executors} executor(s) x spark.executor.resource.gpu.amount="
                f"{executor_gpus} / {task_gpus:g} GPU(s) per task); "
                "barrier mode needs one slot per worker"
            )

    def _check_task_cpus(self) -> None:
        """``cluster.task_cpus`` against the cores a task can have on this session: the
        machine's on a local master (whose stage has the task's threads), else
        ``spark.executor.cores`` when set (no executor could run the stage otherwise; the
        barrier stage would wait for ever). Here, not before Spark starts: spark-submit's
        master and settings win over the configuration's."""
        if not self.task_cpus:
            return
        if session.is_local(self.spark):
            cores = session.cores_from_settings(session.master(self.spark), {})
            if cores is not None and self.task_cpus > cores:
                raise ConfigurationError(
                    f"cluster.task_cpus={self.task_cpus} is more than the {cores} cores of "
                    f"master {session.master(self.spark)}"
                )
            return
        executor = session.conf_get(self.spark, "spark.executor.cores")
        if executor and executor.isdigit() and self.task_cpus > int(executor):
            raise ConfigurationError(
                f"cluster.task_cpus={self.task_cpus} is more than spark.executor.cores="
                f"{executor}: no executor can run a training task"
            )

    def resource_profile(self) -> ResourceProfile | None:
        """The training stage's own profile when ``task_cpus`` or ``task_gpus`` is set; none
        on a ``local`` master, which has no stage-level scheduling (said once)."""
        if not self.task_cpus and not self.task_gpus:
            return None
        if session.master(self.spark).startswith("local["):
            log.warning("cluster.task_cpus/task_gpus: a local master has no stage-level "
                        "scheduling; the training stage runs with spark.task.* instead")
            return None
        from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

        requests = TaskResourceRequests().cpus(self.threads_per_worker)
        if self.task_gpus:
            requests = requests.resource("gpu", float(self.task_gpus))
        return ResourceProfileBuilder().require(requests).build

    # Running ----------------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancelled = True
        self.spark.interruptTag(self._tag)

    def run(self, spec: WorkerSpec, secret: bytes) -> list[WorkerResult]:
        if self.elastic is None:
            return self._run_stage(spec, secret, spark_retries=True)
        return self._run_elastic(spec, secret)

    def _run_elastic(self, spec: WorkerSpec, secret: bytes) -> list[WorkerResult]:
        """Run the stage without Spark's retries (which would wait forever for the slots of
        a host that is gone); after a failure relaunch it with the slots still available,
        at most ``num_workers``, resuming from the latest checkpoint."""
        from sparkdl.training.worker.checkpoint import CheckpointStore

        policy, wanted, checkpoint = self.elastic, len(spec.slices), spec.checkpoint
        assert policy is not None and checkpoint is not None
        store = CheckpointStore(checkpoint.uri)
        spec = dataclasses.replace(spec, elastic=True)
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
                if slots is None:
                    log.info("elastic fit: the task slots are unknown on this session; "
                             "relaunching with %d worker(s)", world)
                    slots = world
                if slots < policy.min_workers:
                    raise TrainingError(
                        f"elastic fit: only {slots} task slot(s) are left after the training "
                        f"stage failed, fewer than training.elastic.min_workers="
                        f"{policy.min_workers}; the failure: {exc}"
                    ) from exc
                new_world = min(wanted, slots)
                log.warning("elastic fit: relaunching the training stage with %d worker(s) "
                            "(was %d) after: %s", new_world, world, exc)
                latest = store.latest(checkpoint.run_id)
                position = (latest.state.epoch, latest.state.step_in_epoch) if latest \
                    else (spec.options.initial_epoch, 0)
                # every relaunch is an event, at the same world size too
                self.elastic_events.append(ElasticEvent(
                    *position, world, new_world, short(str(exc))
                ))
                if new_world != world:
                    current = replan(spec, new_world)

    def _settled_slots(self, settle_s: float = 3.0) -> int | None:
        """The task slots once Spark's count has held still for ``settle_s`` (a lost host's
        executors leave a moment after the stage fails); bounded by ``cluster.timeout_s``."""
        deadline = time.monotonic() + max(self.cluster.timeout_s, settle_s)
        slots, since = self.task_slots(), time.monotonic()
        if slots is None:
            return None
        while time.monotonic() < deadline and time.monotonic() - since < settle_s:
            time.sleep(0.25)
            now = self.task_slots()
            if now != slots:
                slots, since = now, time.monotonic()
        return slots

    def _run_stage(self, spec: WorkerSpec, secret: bytes, *,
                   spark_retries: bool) -> list[WorkerResult]:
        from pyspark.serializers import CloudPickleSerializer

        # by value (cloudpickle): a custom layer a script or notebook defined in __main__
        # exists on no executor until it arrives
        spec_bytes: bytes = CloudPickleSerializer().dumps(spec)  # type: ignore[no-untyped-call]
        check_task_size(self.spark, "fit()", spec_bytes, spec.custom_objects)
        num_workers = len(spec.slices)
        attempts = AttemptLog.create(spec.checkpoint.uri if spec.checkpoint else None)
        train = training_function(spec_bytes, self.cluster, secret, attempts.uri)
        profile = self.resource_profile()

        def stage() -> DataFrame:
            frame = self.spark.range(0, num_workers, 1, num_workers).mapInArrow(
                train, RESULT_SCHEMA, barrier=True, profile=profile
            )
            # Spark retries a failed barrier stage only when it is a shuffle map stage (a
            # failed barrier *result* stage aborts the job), so the results go through a
            # one-partition shuffle: a lost worker then retries the stage, which resumes
            # from the latest checkpoint. An elastic fit relaunches the stage itself.
            return frame.repartition(1) if spark_retries else frame

        self.spark.addTag(self._tag)
        try:
            rows = self._collect_once_slots_registered(stage, num_workers, attempts)
            failures = attempts.read()
            results = [pickle.loads(row["result"])
                       for row in sorted(rows, key=lambda r: r["rank"])]
            if failures:  # Spark's own task-failure logs are off in jobs: say why it retried
                log.warning("the training stage was retried after: %s", "; ".join(failures))
                self.elastic_events.append(retry_event(spec, results, failures))
            return results
        except TrainingError:
            raise
        except Exception as exc:
            raise TrainingError(stage_error(attempts.failures(), exc)) from exc
        finally:
            self.spark.removeTag(self._tag)
            attempts.close()

    def _collect_once_slots_registered(self, stage: Callable[[], DataFrame], num_workers: int,
                                       attempts: AttemptLog) -> list[Row]:
        """Run the stage, submitting it again while Spark refuses it for want of slots.

        Spark checks a barrier stage's slots against the executors registered at the moment
        it creates the stage; on a standalone or ``local-cluster`` master whose executors are
        still registering (a fit started right after the session), the stage reaches Spark as
        a shuffle map stage, whose path fails the job on the first refusal instead of checking
        again every 15 s as a plain job's does. No task ran in a refused stage (none recorded
        a failure), so it is submitted again until the slots are there, after 0.5 s, then
        twice as long each time up to 8 s (Spark logs each refusal), for at most
        ``cluster.timeout_s`` from the first refusal: a new DataFrame each time
        (``stage()``), as the plan of one that was refused keeps the refusal.
        """
        deadline: float | None = None  # from the first refusal on
        pause = 0.5
        while True:
            try:
                return stage().collect()
            except Exception as exc:
                if self._cancelled or not _refused_for_slots(exc) or attempts.failures():
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.cluster.timeout_s
                    log.info("waiting for the executors: the training stage needs %d task "
                             "slots at once and not all are registered yet", num_workers)
                elif now >= deadline:
                    raise TrainingError(
                        f"Spark refused the training stage for {self.cluster.timeout_s:g} s "
                        f"(cluster.timeout_s): barrier mode needs {num_workers} task slots at "
                        "once and the registered executors offer fewer; lower num_workers or "
                        "raise cluster.timeout_s if executors start slowly"
                    ) from exc
                time.sleep(min(pause, max(0.0, deadline - now)))
                pause = min(2 * pause, 8.0)


#: How Spark names its refusal of a barrier stage with more tasks than registered slots.
_SLOTS_REFUSED = ("BarrierJobSlotsNumberCheckFailed", "SPARK-24819")


def _refused_for_slots(exc: BaseException) -> bool:
    """Whether Spark refused a barrier stage for want of slots (classic and Connect)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(mark in text for mark in _SLOTS_REFUSED)


_CHECKPOINT_STEP = re.compile(r"ckpt-(\d+)/*$")


def retry_event(spec: WorkerSpec, results: list[WorkerResult], failures: list[str]
                ) -> ElasticEvent:
    """Spark's retry of a failed training stage, as an :class:`ElasticEvent` at the same world
    size: at the checkpoint the successful attempt resumed from (its global step, under the
    stage's plan), or at the fit's start without one; caused by the failed tasks."""
    epoch, step = spec.options.initial_epoch, 0
    found = _CHECKPOINT_STEP.search(results[0].resumed_from or "") if results else None
    if found and spec.steps_per_epoch > 0:
        epoch, step = divmod(int(found.group(1)), spec.steps_per_epoch)
    world = len(spec.slices)
    return ElasticEvent(epoch, step, world, world, short("; ".join(failures)))
