"""The threshold compressor: residual memory + threshold algorithm + wire format.

GRACE-style separation: the residual (error-feedback memory) is a plain float32 vector owned
by the compressor, the threshold algorithm only chooses tau, and the encoding and framing are
pure functions. Each step a worker calls :meth:`ThresholdCompressor.compress` on its update,
exchanges the frames (all ranks, in rank order), and every worker calls
:meth:`ThresholdCompressor.decompress_sum` on the same list, which yields the same float32
sum bit for bit on every worker.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparkdl.compression.encoding import EncodedUpdate, Encoding, decode_into, threshold_encode
from sparkdl.compression.threshold import ResidualClipping, ShakeUp, ThresholdAlgorithm
from sparkdl.compression.wire import pack_frame, unpack_frame
from sparkdl.errors import CommunicationError, ConfigurationError

__all__ = ["EncodingStats", "ThresholdCompressor"]


@dataclass
class EncodingStats:
    """What one :meth:`ThresholdCompressor.compress` call did.

    ``bytes_encoded`` is the whole frame (header plus payload); ``encode_seconds`` covers the
    residual update, encoding, clipping and framing.
    """

    step: int
    tau: float
    nnz: int
    num_elements: int
    sparsity: float
    encoding: str
    bytes_encoded: int
    encode_seconds: float
    shake_up: bool


class ThresholdCompressor:
    """Error-feedback threshold compression of one worker's flattened update vector.

    ``residual`` starts at zeros. Each :meth:`compress` adds the update to it, encodes the
    elements with ``|r| >= tau`` as ``±tau`` (subtracting them in place), optionally clips
    it, and returns a wire frame. Shake-up steps encode with ``tau * shake_up.factor`` and are
    not reported to ``threshold.observe`` (their sparsity says nothing about tau).
    """

    def __init__(
        self,
        num_elements: int,
        threshold: ThresholdAlgorithm,
        *,
        shake_up: ShakeUp | None = None,
        clipping: ResidualClipping | None = None,
        job_id: int = 0,
        rank: int = 0,
    ) -> None:
        if (
            isinstance(num_elements, bool)
            or not isinstance(num_elements, (int, np.integer))
            or not 0 <= num_elements < 2**31
        ):
            raise ConfigurationError(
                f"num_elements must be an integer in [0, 2**31), got {num_elements!r}"
            )
        if not isinstance(threshold, ThresholdAlgorithm):
            raise ConfigurationError(
                f"threshold must be a ThresholdAlgorithm, got {type(threshold).__name__}"
            )
        if shake_up is not None and not isinstance(shake_up, ShakeUp):
            raise ConfigurationError(f"shake_up must be a ShakeUp, got {shake_up!r}")
        if clipping is not None and not isinstance(clipping, ResidualClipping):
            raise ConfigurationError(f"clipping must be a ResidualClipping, got {clipping!r}")
        for name, value, limit in (("job_id", job_id, 2**64), ("rank", rank, 2**32)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise ConfigurationError(
                    f"{name} must be an integer in [0, {limit}), got {value!r}"
                )
        self.num_elements = int(num_elements)
        self.threshold = threshold
        self.shake_up = shake_up
        self.clipping = clipping
        self.job_id = job_id
        self.rank = rank
        self.residual = np.zeros(self.num_elements, np.float32)

    def _check(self, name: str, array: object) -> np.ndarray:
        if (
            not isinstance(array, np.ndarray)
            or array.dtype != np.float32
            or array.shape != (self.num_elements,)
        ):
            got = (
                f"{array.dtype} array of shape {array.shape}"
                if isinstance(array, np.ndarray)
                else type(array).__name__
            )
            raise ConfigurationError(
                f"{name} must be a float32 array of shape ({self.num_elements},), got {got}"
            )
        return array

    def compress(self, update: np.ndarray, step: int) -> tuple[bytes, EncodingStats]:
        """Add ``update`` to the residual, encode it, and return ``(frame, stats)``."""
        self._check("update", update)
        started = time.perf_counter()
        shake = self.shake_up is not None and self.shake_up.due(step)
        if self.threshold.uses_residual:
            np.add(self.residual, update, out=self.residual)
            tau = self.threshold.select(self.residual, step)
            add = None
        else:
            tau = self.threshold.select(self.residual, step)
            add = update  # fused into the encode sweep
        encode_tau = tau * self.shake_up.factor if shake and self.shake_up else tau
        encoded = threshold_encode(self.residual, encode_tau, add=add)
        if self.clipping is not None and self.clipping.due(step):
            bound = np.float32(self.clipping.factor) * np.float32(tau)
            if np.isfinite(bound):
                np.clip(self.residual, -bound, bound, out=self.residual)
        return self._finish_frame(encoded, step, shake, started)

    def _finish_frame(
        self, encoded: EncodedUpdate, step: int, shake: bool, started: float
    ) -> tuple[bytes, EncodingStats]:
        """Feed the threshold algorithm, frame the message, and measure (shared by every
        encoder: a shake-up step's sparsity does not steer the threshold)."""
        if not shake:
            self.threshold.observe(encoded.nnz, self.num_elements)
        frame = pack_frame(encoded, job_id=self.job_id, rank=self.rank, step=step)
        stats = EncodingStats(
            step=step,
            tau=encoded.tau,
            nnz=encoded.nnz,
            num_elements=self.num_elements,
            sparsity=encoded.nnz / self.num_elements if self.num_elements else 0.0,
            encoding="sparse" if encoded.encoding is Encoding.SPARSE else "bitmap",
            bytes_encoded=len(frame),
            encode_seconds=time.perf_counter() - started,
            shake_up=shake,
        )
        return frame, stats

    def decompress_sum(
        self, frames: Sequence[bytes | memoryview], step: int, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Sum all ranks' frames (``frames[i]`` from rank ``i``) into ``out`` (zeroed first).

        Frames are validated and decoded in rank order, so the float32 result is identical on
        every worker. Raises :class:`CommunicationError` for a bad frame (naming its rank).
        """
        if out is None:
            out = np.zeros(self.num_elements, np.float32)
        else:
            self._check("out", out)
            out.fill(0)
        world_size = len(frames)
        for position, frame in enumerate(frames):
            header, payload = unpack_frame(
                frame,
                job_id=self.job_id,
                num_elements=self.num_elements,
                world_size=world_size,
                step=step,
            )
            if header.rank != position:
                raise CommunicationError(
                    f"bad frame at position {position}: rank expected {position}, got {header.rank}"
                )
            try:
                decode_into(header.encoding, payload, self.num_elements, header.tau, out)
            except CommunicationError as exc:
                raise CommunicationError(f"bad frame from rank {position}: {exc}") from None
        return out
