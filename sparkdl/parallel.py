"""ParallelWrapper: the Spark worker loop on one machine, in local processes, no Spark.

Like DL4J's ParallelWrapper it trains one model with several workers on one host; here each
worker is a process (TensorFlow is not fork-safe, so they are spawned) that runs exactly the
code a Spark barrier task runs, with a local rendezvous instead of ``BarrierTaskContext``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparkdl.comm import MESH_MODES, create_communicator
from sparkdl.comm.rendezvous import TcpStoreServer, store_exchange
from sparkdl.cpus import check_mode, current_cpus, plan_cores
from sparkdl.errors import ConfigurationError, TrainingError
from sparkdl.gpu import pin_gpus, round_robin
from sparkdl.main_guard import unguarded_main_line
from sparkdl.training.driver.keras_fit import KerasFit
from sparkdl.training.driver.launcher import ChannelSettings
from sparkdl.training.masters import TrainingMaster

if TYPE_CHECKING:
    from sparkdl.training.driver.run_fit import FitResult
    from sparkdl.training.summary import WorkerResult
    from sparkdl.training.worker.run_worker import WorkerSpec


class ParallelWrapper(KerasFit):
    """Train a compiled Keras model with ``training_master.num_workers`` local processes."""

    def __init__(
        self,
        model: Any,
        training_master: TrainingMaster,
        *,
        transport: str = "tcp",
        timeout_s: float = 120.0,
        threads_per_worker: int = 1,
        custom_objects: dict[str, Any] | None = None,
        wire_integrity: str = "none",
        gpus_per_worker: int = 0,
        devices: Sequence[str] | None = None,
        mesh: str = "plain",
        cpu_affinity: str = "auto",
    ) -> None:
        """``gpus_per_worker`` > 0 pins each worker process to that many of ``devices`` (GPU ids;
        default: this process's ``CUDA_VISIBLE_DEVICES``), taken round-robin by rank, before
        TensorFlow loads in it. ``mesh``: the collectives, as ``cluster.mesh``
        (``plain | mesh | auto``). ``cpu_affinity``: each worker on cores of its own, as
        ``cluster.cpu_affinity`` (``auto | on | off``, see :mod:`sparkdl.cpus`)."""
        if transport not in ("tcp", "spark"):
            raise ConfigurationError(f"transport must be 'tcp' or 'spark', got {transport!r}")
        self.model = model
        self.training_master = training_master
        self.transport = transport
        self.timeout_s = float(timeout_s)
        self.threads_per_worker = int(threads_per_worker)
        self.custom_objects = custom_objects
        self.wire_integrity = wire_integrity
        if mesh not in MESH_MODES:
            raise ConfigurationError(f"mesh: expected one of {list(MESH_MODES)}, got {mesh!r}")
        if mesh == "mesh" and transport != "tcp":
            raise ConfigurationError(f"mesh 'mesh' needs transport 'tcp', not {transport!r}")
        self.mesh = mesh
        self.cpu_affinity = check_mode(cpu_affinity)
        if devices is None and gpus_per_worker > 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
            devices = [d for d in visible.split(",") if d.strip()] if visible else None
            if not devices:
                raise ConfigurationError(
                    f"gpus_per_worker={gpus_per_worker} needs devices=[...] (GPU ids) or "
                    "CUDA_VISIBLE_DEVICES set in this process"
                )
        self.gpus_per_worker = int(gpus_per_worker)
        self.devices = [str(d) for d in devices] if devices else []
        self.last_fit: FitResult | None = None

    def worker_gpus(self, rank: int) -> list[str] | None:
        """The GPU ids worker ``rank`` is pinned to; ``None`` when workers get no GPUs."""
        if self.gpus_per_worker <= 0:
            return None
        return round_robin(self.devices, self.gpus_per_worker, rank)

    def _launcher(self) -> _ProcessLauncher:
        return _ProcessLauncher(self)

    def _channel_settings(self) -> ChannelSettings:
        return ChannelSettings(self.timeout_s)


class _ProcessLauncher:
    """Runs the workers as spawned local processes with a local rendezvous."""

    driver_host = bind_host = "127.0.0.1"

    def __init__(self, wrapper: ParallelWrapper) -> None:
        self.wrapper = wrapper
        self.threads_per_worker = wrapper.threads_per_worker
        self._processes: list[Any] = []

    def check_slots(self, num_workers: int) -> None:
        """Local processes always fit (they share the cores); but a fit reached from a
        script's unguarded top-level code would run that code again in every spawned worker:
        that fails here, at once."""
        unguarded = unguarded_main_line()
        if unguarded is not None:
            script, line = unguarded
            raise ConfigurationError(
                f"ParallelWrapper.fit is called from the top level of {script} (line {line}) "
                'outside an `if __name__ == "__main__":` block: its workers are spawned '
                "processes that import the script again, so each would rerun that code (its "
                "Spark session, its ETL). Put the script's top-level code under "
                '`if __name__ == "__main__":`'
            )

    def model_dir(self, data_uri: str, checkpoint_dir: str | None) -> str:
        """The workers share this machine: a temporary directory of this process."""
        from sparkdl.training.model_files import temporary_model_dir

        return temporary_model_dir()

    def cancel(self) -> None:
        for process in list(self._processes):
            if process.is_alive():
                process.kill()

    def run(self, spec: WorkerSpec, secret: bytes) -> list[WorkerResult]:
        wrapper = self.wrapper
        world = len(spec.slices)
        context = mp.get_context("spawn")
        results_queue = context.Queue()
        with TcpStoreServer(secret) as server:
            self._processes = [
                context.Process(
                    target=_worker_process,
                    args=(spec, rank, world, server.address, secret, wrapper.transport,
                          wrapper.timeout_s, results_queue, wrapper.wire_integrity,
                          wrapper.worker_gpus(rank), wrapper.mesh, wrapper.cpu_affinity),
                    daemon=True,
                )
                for rank in range(world)
            ]
            for process in self._processes:
                process.start()
            return _collect(results_queue, self._processes, wrapper.timeout_s)



def _collect(results_queue: Any, processes: list[Any], timeout_s: float) -> list[WorkerResult]:
    """Wait for every worker's result; a worker that dies or errors fails the fit."""
    results: list[WorkerResult] = []
    errors: list[str] = []
    idle_since = time.monotonic()
    try:
        while len(results) + len(errors) < len(processes):
            try:
                kind, payload = results_queue.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in processes if p.exitcode not in (None, 0)]
                if dead and len(results) + len(errors) < len(processes):
                    # give the queue a moment to deliver an error report before judging
                    time.sleep(0.5)
                    if results_queue.empty():
                        codes = ", ".join(f"{p.name} exit {p.exitcode}" for p in dead)
                        raise TrainingError(f"a worker process died: {codes}") from None
                if time.monotonic() - idle_since > timeout_s * 10:
                    raise TrainingError("workers made no progress; giving up") from None
                continue
            (results if kind == "ok" else errors).append(payload)
        if errors:
            raise TrainingError("worker failed: " + "; ".join(errors))
        return results
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


def _worker_process(
    spec: WorkerSpec,
    rank: int,
    world_size: int,
    address: str,
    secret: bytes,
    transport: str,
    timeout_s: float,
    results_queue: Any,
    wire_integrity: str = "none",
    gpus: list[str] | None = None,
    mesh: str = "plain",
    cpu_affinity: str = "off",
) -> None:
    try:
        pin_gpus(gpus, role="parallel")  # before anything imports TensorFlow
        from sparkdl.training.worker.task import run_task

        # every worker is a child of this machine's driver process: all see the same cores
        cores = plan_cores(current_cpus(), rank, world_size, spec.threads, cpu_affinity)

        def rendezvous() -> tuple[list[int] | None, Any]:
            exchange = store_exchange(address, rank, world_size, secret=secret,
                                      timeout_s=timeout_s)
            return cores, create_communicator(
                transport, rank, world_size, exchange, secret=secret, timeout_s=timeout_s,
                wire_integrity=wire_integrity, mesh=mesh,
            )

        result = run_task(spec, rendezvous, secret=secret, gpus=gpus)
        results_queue.put(("ok", result))
    except BaseException as exc:  # report every failure to the parent, then exit non-zero
        results_queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None
