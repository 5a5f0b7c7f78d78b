"""training.overlap: one-step staleness, identical replicas, drains, checkpoint/resume.

Two ranks run as two threads of this process over a real TCP ring (no Spark: the exchanges
know only TensorFlow and a communicator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from _comm_harness import run_threads

from sparkdl.compression.threshold import AdaptiveThreshold, FixedThreshold
from sparkdl.config import JobConfig
from sparkdl.errors import ConfigurationError
from sparkdl.training.masters import (
    DenseTrainingMaster,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    master_from_config,
    master_from_training_config,
)
from sparkdl.training.worker.loop import WorkerCallback, run_loop

STEPS = 6


def _model(optimizer: str = "adam") -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
    )
    opt = keras.optimizers.Adam(1e-2) if optimizer == "adam" else keras.optimizers.SGD(0.1)
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batches(rank: int, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(100 * rank + epoch)
    return [(rng.standard_normal((8, 6)).astype(np.float32),
             rng.integers(0, 3, 8).astype(np.int64)) for _ in range(STEPS)]


def _sharing(overlap: bool, world: int = 2, encoder: str = "host") -> SharedTrainingMaster:
    return SharedTrainingMaster(
        8, world, threshold=AdaptiveThreshold(initial=1e-3, min_sparsity=0.05, max_sparsity=0.3),
        encoder=encoder, overlap=overlap,
    )


def _on_ranks(world: int, fn: Callable[[int, Any, Any], Any], hosts: list[str] | None = None,
              topology: str = "flat") -> list[Any]:
    """Run ``fn(rank, comm, model)`` on ``world`` threads joined by real TCP rings (one
    ring, or per-host rings plus the leaders' when ``hosts`` fakes several hosts)."""
    models = [_model() for _ in range(world)]  # built on this thread (Keras naming state)
    return run_threads(world, lambda rank, comm: fn(rank, comm, models[rank]), hosts=hosts,
                       topology=topology)


def _train(master, epochs: int = 2, callbacks=(), start_epoch: int = 0, restore=None,
           **topology):
    def fn(rank, comm, model):
        exchange = master.create_exchange(model, comm, job_id=9)
        if restore is not None:
            weights, state = restore[rank]
            model.set_weights(weights)
            exchange.set_state(state)
        run_loop(exchange, comm, lambda epoch: iter(_batches(rank, epoch)), epochs=epochs,
                 steps_per_epoch=STEPS, batch_size=8, start_epoch=start_epoch,
                 callbacks=[c(rank) for c in callbacks])
        return [w.copy() for w in model.get_weights()], exchange

    return _on_ranks(master.num_workers, fn, **topology)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


@pytest.mark.parametrize("make", [
    _sharing,
    lambda overlap: _sharing(overlap, encoder="device"),  # encodes on the background thread
    lambda overlap: DenseTrainingMaster(8, 2, overlap=overlap),
], ids=["sharing-host", "sharing-device", "dense"])
def test_overlap_keeps_replicas_bit_identical_and_stays_close_to_sync(make):
    (w0, _), (w1, _) = _train(make(True))
    assert _same(w0, w1)
    (s0, _), (s1, _) = _train(make(False))
    assert _same(s0, s1)
    # one step of staleness changes the trajectory, a little
    assert not _same(w0, s0)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(w0, s0)) < 0.05


def test_dense_overlap_applies_each_mean_gradient_one_step_late():
    """World 1, SGD: step t applies the gradient of step t-1 (computed on the weights before
    that one was applied); the epoch's end applies the last one."""
    master = DenseTrainingMaster(8, 1, overlap=True)

    def fn(rank, comm, _model_unused):
        model = _model("sgd")
        exchange = master.create_exchange(model, comm, job_id=9)
        run_loop(exchange, comm, lambda epoch: iter(_batches(rank, epoch)), epochs=1,
                 steps_per_epoch=STEPS, batch_size=8)
        return [w.copy() for w in model.get_weights()]

    weights, = _on_ranks(1, fn)
    reference = _model("sgd")
    optimizer, variables, pending = keras.optimizers.SGD(0.1), reference.trainable_variables, None
    for x, y in _batches(0, 0):
        with tf.GradientTape() as tape:
            loss = reference.compute_loss(x=x, y=y, y_pred=reference(x, training=True))
        grads = tape.gradient(loss, variables)
        if pending is not None:
            optimizer.apply(pending, variables)
        pending = grads
    optimizer.apply(pending, variables)
    np.testing.assert_allclose(np.concatenate([w.ravel() for w in weights]),
                               np.concatenate([w.ravel() for w in reference.get_weights()]),
                               rtol=0, atol=1e-6)


def test_sharing_overlap_gradient_sees_the_sums_up_to_the_step_before():
    """At every step end the model holds the shared weights W; the message of that step is
    still in flight and is applied by the next step (or the drain), exactly once."""
    seen: list[tuple[int, bool, float]] = []

    class Probe(WorkerCallback):
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def on_step_end(self, loop, epoch, step, outcome):
            ex = loop.exchange
            # fused: the model's variables are W (no copy to compare with)
            at_w = not ex._shared or all(np.array_equal(v.numpy(), s.numpy()) for v, s in zip(
                ex.model.trainable_variables, ex._shared))
            if self.rank == 0:
                seen.append((step, ex._in_flight.in_flight and at_w, outcome.loss))

        def on_epoch_end(self, loop, epoch, logs):
            ex = loop.exchange
            if self.rank == 0:  # drained before the epoch's figures were combined
                seen.append((-1, not ex._in_flight.in_flight, float(ex._pending_host.any())))

    _train(_sharing(True), epochs=1, callbacks=[Probe])
    assert [s[:2] for s in seen[:STEPS]] == [(i, True) for i in range(STEPS)]
    assert seen[-1] == (-1, True, 0.0)


def test_resume_from_a_drained_checkpoint_continues_bit_identically():
    saved: dict[int, Any] = {}

    class Save(WorkerCallback):
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def on_epoch_end(self, loop, epoch, logs):
            if epoch == 0:
                loop.exchange.finish()
                saved[self.rank] = ([w.copy() for w in loop.exchange.model.get_weights()],
                                    loop.exchange.get_state())

    full = _train(_sharing(True), epochs=2, callbacks=[Save])
    resumed = _train(_sharing(True), epochs=2, start_epoch=1, restore=saved)
    for (a, _), (b, _) in zip(full, resumed):
        assert _same(a, b)


def test_overlap_is_refused_for_averaging_and_round_trips_elsewhere():
    with pytest.raises(ConfigurationError, match="overlap applies to gradient sharing"):
        ParameterAveragingTrainingMaster(8, 2, overlap=True)
    with pytest.raises(ValueError, match="overlap: true applies to mode 'sharing' or 'dense'"):
        JobConfig(training={"mode": "averaging", "overlap": True})
    with pytest.raises(ConfigurationError, match="overlap must be true or false"):
        SharedTrainingMaster(8, 2, overlap="yes")  # type: ignore[arg-type]
    for master in (SharedTrainingMaster(8, 2, threshold=FixedThreshold(1e-3), overlap=True),
                   DenseTrainingMaster(8, 2, overlap=True)):
        again = master_from_config(master.get_config())
        assert again.overlap is True and again.get_config() == master.get_config()
    for mode in ("sharing", "dense"):
        training = JobConfig(training={"mode": mode, "overlap": True}).training
        assert master_from_training_config(training).overlap is True
    sharing = JobConfig(training={"mode": "sharing"}).training
    assert master_from_training_config(sharing).overlap is False


def test_sharing_over_the_per_host_accumulator_equals_the_flat_ring(overlap=True):
    """Two fake hosts (ranks 0, 1 on one; 2 on the other): the host bundles decode to the
    same sum in the same order, so the weights are those of the flat ring, bit for bit."""
    flat = _train(_sharing(overlap, world=3), epochs=1)
    tree = _train(_sharing(overlap, world=3), epochs=1, hosts=["a", "a", "b"], topology="auto")
    assert type(tree[0][1].comm).__name__ == "HierarchicalCommunicator"
    for (a, _), (b, _) in zip(flat, tree):
        assert _same(a, b) and _same(a, flat[0][0])
