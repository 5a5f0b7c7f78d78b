"""Catch a fork of the pytest process once native libraries may have started threads.

A child forked while a TensorFlow, gRPC or JVM-gateway thread holds an abseil mutex aborts on
its first use of it, at random and more often on a loaded machine. Tests start processes with
the ``spawn`` or ``forkserver`` context instead (``tests/unit/_comm_harness.py``). This module
registers an ``os.register_at_fork`` hook that records every fork taken while one of
:data:`THREADED_MODULES` is imported; ``tests/conftest.py`` fails the test that did it.

``subprocess`` is exempt: its child only calls ``exec`` (or a ``preexec_fn``, as pyspark's
gateway launcher does) and never touches those libraries' locks.
"""

from __future__ import annotations

import os
import sys
import traceback

# Top-level modules whose import starts native threads (thread pools, gRPC pollers, the
# py4j gateway's threads).
THREADED_MODULES: list[str] = ["tensorflow", "grpc", "py4j", "jax", "torch"]

offences: list[str] = []


def _from_subprocess() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if os.path.basename(frame.f_code.co_filename) == "subprocess.py":
            return True
        frame = frame.f_back
    return False


def _before_fork() -> None:
    loaded = [name for name in THREADED_MODULES if name in sys.modules]
    if loaded and not _from_subprocess():
        where = "".join(traceback.format_stack(limit=8)[:-1])
        offences.append(f"fork() with {', '.join(loaded)} imported, from:\n{where}")


def install() -> None:
    """Register the hook (once per process)."""
    if not getattr(install, "done", False):
        os.register_at_fork(before=_before_fork)
        install.done = True  # type: ignore[attr-defined]
