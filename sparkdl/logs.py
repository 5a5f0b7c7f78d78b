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
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

LOGGER = "sparkdl"
#: How long :func:`tensorflow_imported_meanwhile` waits for the import after its block.
IMPORT_TIMEOUT_S = 600.0
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

_Started = TypeVar("_Started")

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


def interactive() -> bool:
    """Whether output goes to a person: standard output is a terminal, or a Jupyter-style
    kernel runs this code (an imported ``ipykernel`` module alone says nothing: libraries
    import it)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is not None:
        return True
    return bool(getattr(sys.stdout, "isatty", lambda: False)())


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
def tensorflow_imported_meanwhile() -> Iterator[int | None]:
    """Import TensorFlow as :func:`quiet_tensorflow` does, on a helper thread while the block
    runs; at the block's end wait for it and raise its error, if any.

    The import's banner filter captures descriptor 2 meanwhile, so a child process the block
    starts would write its stderr into the capture: the block gets a duplicate of the real
    descriptor 2 to hand to such a child (``None`` where nothing is captured: TensorFlow
    already loaded, or a stderr without a descriptor, as in a notebook).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        yield None
        return
    try:
        real_stderr: int | None = os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        real_stderr = None
    errors: list[BaseException] = []

    def load() -> None:
        try:
            quiet_tensorflow()
        except BaseException as exc:  # raised on the caller's thread
            errors.append(exc)

    helper = threading.Thread(target=load, name="sparkdl-import-tensorflow", daemon=True)
    helper.start()
    try:
        yield real_stderr
    finally:
        helper.join(IMPORT_TIMEOUT_S)
        if real_stderr is not None:
            os.close(real_stderr)
    if helper.is_alive():
        raise TimeoutError(f"TensorFlow did not finish importing in {IMPORT_TIMEOUT_S:.0f} s")
    if errors:
        raise errors[0]


def started_while_tensorflow_imports(
    start: Callable[[int | None], _Started], stop: Callable[[_Started], object]
) -> _Started:
    """``start(stderr)`` inside :func:`tensorflow_imported_meanwhile` (``stderr``: the real
    descriptor 2, or None); its result, or its error. Where the import fails after ``start``
    returned, ``stop(result)`` undoes it first (a started Spark session, an opened
    communicator), then the import's error is raised."""
    started: list[_Started] = []
    try:
        with tensorflow_imported_meanwhile() as stderr:
            started.append(start(stderr))
    except BaseException:
        if started:
            stop(started[0])
        raise
    return started[0]


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
