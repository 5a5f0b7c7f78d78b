"""Gradient sharing's fused path: the optimizer writes its update into variables of its own,
the decoded sum is added to the weights in place; optimizers that read the weights take the
fallback (apply to the weights, take the update back out). Both keep replicas bit-identical
and resume exactly.

Two ranks run as two threads of this process over a real TCP ring.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from _comm_harness import run_threads

from sparkdl.comm import create_communicator
from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    FixedThreshold,
    TargetSparsityThreshold,
)
from sparkdl.training.exchanges.optimizer_update import fallback_reason
from sparkdl.training.masters import SharedTrainingMaster

SECRET = b"fused-sharing-test-secret-012345"

OPTIMIZERS = {
    "sgd-momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(1e-2),
    "adamw-weight-decay": lambda: keras.optimizers.AdamW(1e-2, weight_decay=0.05),
}


def _model(optimizer: str, embedding: bool = False) -> keras.Model:
    keras.utils.set_random_seed(7)
    if embedding:  # its forward gathers: TensorFlow puts the table in copy-on-read mode
        layers = [keras.Input((4,), dtype="int32"), keras.layers.Embedding(20, 3),
                  keras.layers.Flatten()]
    else:
        layers = [keras.Input((6,))]
    model = keras.Sequential([*layers, keras.layers.Dense(12, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=OPTIMIZERS[optimizer](),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _batches(rank: int, count: int, embedding: bool = False) -> list[tuple[np.ndarray, Any]]:
    rng = np.random.default_rng(10 + rank)
    out = []
    for _ in range(count):
        x = (rng.integers(0, 20, (8, 4)).astype(np.int32) if embedding
             else rng.standard_normal((8, 6)).astype(np.float32))
        out.append((x, rng.integers(0, 3, 8).astype(np.int64)))
    return out


def _master(overlap: bool = False, world: int = 2) -> SharedTrainingMaster:
    return SharedTrainingMaster(
        8, world, threshold=AdaptiveThreshold(initial=1e-3, min_sparsity=0.05, max_sparsity=0.3),
        encoder="host", overlap=overlap,
    )


def _on_two_ranks(fn) -> list[Any]:  # type: ignore[no-untyped-def]
    return run_threads(2, fn)


def _flat(model: keras.Model) -> bytes:
    return b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_fused_and_fallback_keep_replicas_bit_identical_and_resume_exactly(
    optimizer: str, overlap: bool
) -> None:
    steps, cut = 16, 7
    models = [_model(optimizer), _model(optimizer)]
    resumed = [_model(optimizer), _model(optimizer)]

    def fn(rank: int, comm: Any) -> dict[str, Any]:
        master = _master(overlap)
        exchange = master.create_exchange(models[rank], comm, job_id=3)
        batches = _batches(rank, steps)
        for step, (x, y) in enumerate(batches[:cut]):
            exchange.step(x, y, step)
        exchange.finish()
        weights, state = models[rank].get_weights(), exchange.get_state()
        for step, (x, y) in enumerate(batches[cut:], start=cut):
            exchange.step(x, y, step)
        exchange.finish()
        other = master.create_exchange(resumed[rank], comm, job_id=3)
        resumed[rank].set_weights(weights)
        other.set_state(state)
        for step, (x, y) in enumerate(batches[cut:], start=cut):
            other.step(x, y, step)
        other.finish()
        return {"reason": exchange.fallback_reason, "state": exchange.get_state(),
                "resumed_state": other.get_state()}

    results = _on_two_ranks(fn)
    fused = optimizer != "adamw-weight-decay"
    assert all((r["reason"] is None) == fused for r in results)
    assert _flat(models[0]) == _flat(models[1]) == _flat(resumed[0]) == _flat(resumed[1])
    assert _flat(models[0]) != _flat(_model(optimizer))  # it trained
    for r in results:
        assert set(r["state"]) == set(r["resumed_state"])
        for key, value in r["state"].items():
            assert np.array_equal(np.asarray(value), np.asarray(r["resumed_state"][key])), key


def test_the_update_lands_in_the_residual_and_the_sum_in_the_weights_exactly() -> None:
    """World 1, SGD without momentum: the update is -(lr * g) bit for bit; the residual plus
    the sent sum is that update, and the weights moved by exactly the sum. Variables that
    TensorFlow switched to copy-on-read (by a sparse read) take their entries in place too."""
    model = _model("sgd-momentum", embedding=True)
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=SECRET, timeout_s=10)
    try:
        master = SharedTrainingMaster(8, 1, threshold=FixedThreshold(0.1), encoder="host",
                                      residual_clipping=None)
        exchange = master.create_exchange(model, comm, job_id=1)
        assert exchange.fallback_reason is None
        for variable in model.trainable_variables:
            variable.value.sparse_read([0])  # copy-on-read: dense reads copy from now on
        decoded, sparse_steps = [], []
        decode = exchange.decode
        exchange.decode = lambda received, step: decoded.append(decode(received, step)) or (
            decoded[-1])
        for step, (x, y) in enumerate(_batches(0, 6, embedding=True)):
            before = [w.copy() for w in model.get_weights()]
            residual = exchange.compressor.get_residual()
            with tf.GradientTape() as tape:
                loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            update = np.concatenate(
                [-(np.asarray(tf.convert_to_tensor(g)) * np.float32(0.5)).ravel() for g in grads]
            )
            exchange.step(x, y, step)
            sparse = decoded[-1][0]
            if sparse is None:  # bitmap frames: the dense sum
                index = np.flatnonzero(exchange._sum)
                sparse = index, exchange._sum[index]
            index, values = sparse
            sparse_steps.append(decoded[-1][0] is not None)
            assert index.size > 0 and set(np.abs(values).tolist()) == {np.float32(0.1)}
            expected = np.concatenate([w.ravel() for w in before])
            expected[index] += values
            assert np.array_equal(
                np.concatenate([w.ravel() for w in model.get_weights()]), expected
            )
            total = np.zeros_like(expected)
            total[index] = values
            np.testing.assert_array_equal(
                exchange.compressor.get_residual() + total, residual + update
            )
        assert any(sparse_steps)  # the in-place addition ran
    finally:
        comm.close()


class _SGDSubclass(keras.optimizers.SGD):
    pass


@pytest.mark.parametrize("make, fused", [
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True), True),
    (lambda: keras.optimizers.RMSprop(1e-3), True),
    (lambda: keras.optimizers.Adam(1e-3, amsgrad=True), True),
    (lambda: keras.optimizers.SGD(0.1, weight_decay=1e-4), False),
    (lambda: keras.optimizers.AdamW(1e-3), False),
    (lambda: keras.optimizers.Ftrl(1e-3), False),
    (lambda: keras.optimizers.Adam(1e-3, use_ema=True), False),
    (lambda: keras.optimizers.Adam(1e-3, gradient_accumulation_steps=2), False),
    (lambda: _SGDSubclass(0.1), False),
], ids=["nesterov", "rmsprop", "amsgrad", "sgd-weight-decay", "adamw", "ftrl", "ema",
        "accumulation", "subclass"])
def test_only_optimizers_whose_update_ignores_the_weights_take_the_fused_path(make, fused):
    model = _model("adam")
    optimizer = make()
    optimizer.build(model.trainable_variables)
    assert (fallback_reason(optimizer, model.trainable_variables) is None) == fused


def test_a_weight_constraint_takes_the_fallback() -> None:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        2, kernel_constraint=keras.constraints.NonNeg())])
    reason = fallback_reason(keras.optimizers.SGD(0.1), model.trainable_variables)
    assert reason is not None and "constraint" in reason


def _apart(model: keras.Model, comm: Any) -> Any:
    """The fused host exchange with the residual in the compressor's own vector."""
    from sparkdl.training.exchanges.sharing import GradientSharingExchange
    from sparkdl.training.exchanges.variables import FlatVariables

    compressor = _master(world=1).compressor.build(
        FlatVariables(model.trainable_variables).size, job_id=1, rank=comm.rank)
    return GradientSharingExchange(model, comm, compressor, hold_residual=False)


def test_a_non_finite_update_is_dropped_and_the_next_step_starts_from_zero() -> None:
    """SGD without momentum (no state a NaN could poison), the residual apart from U: good,
    NaN, good trains exactly like good, good — the update variables were left zero, the
    residual untouched."""
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=SECRET, timeout_s=10)
    try:
        finals = []
        (x0, y0), (x1, y1) = _batches(0, 2)
        for with_nan in (True, False):
            model = _model("adam")
            model.compile(optimizer=keras.optimizers.SGD(0.1),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            exchange = _apart(model, comm)
            assert exchange.fallback_reason is None and exchange._memory is None
            results = [exchange.step(x0, y0, 0)]
            if with_nan:
                before = (_flat(model), exchange.compressor.get_residual())
                results.append(exchange.step(np.full_like(x0, np.nan), y0, 1))
                assert not results[-1].finite_update
                assert _flat(model) == before[0]
                assert np.array_equal(exchange.compressor.get_residual(), before[1])
            results.append(exchange.step(x1, y1, 1))
            exchange.finish()
            finals.append((_flat(model), exchange.compressor.get_residual().tobytes()))
        assert finals[0] == finals[1]
    finally:
        comm.close()


@pytest.mark.parametrize("poison", ["nan-batch", "one-inf"])
def test_a_non_finite_update_held_in_u_ends_the_step_before_anything_is_sent(
    poison: str,
) -> None:
    """The residual held in U takes the non-finite update (as the optimizer's state does):
    the step reports it, nothing is encoded or sent, the weights and the residual are
    untouched (the loop then ends training: test_timeline_fit's failed fit). The graph does
    not check U: the encode sweep finds a NaN batch's U (every element a candidate: the
    bitmap phase) as it finds one infinity among the sparse candidates."""
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=SECRET, timeout_s=10)
    try:
        model = _model("sgd-momentum")
        exchange = _master(world=1).create_exchange(model, comm, job_id=1)
        assert exchange._memory is not None
        (x0, y0), (x1, y1) = _batches(0, 2)
        exchange.step(x0, y0, 0)
        weights, tau = _flat(model), exchange.compressor.threshold.get_state()
        if poison == "nan-batch":
            x1 = np.full_like(x1, np.nan)
        else:
            u = exchange._updates.variables[0]
            u.assign(tf.tensor_scatter_nd_update(u, [[1, 2]], [np.inf]))
        result = exchange.step(x1, y1, 1)
        assert not result.finite_update and "frame_bytes" not in result.extra
        assert _flat(model) == weights
        assert exchange.compressor.threshold.get_state() == tau  # nothing was encoded
        residual = exchange.compressor.get_residual()
        assert not np.isfinite(residual).all()
        if poison == "one-inf":  # the step's update is in U, nothing taken out of it
            assert np.count_nonzero(~np.isfinite(residual)) == 1
            again = exchange.step(x1, y1, 2)  # the infinity stays: every step ends there
            assert not again.finite_update
    finally:
        comm.close()


@pytest.mark.parametrize("make", [
    lambda: keras.optimizers.SGD(0.1),
    lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    lambda: keras.optimizers.RMSprop(1e-2, momentum=0.5),
    lambda: keras.optimizers.Adagrad(0.1),
    lambda: keras.optimizers.Adadelta(1.0),
    lambda: keras.optimizers.Adamax(1e-2),
    lambda: keras.optimizers.Nadam(1e-2),
    lambda: keras.optimizers.Lion(1e-3),
    lambda: keras.optimizers.Adam(1e-2, amsgrad=False),
], ids=["sgd", "nesterov", "rmsprop", "adagrad", "adadelta", "adamax", "nadam", "lion", "adam"])
def test_the_update_written_into_u_is_the_sum_into_zeroed_u_bit_for_bit(make) -> None:  # type: ignore[no-untyped-def]
    """U ← 0 + d (one assignment, U never zeroed) equals U ← 0; U += d, step after step, for
    every optimizer the fused path takes (signed zeros included)."""
    import tensorflow as tf

    from sparkdl.training.exchanges.optimizer_update import UpdateVariables

    rng = np.random.default_rng(8)
    shapes = [(3, 4), (4,)]
    written = []
    for _ in range(2):
        variables = [tf.Variable(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        optimizer = make()
        optimizer.build(variables)
        written.append((optimizer, UpdateVariables(optimizer, variables)))
    ref_optimizer, ref_updates = written.pop()

    @tf.function
    def write(grads):  # type: ignore[no-untyped-def]
        written[0][1].apply(grads)

    @tf.function
    def add(grads):  # type: ignore[no-untyped-def]
        for update in ref_updates.variables:
            update.assign(tf.zeros_like(update))
        ref_optimizer.apply(grads, ref_updates.variables)

    for step in range(4):
        grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        grads[1] = grads[1] * tf.constant([0.0, -0.0, 1.0, 1.0])  # zero gradients too
        write(grads)
        add(grads)
        for got, expected in zip(written[0][1].variables, ref_updates.variables):
            assert np.array_equal(got.numpy().view(np.int32), expected.numpy().view(np.int32)), (
                step, got.numpy(), expected.numpy())


HELD_THRESHOLDS = {
    "adaptive": lambda: AdaptiveThreshold(initial=1e-3, min_sparsity=0.01, max_sparsity=0.2),
    "target-sparsity": lambda: TargetSparsityThreshold(0.1),  # bitmap frames
    "fixed": lambda: FixedThreshold(2e-3),
}


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("threshold", sorted(HELD_THRESHOLDS))
def test_the_residual_held_in_the_update_variables_trains_bit_for_bit_as_apart(
    threshold: str, overlap: bool
) -> None:
    """The fused host path keeps the residual in U (the optimizer adds each update to it, the
    host encodes it in place): weights, residual, tau and optimizer state equal, bit for bit,
    those of the residual kept in the compressor's own vector — on both ranks, with
    shake-up and clipping, across chunk boundaries that fall inside and between variables,
    and after a resume from the state of the held path."""
    from sparkdl.compression.compressor import ThresholdCompressorConfig
    from sparkdl.compression.threshold import ResidualClipping, ShakeUp
    from sparkdl.training.exchanges.sharing import GradientSharingExchange
    from sparkdl.training.exchanges.variables import FlatVariables

    steps, cut = 12, 5

    def model() -> keras.Model:  # 154,103 parameters: 3 encode chunks, one inside a kernel
        keras.utils.set_random_seed(11)
        built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(300, activation="relu"),
                                  keras.layers.Dense(500, activation="relu"),
                                  keras.layers.Dense(3)])
        built.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return built

    models = {(hold, rank): model() for hold in (True, False) for rank in (0, 1)}
    resumed = [model(), model()]
    config = ThresholdCompressorConfig(HELD_THRESHOLDS[threshold](), ShakeUp(4, 0.5),
                                       ResidualClipping(3.0, 3))

    def exchange(m: keras.Model, comm: Any, hold: bool) -> GradientSharingExchange:
        size = FlatVariables(m.trainable_variables).size
        compressor = config.build(size, job_id=5, rank=comm.rank)
        return GradientSharingExchange(m, comm, compressor, overlap=overlap, hold_residual=hold)

    def fn(rank: int, comm: Any) -> dict[str, Any]:
        batches = _batches(rank, steps)
        out: dict[str, Any] = {}
        for hold in (True, False):
            ex = exchange(models[hold, rank], comm, hold)
            assert (ex._memory is not None) == hold
            for step, (x, y) in enumerate(batches):
                result = ex.step(x, y, step)
                out.setdefault(hold, []).append(result.extra.get("bitmap"))
                if step == cut - 1:  # both: a drain changes overlap's schedule
                    ex.finish()
                    if hold:
                        weights, state = models[hold, rank].get_weights(), ex.get_state()
            ex.finish()
            out[hold, "state"] = ex.get_state()
        other = exchange(resumed[rank], comm, True)
        resumed[rank].set_weights(weights)
        other.set_state(state)
        for step, (x, y) in enumerate(batches[cut:], start=cut):
            other.step(x, y, step)
        other.finish()
        out["resumed", "state"] = other.get_state()
        return out

    results = _on_two_ranks(fn)
    final = _flat(models[False, 0])
    assert final != _flat(model())  # it trained
    assert {_flat(models[h, r]) for h in (True, False) for r in (0, 1)} == {final}
    assert _flat(resumed[0]) == _flat(resumed[1]) == final
    for r in results:
        reference = r[False, "state"]
        for got in (r[True, "state"], r["resumed", "state"]):
            assert set(got) == set(reference)
            for key, value in reference.items():  # residuals: signed zeros may differ
                assert np.array_equal(np.asarray(value), np.asarray(got[key])), key
        assert np.abs(reference["compressor.memory.residual"]).max() > 0
    if threshold == "target-sparsity":
        assert 1.0 in results[0][True]  # bitmap frames were sent
