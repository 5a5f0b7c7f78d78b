"""Host (numpy) vs device (TensorFlow) threshold encoder: timing, and a GPU placement check.

    python -m benchmarks.device_encoding bench
    #   encode time at sparsity ~1e-3
    python -m benchmarks.device_encoding gpu-check
    #   needs a GPU; exits non-zero on failure

``gpu-check`` trains a tiny model for a few steps with ``encoder="auto"`` on a GPU and
asserts that the encoder picked is the device one, that the update handed to it and its
residual live on the GPU, that no tensor of the update's size is copied to the host during a
step (every eager device->host copy goes through ``_EagerTensorBase._numpy`` and is
recorded), and that the weights equal, bit for bit, a run with ``encoder="host"``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops

from sparkdl.compression import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ShakeUp,
    ThresholdCompressor,
)
from sparkdl.training.exchanges.device_encoding import DeviceThresholdCompressor


@contextmanager
def record_host_copies() -> Iterator[list[int]]:
    """Byte sizes of every eager tensor copied to numpy inside the block."""
    sizes: list[int] = []
    original = ops._EagerTensorBase._numpy

    def recording(self):  # type: ignore[no-untyped-def]
        value = original(self)
        sizes.append(int(np.asarray(value).nbytes))
        return value

    ops._EagerTensorBase._numpy = recording
    try:
        yield sizes
    finally:
        ops._EagerTensorBase._numpy = original


def bench(sizes: list[int], sparsity: float, repeats: int) -> None:
    rng = np.random.default_rng(0)
    print(f"devices: {[d.name for d in tf.config.list_logical_devices()]}")
    for n in sizes:
        u = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        tau = float(np.quantile(np.abs(u), 1 - sparsity))
        ut = tf.identity(tf.constant(u))  # on the default (GPU if any) device
        for name, comp in (
            ("host", ThresholdCompressor(n, FixedThreshold(tau))),
            ("device", DeviceThresholdCompressor(n, FixedThreshold(tau))),
        ):
            times = []
            for step in range(repeats + 1):
                if isinstance(comp, DeviceThresholdCompressor):
                    comp.variable.assign(tf.zeros([n]))
                else:
                    comp.residual[:] = 0
                started = time.perf_counter()
                update = ut if name == "device" else ut.numpy()  # host path pays the copy
                _, stats = comp.compress(update, step)
                if step:
                    times.append(time.perf_counter() - started)
            print(
                f"n={n:>10,} {name:6} median {np.median(times) * 1e3:8.2f} ms "
                f"(nnz {stats.nnz}, {stats.encoding})"
            )


def _train(encoder: str, steps: int) -> tuple[str, type, list[int], int]:
    import keras

    from sparkdl.comm import create_communicator
    from sparkdl.training.exchanges.variables import weights_checksum
    from sparkdl.training.masters import SharedTrainingMaster

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    comm = create_communicator("tcp", 0, 1, lambda s: [s], secret=b"x" * 32, timeout_s=30)
    master = SharedTrainingMaster(
        32,
        1,
        threshold=AdaptiveThreshold(initial=1e-4),
        shake_up=ShakeUp(frequency=3, factor=0.2),
        residual_clipping=ResidualClipping(factor=5.0, frequency=2),
        encoder=encoder,
    )
    exchange = master.create_exchange(model, comm, job_id=1)
    compressor = exchange.compressor
    n = exchange.trainable.size
    update_devices: list[str] = []
    if isinstance(compressor, DeviceThresholdCompressor):
        assert "GPU" in compressor.variable.device, compressor.variable.device
        inner = compressor.compress

        def spy(update, step):  # type: ignore[no-untyped-def]
            update_devices.append(update.device)
            return inner(update, step)

        compressor.compress = spy  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    copies: list[int] = []
    for step in range(steps):
        x = rng.standard_normal((32, 64)).astype(np.float32)
        y = rng.integers(0, 10, 32).astype(np.int64)
        with record_host_copies() as sizes:
            exchange.step(x, y, step)
        copies.extend(sizes)
    exchange.finish()
    assert all("GPU" in d for d in update_devices), update_devices
    comm.close()
    return weights_checksum(model.trainable_variables), type(compressor), copies, n


def gpu_check(steps: int) -> None:
    if not tf.config.list_physical_devices("GPU"):
        sys.exit("gpu-check: no GPU visible to TensorFlow")
    tf.config.experimental.enable_op_determinism()
    weights_d, kind, copies, n = _train("auto", steps)
    assert kind is DeviceThresholdCompressor, kind
    assert max(copies) < 4 * n, f"a {max(copies)}-byte copy; the update is {4 * n} bytes"
    weights_h, kind_h, copies_h, _ = _train("host", steps)
    assert kind_h is ThresholdCompressor
    assert weights_d == weights_h, "device and host encoders trained different weights"
    print(
        f"gpu-check OK: {n} parameters, {steps} steps; largest device->host copy "
        f"{max(copies)} bytes with the device encoder vs {max(copies_h)} with the host "
        f"encoder; weights identical ({weights_d[:16]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--sizes", type=int, nargs="+", default=[431_080, 10_000_000])
    b.add_argument("--sparsity", type=float, default=1e-3)
    b.add_argument("--repeats", type=int, default=7)
    g = sub.add_parser("gpu-check")
    g.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    if args.command == "bench":
        bench(args.sizes, args.sparsity, args.repeats)
    else:
        gpu_check(args.steps)


if __name__ == "__main__":
    main()
