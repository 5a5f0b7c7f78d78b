"""The one exception hierarchy of sparkdl."""

from __future__ import annotations

from collections.abc import Iterable


class SparkDLError(Exception):
    """Base class of every error sparkdl raises on purpose."""


class ConfigurationError(SparkDLError, ValueError):
    """A configuration key is unknown, missing, or holds a value of the wrong type or range."""


class DataError(SparkDLError):
    """Input data is missing, corrupt, or does not match its declared schema."""


class CommunicationError(SparkDLError):
    """A collective failed: a peer is dead, silent, unauthenticated, or sent a bad frame."""


class TrainingError(SparkDLError):
    """Training cannot continue: a non-finite loss or update, or a failed worker stage."""


class NonFiniteError(TrainingError):
    """A vector that must be finite (an update, a residual) holds NaN or an infinity."""


def unknown_name(what: str, name: object, known: Iterable[object], *, where: str = "",
                 error: type[SparkDLError] = ConfigurationError) -> SparkDLError:
    """The error for a name a registry does not hold, worded once for every registry:
    ``"<where>: unknown <what> '<name>'; known: a, b, c"`` (the known names sorted)."""
    listed = ", ".join(sorted(str(k) for k in known))
    return error(f"{where}{': ' if where else ''}unknown {what} {name!r}; known: {listed}")
