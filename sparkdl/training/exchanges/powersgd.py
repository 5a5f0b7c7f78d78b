"""PowerSGD's exchange: the compressor's two allreduces on the template of every exchange."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import tensorflow as tf

from sparkdl.comm.communicator import Communicator
from sparkdl.compression.compressor import EncodingStats, prefixed, unprefixed
from sparkdl.compression.powersgd import PowerSGDCompressor
from sparkdl.training.exchanges.exchange import UpdateExchange
from sparkdl.training.exchanges.host_views import aligned_empty

log = logging.getLogger("sparkdl.training")


class PowerSGDExchange(UpdateExchange):
    """Gradients compressed to rank-``r`` factors (Vogels et al. 2019), summed by allreduce.

    The template's hooks, in GRACE's order: :meth:`communicate` runs ``memory.compensate``
    and the compressor's first message (``P = M Q`` and the small tensors), allreduces it,
    lets the compressor orthogonalise the sum and form ``Mᵀ P``, and allreduces that;
    :meth:`decode` is the compressor's decompression into the mean gradient (and
    ``memory.update``); :meth:`apply` is the template's optimizer step, as dense's. Every rank
    decodes the same sums, so every rank applies the same bits. ``overlap`` runs the
    compression and both allreduces (numpy and sockets only) on the background thread; the
    timings' ``communicate_s`` holds the compression.

    State: the template's (the optimizer) plus the compressor's under ``compressor.``.
    """

    def __init__(self, model: tf.keras.Model, comm: Communicator,
                 compressor: PowerSGDCompressor, *, overlap: bool = False) -> None:
        super().__init__(model, comm, overlap=overlap)
        self.compressor = compressor
        self.last_stats: EncodingStats | None = None  # the last compress (frame_bytes)
        self._mean = aligned_empty(self.trainable.size, np.dtype(np.float32))  # TF reads it

    def encode(self, update: np.ndarray, step: int) -> np.ndarray:
        """The gradient itself: the compressor runs in :meth:`communicate`, so that with
        overlap step t+1's ``memory.compensate`` follows step t's ``memory.update`` (the
        template submits step t+1's exchange after decoding step t's)."""
        return update

    def communicate(self, message: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        first, self.last_stats = self.compressor.compress(message, step)
        first_sum = self.comm.allreduce(first, "sum") if self.comm.world_size > 1 else first
        second = self.compressor.compress_second(first_sum)
        second_sum = self.comm.allreduce(second, "sum") if self.comm.world_size > 1 else second
        return first_sum, second_sum

    def decode(self, received: tuple[np.ndarray, np.ndarray], step: int) -> np.ndarray:
        first_sum, second_sum = received
        mean = self.compressor.decompress(first_sum, second_sum, self.comm.world_size,
                                          out=self._mean)
        for block, at, why in self.compressor.redrawn:
            log.warning("PowerSGD: low-rank tensor %d's factor Q collapsed (%s) at step %d; "
                        "drawn afresh (its update waits in the residual)", block, why, at)
        self.compressor.redrawn.clear()
        return mean

    def apply(self, decoded: Any, step: int) -> dict[str, float]:
        extra = super().apply(decoded, step)
        stats = self.last_stats
        if stats is not None:
            extra = {**extra, "frame_bytes": float(stats.bytes_encoded),
                     "sparsity": float(stats.sparsity)}
        return extra

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()  # drains: every decoded mean is applied
        return {**state, **prefixed("compressor", self.compressor.get_state())}

    def set_state(self, state: dict[str, Any]) -> None:
        compressor = unprefixed("compressor", state)
        super().set_state({k: v for k, v in state.items() if not k.startswith("compressor.")})
        self.compressor.set_state(compressor)
