"""Threshold algorithms (how tau is chosen each step), the shake-up schedule, and residual
post-processors (what happens to the residual after each encode; clipping is one).

Every class is a Keras-style config object: ``get_config()`` returns its constructor
arguments and ``from_config(config)`` rebuilds it; :func:`threshold_to_config` /
:func:`threshold_from_config` add and read a ``"class_name"`` key. Bad parameters raise
:class:`sparkdl.errors.ConfigurationError` naming the parameter and its value. What changes
while training (tau) is the algorithm's *state*: ``get_state()`` / ``set_state(state)``, a
flat dict of Python numbers, saved per rank with the residual.

The default initial tau of every algorithm is 1e-3 (DL4J: "1e-3 is a good value to
start with"), as in the YAML configuration.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from sparkdl.compression.pieces import Pieces, block_view
from sparkdl.errors import ConfigurationError

_T = TypeVar("_T")

__all__ = [
    "DEFAULT_MIN_ELEMENTS",
    "DEFAULT_TAU",
    "MAX_TAU",
    "MIN_TAU",
    "AdaptiveThreshold",
    "FixedThreshold",
    "ResidualClipping",
    "ResidualPostProcessor",
    "SamplePlan",
    "ShakeUp",
    "TargetSparsityThreshold",
    "ThresholdAlgorithm",
    "block_sample",
    "threshold_from_config",
    "threshold_to_config",
]

#: The initial tau of every threshold algorithm and of the YAML ``training.threshold.initial``.
DEFAULT_TAU = 1e-3

#: The default floor on elements sent per step (``min_elements``) of the adaptive and
#: target-sparsity algorithms: a fixed fraction of a small vector is next to nothing (1 % of
#: a 131-parameter model is one element), so tau never rises while at most this many elements
#: (at most half the vector) pass.
DEFAULT_MIN_ELEMENTS = 32

#: Range every adaptive tau is clamped to.
MIN_TAU = 1e-12
MAX_TAU = 1e6


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise ConfigurationError(f"{name} must be finite, got {value!r}")
    return result


def _positive(name: str, value: Any) -> float:
    result = _number(name, value)
    if result <= 0:
        raise ConfigurationError(f"{name} must be > 0, got {value!r}")
    return result


def _tau(name: str, value: Any) -> float:
    """A tau that survives rounding to float32 as a positive finite number."""
    result = _positive(name, value)
    t = np.float32(result) if result < 3.4e38 else np.float32(np.inf)
    if not (np.isfinite(t) and t > 0):
        raise ConfigurationError(f"{name} must be representable as a float32 > 0, got {value!r}")
    return result


def _fraction(name: str, value: Any) -> float:
    result = _number(name, value)
    if not 0 < result <= 1:
        raise ConfigurationError(f"{name} must be in (0, 1], got {value!r}")
    return result


def _number_or_nan(name: str, value: Any) -> float:
    if isinstance(value, (float, np.floating)) and math.isnan(value):
        return math.nan
    return _number(name, value)


def _check_state(owner: object, state: Any, keys: tuple[str, ...]) -> None:
    """``state`` must be a dict with exactly ``keys`` (one ConfigurationError otherwise)."""
    name = type(owner).__name__
    if not isinstance(state, dict):
        raise ConfigurationError(f"{name} state must be a dict, got {type(state).__name__}")
    if set(state) != set(keys):
        raise ConfigurationError(
            f"{name} state needs the keys {sorted(keys)}, got {sorted(state)}"
        )


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def element_floor(min_elements: int, num_elements: int) -> int:
    """Elements a step may send whatever the sparsity: ``min_elements``, at most half of
    the ``num_elements`` (so tau still selects: sending every element as ±tau would throttle
    the large ones to the smallest)."""
    return min(min_elements, num_elements // 2)


class ThresholdAlgorithm:
    """Chooses the threshold tau for each step from what earlier steps produced.

    The compressor calls :meth:`select` (which defaults to :meth:`threshold`) before encoding
    and :meth:`observe` afterwards with the number of elements sent.
    """

    #: True when :meth:`select` reads the residual (the compressor then adds the update to
    #: the residual before selecting, instead of fusing the add into the encode sweep).
    uses_residual: ClassVar[bool] = False

    def threshold(self, step: int) -> float:
        """Tau to use at ``step``."""
        raise NotImplementedError

    def select(self, residual: np.ndarray, step: int) -> float:
        """Tau for ``step`` given the residual about to be encoded; default :meth:`threshold`."""
        return self.threshold(step)

    def select_pieces(self, residual: Pieces, step: int) -> float:
        """:meth:`select` for a residual held in pieces: by default on their concatenation
        (a copy) when :attr:`uses_residual`, else without reading it."""
        if self.uses_residual:
            return self.select(residual.concatenate(), step)
        return self.select(np.zeros(0, np.float32), step)

    def observe(self, nnz: int, num_elements: int) -> None:
        """Record that the last step sent ``nnz`` of ``num_elements`` elements."""

    def get_state(self) -> dict[str, float | int]:
        """What changed since construction (e.g. the current tau), as Python numbers."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output (a checkpoint of this rank)."""
        _check_state(self, state, ())

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-compatible."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ThresholdAlgorithm:
        """Rebuild from :meth:`get_config` output."""
        return _construct(cls, config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


class FixedThreshold(ThresholdAlgorithm):
    """The same tau every step."""

    def __init__(self, tau: float) -> None:
        self.tau = _tau("tau", tau)

    def threshold(self, step: int) -> float:
        return self.tau

    def get_config(self) -> dict[str, Any]:
        return {"tau": self.tau}


class AdaptiveThreshold(ThresholdAlgorithm):
    """DL4J's AdaptiveThresholdAlgorithm: keep the sparsity inside a target band.

    Tau starts at ``initial`` (default 1e-3, as in the YAML configuration). After a step whose
    sparsity (``nnz / num_elements``) was below ``min_sparsity`` (too few elements sent) tau
    is multiplied by ``decay`` (< 1, so it shrinks; default ``0.5 ** (1 / 20)``: halved in 20
    steps, DL4J's default; YAML ``training.threshold.decay``); above ``max_sparsity`` it is
    divided by ``decay``; inside the band it stays. A floor keeps small models from
    starving: tau never grows while at most ``min_elements`` elements (at most half the
    vector; default :data:`DEFAULT_MIN_ELEMENTS`, 0 disables it) passed, however high the
    sparsity. Tau is clamped to ``[MIN_TAU, MAX_TAU]``. An empty vector
    (``num_elements == 0``) changes nothing. Each rank adapts its own tau from its own
    messages: the state (``tau``, ``last_sparsity``) is per rank.
    """

    def __init__(
        self,
        initial: float = DEFAULT_TAU,
        min_sparsity: float = 1e-4,
        max_sparsity: float = 1e-2,
        decay: float = 0.5 ** (1 / 20),
        min_elements: int = DEFAULT_MIN_ELEMENTS,
    ) -> None:
        self.initial = _tau("initial", initial)
        self.min_elements = _count("min_elements", min_elements)
        self.min_sparsity = _fraction("min_sparsity", min_sparsity)
        self.max_sparsity = _fraction("max_sparsity", max_sparsity)
        if self.min_sparsity > self.max_sparsity:
            raise ConfigurationError(
                f"min_sparsity ({min_sparsity!r}) must be <= max_sparsity ({max_sparsity!r})"
            )
        self.decay = _number("decay", decay)
        if not 0 < self.decay < 1:
            raise ConfigurationError(f"decay must be in (0, 1), got {decay!r}")
        self.tau = min(max(self.initial, MIN_TAU), MAX_TAU)
        self.last_sparsity: float | None = None

    def threshold(self, step: int) -> float:
        return self.tau

    def observe(self, nnz: int, num_elements: int) -> None:
        if num_elements <= 0:
            return
        sparsity = nnz / num_elements
        self.last_sparsity = sparsity
        if sparsity < self.min_sparsity:
            self.tau = max(self.tau * self.decay, MIN_TAU)
        elif sparsity > self.max_sparsity and nnz > element_floor(
            self.min_elements, num_elements
        ):
            self.tau = min(self.tau / self.decay, MAX_TAU)

    def get_state(self) -> dict[str, float | int]:
        last = self.last_sparsity
        return {"tau": self.tau, "last_sparsity": math.nan if last is None else last}

    def set_state(self, state: dict[str, Any]) -> None:
        _check_state(self, state, ("tau", "last_sparsity"))
        self.tau = _tau("tau", state["tau"])
        last = _number_or_nan("last_sparsity", state["last_sparsity"])
        self.last_sparsity = None if math.isnan(last) else last

    def get_config(self) -> dict[str, Any]:
        return {
            "initial": self.initial,
            "min_sparsity": self.min_sparsity,
            "max_sparsity": self.max_sparsity,
            "decay": self.decay,
            "min_elements": self.min_elements,
        }


#: Smallest sample that :func:`_largest` narrows down first.
_SUBSET_MIN = 1 << 14


def _largest(sample: np.ndarray, passing: int) -> np.float32:
    """``np.partition(sample, kth)[kth]`` with ``kth = sample.size - passing`` (the
    ``passing``-th largest, NaN counting as largest), found in a small subset when it can be.

    A bound from a 1-in-16 subsample, about where ``2 * passing`` of ``sample`` lie above,
    keeps the elements that are not below it (every NaN too): they are the top of the sorted
    order, so when there are at least ``passing`` of them the wanted element is among them,
    at the same rank from the top. Otherwise the whole sample is partitioned."""
    size = sample.size
    kth = size - passing
    if size >= _SUBSET_MIN and 128 * passing <= size:  # else no faster
        sub = sample[::16].copy()
        top = sub.size - (2 * passing + 15) // 16 - 1
        bound = np.partition(sub, top)[top]
        kept = sample[np.logical_not(np.less(sample, bound))]
        if kept.size >= passing:
            kth = kept.size - passing
            return np.partition(kept, kth)[kth]  # type: ignore[no-any-return]
    return np.partition(sample, kth)[kth]  # type: ignore[no-any-return]


class SamplePlan(NamedTuple):
    """``blocks`` blocks of ``width`` consecutive elements, the first at ``offset``, one every
    ``period`` elements; ``passing``: how many of the sample should pass tau."""

    offset: int
    period: int
    width: int
    blocks: int
    passing: int


def block_sample(vector: np.ndarray, plan: SamplePlan) -> np.ndarray:
    """A copy of the elements ``plan`` samples from the 1-D ``vector``, block after block."""
    blocks = block_view(vector, plan.offset, plan.period, plan.width, plan.blocks)
    return blocks.reshape(-1)  # a copy: the blocks are not contiguous


class TargetSparsityThreshold(ThresholdAlgorithm):
    """Pick tau so that about ``sparsity * n`` elements of the residual pass.

    :meth:`select` takes a sample of ``|residual|`` in evenly spaced blocks of
    :attr:`BLOCK` consecutive elements, one block every ``BLOCK * stride`` elements (one
    element in ``stride`` in all: at least 65,536 elements, and enough that the target is
    about 64 of them; the whole vector when that is most of it; the blocks' start moves with
    the step), and returns its ``(1 - sparsity)`` quantile via ``np.partition``. Blocks, not
    single elements at a stride, so the sample reads one ``stride``-th of the vector's
    memory, not all of it. If that quantile is 0 (an almost-empty residual) the previous tau is
    kept. The first tau before any residual is seen is ``initial`` (default 1e-3). The
    target is at least ``min_elements`` elements (at most half the vector; default
    :data:`DEFAULT_MIN_ELEMENTS`, 0 disables it), so a small model is not starved.
    """

    uses_residual: ClassVar[bool] = True
    _MIN_SAMPLE = 1 << 16
    #: Consecutive elements per sampled block: 128 bytes, the pair of cache lines a miss
    #: brings in anyway (measured on the scaling model's 1.09M-element residual, cold: the
    #: same 65,536-element sample in blocks of 16 took 201 µs, of 32 122 µs, of 64 114 µs;
    #: the passing count's spread around the target was the same, 12 %).
    BLOCK = 32

    def __init__(
        self,
        sparsity: float = 1e-3,
        initial: float = DEFAULT_TAU,
        min_elements: int = DEFAULT_MIN_ELEMENTS,
    ) -> None:
        self.sparsity = _fraction("sparsity", sparsity)
        self.initial = _tau("initial", initial)
        self.min_elements = _count("min_elements", min_elements)
        self.tau = min(max(self.initial, MIN_TAU), MAX_TAU)

    def threshold(self, step: int) -> float:
        return self.tau

    def select(self, residual: np.ndarray, step: int) -> float:
        n = residual.size
        if n == 0:
            return self.tau
        plan = self.sample_plan(n, step)
        sample = np.abs(block_sample(residual, plan))
        return self.accept_quantile(float(_largest(sample, plan.passing)))

    def select_pieces(self, residual: Pieces, step: int) -> float:
        """:meth:`select` on the same sample, taken from the pieces."""
        if residual.size == 0:
            return self.tau
        plan = self.sample_plan(residual.size, step)
        sample = np.abs(residual.blocks(plan.offset, plan.period, plan.width, plan.blocks))
        return self.accept_quantile(float(_largest(sample, plan.passing)))

    def sample_plan(self, n: int, step: int) -> SamplePlan:
        """The sample of an ``n``-element residual that :meth:`select` takes at ``step``,
        and how many of its elements should pass."""
        want = max(self._MIN_SAMPLE, math.ceil(64 / self.sparsity))
        stride = n // want
        if stride < 2:  # the whole vector
            plan = SamplePlan(0, max(n, 1), n, 1 if n else 0, 0)
        else:
            width = self.BLOCK
            period = width * stride
            offset = (step * 7919) % period
            plan = SamplePlan(offset, period, width, (n - offset - width) // period + 1, 0)
        fraction = max(self.sparsity, element_floor(self.min_elements, n) / n)
        return plan._replace(passing=max(1, round(fraction * plan.blocks * plan.width)))

    def accept_quantile(self, value: float) -> float:
        """Make the sample quantile ``value`` the new tau (clamped), unless it is 0 or not
        finite; returns tau."""
        if math.isfinite(value) and value > 0:
            self.tau = min(max(value, MIN_TAU), MAX_TAU)
        return self.tau

    def get_state(self) -> dict[str, float | int]:
        return {"tau": self.tau}

    def set_state(self, state: dict[str, Any]) -> None:
        _check_state(self, state, ("tau",))
        self.tau = _tau("tau", state["tau"])

    def get_config(self) -> dict[str, Any]:
        return {
            "sparsity": self.sparsity,
            "initial": self.initial,
            "min_elements": self.min_elements,
        }


class _Config:
    """Dataclass config helpers shared by the schedules."""

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-compatible."""
        config: dict[str, Any] = asdict(self)  # type: ignore[call-overload]
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        """Rebuild from :meth:`get_config` output."""
        return _construct(cls, config)


def _construct(cls: type[_T], config: dict[str, Any]) -> _T:
    """``cls(**config)``, a wrong or missing key being one ConfigurationError."""
    try:
        return cls(**config)
    except TypeError as exc:
        raise ConfigurationError(f"bad {cls.__name__} config {config!r}: {exc}") from None


@dataclass
class ShakeUp(_Config):
    """Every ``frequency`` steps (steps ``frequency, 2*frequency, ...``; 0 = never, the
    default) encode with ``tau * factor`` to flush residue that never reaches tau.

    The default ``factor`` here is 0.1; DL4J's shake-up encodes at ``tau / 3`` (``factor=1/3``).
    Both are settable from YAML (``training.shake_up.frequency`` / ``.factor``).
    """

    frequency: int = 0
    factor: float = 0.1

    def __post_init__(self) -> None:
        self.frequency = _count("frequency", self.frequency)
        self.factor = _fraction("factor", self.factor)

    def due(self, step: int) -> bool:
        """Whether ``step`` is a shake-up step."""
        return self.frequency > 0 and step > 0 and step % self.frequency == 0


class ResidualPostProcessor:
    """Changes the residual after each encode (DL4J's ``ResidualPostProcessor``).

    The compressor's memory calls :meth:`apply` after every encode with the step's tau (the
    un-shaken one). Host memories pass the numpy residual; the device memory runs
    :class:`ResidualClipping` on the device and any other processor on a host copy of the
    residual (correct, but a copy of the whole residual each time). A new processor is one
    subclass with ``apply`` and ``get_config``.
    """

    def apply(self, residual: np.ndarray, tau: float, step: int) -> None:
        """Change ``residual`` (float32, in place) after the encode of ``step`` at ``tau``."""
        raise NotImplementedError

    def apply_pieces(self, residual: Pieces, tau: float, step: int) -> None:
        """:meth:`apply` to a residual held in pieces; by default on a copy of the whole
        vector, written back (override for a processor that works element by element)."""
        whole = residual.concatenate()
        self.apply(whole, tau, step)
        residual.write(0, whole)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments, JSON-compatible."""
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        """Rebuild from :meth:`get_config` output."""
        return _construct(cls, config)


@dataclass
class ResidualClipping(_Config, ResidualPostProcessor):
    """Every ``frequency`` steps (steps ``frequency, 2*frequency, ...``) clip the residual to
    ``±factor * tau`` after encoding; ``factor == 0`` or ``frequency == 0`` disables it.
    DL4J's default (and this one): ``±5 tau`` every 5 steps."""

    factor: float = 5.0
    frequency: int = 5

    def __post_init__(self) -> None:
        self.factor = _number("factor", self.factor)
        if self.factor < 0:
            raise ConfigurationError(f"factor must be >= 0, got {self.factor!r}")
        self.frequency = _count("frequency", self.frequency)

    def due(self, step: int) -> bool:
        """Whether the residual is clipped after ``step``."""
        return self.factor > 0 and self.frequency > 0 and step > 0 and step % self.frequency == 0

    def bound(self, tau: float) -> np.float32 | None:
        """The float32 clipping bound ``fl32(factor) * fl32(tau)``; None when not finite
        (then nothing is clipped)."""
        bound = np.float32(self.factor) * np.float32(tau)
        return bound if np.isfinite(bound) else None

    def apply(self, residual: np.ndarray, tau: float, step: int) -> None:
        if not self.due(step):
            return
        bound = self.bound(tau)
        if bound is not None:
            np.clip(residual, -bound, bound, out=residual)

    def apply_pieces(self, residual: Pieces, tau: float, step: int) -> None:
        for piece in residual.arrays:  # element by element: each piece alone
            self.apply(piece, tau, step)


_CLASSES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        FixedThreshold,
        AdaptiveThreshold,
        TargetSparsityThreshold,
        ShakeUp,
        ResidualClipping,
    )
}


def threshold_to_config(
    obj: ThresholdAlgorithm | ShakeUp | ResidualPostProcessor,
) -> dict[str, Any]:
    """``{"class_name": ..., "config": obj.get_config()}``."""
    name = type(obj).__name__
    if _CLASSES.get(name) is not type(obj):
        raise ConfigurationError(f"cannot serialise {name}: not a known threshold class")
    return {"class_name": name, "config": obj.get_config()}


def threshold_from_config(config: dict[str, Any]) -> Any:
    """Inverse of :func:`threshold_to_config`. Also accepts the flat form
    ``{"class_name": ..., **constructor_args}``."""
    if not isinstance(config, dict) or "class_name" not in config:
        raise ConfigurationError(f"threshold config needs a 'class_name' key, got {config!r}")
    name = config["class_name"]
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ConfigurationError(
            f"unknown threshold class_name {name!r}; expected one of {sorted(_CLASSES)}"
        )
    if "config" in config:
        args = config["config"]
        if not isinstance(args, dict):
            raise ConfigurationError(f"threshold 'config' must be a dict, got {args!r}")
    else:
        args = {k: v for k, v in config.items() if k != "class_name"}
    return cls.from_config(dict(args))
