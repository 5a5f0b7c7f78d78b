"""The protocol every mergeable evaluation follows, and the registry the configuration uses.

An evaluation is fed batches on the executors with :meth:`~BaseEvaluation.eval`, travels to
the driver as its JSON-safe :meth:`~BaseEvaluation.to_dict`, and partial evaluations are
combined with :meth:`~BaseEvaluation.merge`. Merging is exact: the merged figures equal those
of one evaluation over all the data. ``evaluation.metrics`` in a job configuration names
evaluations by their registered ``kind``, with an optional argument after a colon
(``top_n:5``, ``roc:100``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from sparkdl.errors import ConfigurationError, DataError, unknown_name


class BaseEvaluation(ABC):
    """A mergeable evaluation: ``eval`` batches, ``merge`` parts, read ``stats()``."""

    kind: ClassVar[str]
    #: Sizes a serialized form declares: key → (the list it sizes, the most it may declare
    #: without that list). :func:`evaluation_from_dict` checks them before building.
    sizes: ClassVar[dict[str, tuple[str, int]]] = {}

    @abstractmethod
    def eval(self, y_true: Any, y_pred: Any) -> BaseEvaluation:
        """Add a batch of labels and model outputs; returns ``self``."""

    @abstractmethod
    def merge(self, other: BaseEvaluation) -> BaseEvaluation:
        """Add another evaluation of the same configuration into this one; returns ``self``."""

    @abstractmethod
    def stats(self) -> str:
        """A readable multi-line report."""

    @abstractmethod
    def summary(self) -> dict[str, float]:
        """The headline figures, by name (what ``metrics.json`` and the report show)."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict holding the configuration and the accumulated state."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> BaseEvaluation:
        """Rebuild from :meth:`to_dict`."""

    def empty_copy(self) -> BaseEvaluation:
        """An evaluation with this one's configuration and no data."""
        return self.from_dict(self.config())

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The configuration part of :meth:`to_dict` (no accumulated state)."""

    def _check_mergeable(self, other: BaseEvaluation) -> None:
        if type(other) is not type(self) or other.config() != self.config():
            raise ValueError(
                f"cannot merge {type(other).__name__}({other.config()}) into "
                f"{type(self).__name__}({self.config()})"
            )

    def __repr__(self) -> str:
        figures = ", ".join(f"{k}={v:.4f}" for k, v in list(self.summary().items())[:4])
        return f"{type(self).__name__}({figures})"


E = TypeVar("E", bound=type[BaseEvaluation])

# kind → factory(argument or None, DataInfo) → evaluation
_FACTORIES: dict[str, Callable[[str | None, DataInfo], BaseEvaluation]] = {}
_CLASSES: dict[str, type[BaseEvaluation]] = {}


class DataInfo:
    """What a factory needs to know about the labels: class names (classification) or the
    number of regression targets, and optional output column names."""

    def __init__(self, classes: Sequence[str] = (), label_size: int = 1,
                 columns: Sequence[str] | None = None) -> None:
        self.classes = [str(c) for c in classes]
        self.label_size = int(label_size)
        self.columns = list(columns) if columns is not None else None


def register(kind: str, factory: Callable[[str | None, DataInfo], BaseEvaluation]
             ) -> Callable[[E], E]:
    """Class decorator: register an evaluation class under ``kind`` with its factory."""

    def decorate(cls: E) -> E:
        cls.kind = kind
        _FACTORIES[kind] = factory
        _CLASSES[kind] = cls
        return cls

    return decorate


def alias(kind: str, factory: Callable[[str | None, DataInfo], BaseEvaluation]) -> None:
    """Register one more configuration name whose factory builds a registered class."""
    _FACTORIES[kind] = factory


def registered_kinds() -> list[str]:
    """The names ``evaluation.metrics`` accepts."""
    return sorted(_FACTORIES)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"top_n:5"`` → ``("top_n", "5")``; an unknown kind is a :class:`ConfigurationError`."""
    kind, sep, argument = str(spec).strip().partition(":")
    if kind not in _FACTORIES:
        raise ConfigurationError(
            f"evaluation.metrics: unknown evaluation {spec!r}; use one of {registered_kinds()}"
        )
    return kind, (argument.strip() if sep else None)


# Label kinds a spec is tried against when no data is at hand: two classes, three classes, one
# regression target. A spec that none of them takes has a bad argument (``top_n:0``).
_NEUTRAL_INFOS = (DataInfo(["0", "1"]), DataInfo(["0", "1", "2"]), DataInfo(label_size=1))


def check_spec(spec: str) -> None:
    """Check ``spec`` without data: a known kind and an argument it takes
    (:class:`ConfigurationError` naming the spec and what is wrong)."""
    first: ConfigurationError | None = None
    for info in _NEUTRAL_INFOS:
        try:
            create_evaluation(spec, info)
            return
        except ConfigurationError as exc:
            first = first or exc
    assert first is not None
    raise first


def create_evaluation(spec: str, info: DataInfo) -> BaseEvaluation:
    """Build the evaluation ``spec`` names (``kind`` or ``kind:argument``) for data ``info``."""
    kind, argument = parse_spec(spec)
    try:
        return _FACTORIES[kind](argument, info)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"evaluation.metrics: {spec!r}: {exc}") from None


def evaluation_from_dict(data: dict[str, Any], *, source: str = "evaluation") -> BaseEvaluation:
    """Rebuild any registered evaluation from its :meth:`~BaseEvaluation.to_dict` form."""
    kind = data.get("kind", "classification") if isinstance(data, dict) else None
    if kind not in _CLASSES:
        raise unknown_name("evaluation kind", kind, _CLASSES, where=source, error=DataError)
    try:
        check_sizes(_CLASSES[kind], data)
        return _CLASSES[kind].from_dict(data)
    except KeyError as exc:
        raise DataError(f"{source}: not a {kind} evaluation: no key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise DataError(f"{source}: not a {kind} evaluation: {exc}") from None


def check_sizes(cls: type[BaseEvaluation], data: dict[str, Any]) -> None:
    """Check the sizes a serialized ``cls`` declares before anything of that size is
    allocated: each a positive integer, equal to the length of the list it sizes when that is
    present, else within the class's limit; so a small file never asks for a large allocation
    (``ValueError`` naming the key)."""
    for key, (sized_by, limit) in cls.sizes.items():
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key!r} must be a positive integer, got {value!r}")
        if sized_by in data:
            present = data[sized_by]
            length = len(present) if isinstance(present, list) else None
            if length != value:
                holds = f"{length} entries" if length is not None else type(present).__name__
                raise ValueError(f"{key!r} is {value} but {sized_by!r} holds {holds}")
        elif value > limit:
            raise ValueError(f"{key!r} is {value}; more than {limit} needs the {sized_by!r} "
                             f"it sizes")


def positive_int(argument: str | None, default: int, what: str) -> int:
    """A factory's integer argument (``top_n:5``), checked."""
    if argument is None:
        return default
    try:
        value = int(argument)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {argument!r}") from None
    if value < 1:
        raise ValueError(f"{what} must be at least 1, got {value}")
    return value


def as_2d(values: Any, width: int | None = None) -> Any:
    """A batch as a float64 ``(rows, columns)`` array (a 1-D batch is one column)."""
    array = np.asarray(values, dtype=np.float64)
    array = array.reshape(len(array), -1) if array.ndim != 1 else array[:, None]
    if width is not None and array.shape[1] != width:
        raise DataError(f"expected {width} values per row, got {array.shape[1]}")
    return array
