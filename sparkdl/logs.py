"""sparkdl's own logger, and TensorFlow imported without its C++ start-up banner.

TensorFlow's native libraries print their start-up lines (absl's "All log messages before
absl::InitializeLog()", oneDNN, cpu_feature_guard, ...) straight to file descriptor 2 while
``import tensorflow`` runs, before ``TF_CPP_MIN_LOG_LEVEL`` can act. :func:`quiet_tensorflow`
runs that import with descriptor 2 captured, drops the known banner lines and writes
everything else back to stderr, so no real error is hidden.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

LOGGER = "sparkdl"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

#: TensorFlow's start-up lines that say nothing a user can act on.
TF_BANNER = re.compile(
    r"All log messages before absl::InitializeLog\(\)"
    r"|oneDNN custom operations are on"
    r"|cpu_feature_guard|To enable the following instructions"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|computation placer already registered"
    r"|TF-TRT Warning|Could not find cuda drivers"
    r"|This TensorFlow binary is optimized"
)


def configure_logging(level: str = "INFO") -> logging.Logger:
    """Give the ``sparkdl`` logger one stderr handler at ``level`` (the root logger and
    other libraries' loggers are left alone)."""
    name = str(level).upper()
    if name not in LEVELS:
        from sparkdl.errors import ConfigurationError

        raise ConfigurationError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(name)
    if not any(getattr(h, "_sparkdl", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        handler._sparkdl = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.propagate = False
    return logger


def quiet_tensorflow(load: bool = True) -> None:
    """Set ``TF_CPP_MIN_LOG_LEVEL=2`` unless the environment sets it (processes started from
    this one afterwards inherit it); with ``load``, also import TensorFlow (once per process)
    without its native start-up banner."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not load or "tensorflow" in sys.modules:
        return
    with filtered_stderr(TF_BANNER):
        import tensorflow  # noqa: F401


@contextlib.contextmanager
def filtered_stderr(pattern: re.Pattern[str]) -> Iterator[None]:
    """Capture file descriptor 2 (native and Python writes alike) for the block; afterwards
    write back every captured line that does not match ``pattern``."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a notebook's stream: nothing to do
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines(True)
                    if not pattern.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
