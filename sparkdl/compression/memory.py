"""Error-feedback memory (GRACE's *Memory*): the residual one worker has not sent yet.

A threshold compressor adds each update to its memory's residual, encodes (and subtracts)
the elements that reach tau, and lets the memory post-process what is left (e.g. clip it).
:class:`HostMemory` keeps the residual as a numpy float32 vector; the device memory
(``sparkdl.training.exchanges.device_encoding.DeviceMemory``) keeps it in a TensorFlow variable on
the
model's device. Both have the same state: ``{"residual": float32 vector}``.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from sparkdl.compression.pieces import Pieces
from sparkdl.compression.threshold import ResidualPostProcessor, _check_state
from sparkdl.errors import ConfigurationError

__all__ = ["HostMemory", "Memory", "PiecewiseMemory"]


class Memory(abc.ABC):
    """The residual of ``num_elements`` float32 elements, zeros at first, with an optional
    :class:`~sparkdl.compression.threshold.ResidualPostProcessor` applied after each encode.
    """

    #: Whether the residual lives on a TensorFlow device (the compressor then takes the
    #: update as a tensor and the exchange never copies it to the host).
    on_device: ClassVar[bool] = False
    #: The TensorFlow device string of an on-device memory (None: the host, or TF's default).
    device: str | None = None

    def __init__(
        self, num_elements: int, post_processor: ResidualPostProcessor | None = None
    ) -> None:
        if (
            isinstance(num_elements, bool)
            or not isinstance(num_elements, (int, np.integer))
            or not 0 <= num_elements < 2**31
        ):
            raise ConfigurationError(
                f"num_elements must be an integer in [0, 2**31), got {num_elements!r}"
            )
        if post_processor is not None and not isinstance(post_processor, ResidualPostProcessor):
            raise ConfigurationError(
                f"post_processor must be a ResidualPostProcessor, got {post_processor!r}"
            )
        self.num_elements = int(num_elements)
        self.post_processor = post_processor

    @property
    def residual(self) -> np.ndarray:
        """The residual as numpy (a host memory's vector itself; a device memory's copy)."""
        return self.get_residual()

    @residual.setter
    def residual(self, value: np.ndarray) -> None:
        self.set_residual(value)

    @abc.abstractmethod
    def get_residual(self) -> np.ndarray:
        """A host copy of the residual (float32)."""

    @abc.abstractmethod
    def set_residual(self, value: np.ndarray) -> None:
        """Replace the residual with a float32 vector of length :attr:`num_elements`."""

    @abc.abstractmethod
    def post_process(self, tau: float, step: int) -> None:
        """Apply the post-processor (if any) after the encode of ``step`` at ``tau``."""

    def get_state(self) -> dict[str, Any]:
        """``{"residual": a float32 copy}``."""
        return {"residual": self.get_residual()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output."""
        _check_state(self, state, ("residual",))
        self.set_residual(state["residual"])

    def _checked(self, value: Any) -> np.ndarray:
        array = np.asarray(value)
        if array.dtype != np.float32 or array.shape != (self.num_elements,):
            raise ConfigurationError(
                f"residual must be a float32 array of shape ({self.num_elements},), "
                f"got {array.dtype} array of shape {array.shape}"
            )
        return array


class HostMemory(Memory):
    """The residual as a numpy float32 vector, :attr:`residual` (updated in place)."""

    def __init__(
        self, num_elements: int, post_processor: ResidualPostProcessor | None = None
    ) -> None:
        super().__init__(num_elements, post_processor)
        self._residual = np.zeros(self.num_elements, np.float32)

    @property
    def residual(self) -> np.ndarray:
        """The residual vector itself (the compressor updates it in place)."""
        return self._residual

    @residual.setter
    def residual(self, value: np.ndarray) -> None:
        self.set_residual(value)

    def get_residual(self) -> np.ndarray:
        return self._residual.copy()

    def set_residual(self, value: np.ndarray) -> None:
        self._residual[...] = self._checked(value)

    def post_process(self, tau: float, step: int) -> None:
        if self.post_processor is not None:
            self.post_processor.apply(self.residual, tau, step)

    def compensate(self, update: np.ndarray) -> np.ndarray:
        """GRACE's ``memory.compensate``: add ``update`` to the residual (in place) and return
        the residual, now the update to compress. (The threshold compressor fuses this add
        with its encode pass.)"""
        self._residual += self._checked(update)
        return self._residual

    def update(self, sent: np.ndarray, start: int = 0) -> None:
        """GRACE's ``memory.update``: what was sent of ``residual[start:start + len(sent)]``
        leaves it (the rest is kept back for the next step)."""
        self._residual[start:start + len(sent)] -= sent


class PiecewiseMemory(Memory):
    """A residual held in buffers owned elsewhere, as :class:`~sparkdl.compression.pieces.Pieces`
    (e.g. the variables a model's optimizer adds its update to: gradient sharing's fused
    path). Its owner adds each update to it; the compressor encodes it as it stands
    (``ThresholdCompressor.compress_held``) and post-processes it in place."""

    @abc.abstractmethod
    def pieces(self) -> Pieces:
        """The residual's buffers, writable, valid until the owner's next write to them."""

    def post_process(self, tau: float, step: int) -> None:
        if self.post_processor is not None:
            self.post_processor.apply_pieces(self.pieces(), tau, step)
