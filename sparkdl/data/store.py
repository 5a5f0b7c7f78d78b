"""The run store: DataSet shards written from DataFrames for ``fit`` / ``evaluate`` (Horovod's
Store, DL4J's (Deeplearning4j's) export approach).

``SparkModel.fit(df)`` writes ``df`` once as shards into a store directory (any filesystem URI
the shard writer accepts), named by the DataFrame's :mod:`~sparkdl.data.fingerprint`; fitting
or evaluating the same DataFrame again finds the shards there and reuses them, but only when
the fingerprint is *reusable* (provably the same data). Every fit logs one line, ``reusing
shards URI: why`` or ``writing shards URI: why not reused``.

Shards are shared between processes through **leases**, files under
``ROOT/.sparkdl-leases/KEY/``:

============== ==========================================================================
``use-TOKEN``  a process is using the entry (written when it writes or reuses it; removed
               when it exits)
``keep-TOKEN`` a process asked to keep it (``keep=True``); never removed by sparkdl
``temporary``  the writer did not ask to keep it: the last user may delete it
``retiring-T`` a process is deleting the entry
============== ==========================================================================

At exit (or :meth:`RunStore.cleanup`) a process removes its ``use`` leases; for a temporary
entry it then writes ``retiring-T``, lists the leases and deletes the entry only if no other
``use`` or ``keep`` lease is there. A process about to reuse writes its lease first and then
waits (bounded) while a ``retiring`` file is there: of two processes racing, at least one sees
the other's file, so an entry is never deleted under a process that reuses it. A process that
dies without cleaning up leaves its lease: the entry stays (deleting it is then up to you).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from sparkdl.data.fingerprint import Fingerprint, fingerprint
from sparkdl.data.metadata import METADATA_FILE, join, resolve
from sparkdl.errors import ConfigurationError, DataError

log = logging.getLogger("sparkdl")

LEASES = ".sparkdl-leases"
TEMPORARY = "temporary"
RETIRE_WAIT_S = 60.0  # how long a reuser waits for another process's deletion to finish


class RunStore:
    """A directory of shard sets keyed by fingerprint.

    Args:
        root: URI or path of the store (shared storage on a cluster: ``hdfs://``, ``s3://``, a
            ``file://`` path every executor mounts). ``None``: a temporary directory on the
            driver, which only local masters (executors on the driver's machine) can use.
        keep: keep the shards this store writes or reuses (to reuse them in a later
            process); otherwise the last process using them deletes them when it exits (or
            at :meth:`cleanup`).
    """

    def __init__(self, root: str | None = None, *, keep: bool = False) -> None:
        self._owned_root: str | None = None
        if root is None:
            self._owned_root = tempfile.mkdtemp(prefix="sparkdl-store-")
            root = "file://" + self._owned_root
        elif "://" not in root:
            from pathlib import Path

            root = Path(root).expanduser().resolve().as_uri()
        self.root = root.rstrip("/")
        self.keep = keep
        self.token = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._leased: set[str] = set()  # keys this store holds a lease on
        self._lock = threading.Lock()
        atexit.register(self._at_exit)

    def check_reachable(self, master: str) -> None:
        """A driver-local temporary store works only when executors share the driver's disk."""
        if self._owned_root and not master.startswith("local"):
            raise ConfigurationError(
                f"fitting a DataFrame on master {master!r} needs a store on shared storage: "
                "pass store='hdfs://...' (or s3://, or a file:// path every executor mounts) "
                "or set training.store"
            )

    def shards(self, key: str | Fingerprint, write: Callable[[str], Any]) -> str:
        """The URI of the shards named ``key``; ``write(uri)`` writes them unless the store
        holds them and ``key`` is reusable (a plain string key counts as reusable)."""
        found = key if isinstance(key, Fingerprint) else Fingerprint(key, True, "same key")
        name = found.key
        self._lease(name)
        if found.reusable and not self._wait_unretired(name):
            name = f"{found.key}-{secrets.token_hex(4)}"
            self._lease(name)
            found = Fingerprint(name, False, f"{found.key} is being deleted by another "
                                f"process for over {RETIRE_WAIT_S:.0f} s")
        uri = join(self.root, name)
        fs, path = resolve(uri)
        if found.reusable and _is_file(fs, join(path, METADATA_FILE)):
            log.info("reusing shards %s: %s", uri, found.why)
            return uri
        reason = found.why if not found.reusable else f"no shards in the store yet for {found.why}"
        log.info("writing shards %s: %s", uri, reason)
        try:
            write(uri)
        except DataError:
            # another fit wrote the same shards meanwhile: theirs are as good as ours
            if not (found.reusable and _is_file(fs, join(path, METADATA_FILE))):
                raise
            return uri
        if not self.keep:
            _write(self._lease_dir(name), TEMPORARY)
        return uri

    def cleanup(self) -> None:
        """Give up this store's leases; delete the temporary entries nobody else holds."""
        with self._lock:
            leased, self._leased = self._leased, set()
        if self.keep:
            return
        for key in sorted(leased):
            with contextlib.suppress(Exception):
                self._leave(key)

    # leases ----------------------------------------------------------------------------

    def _lease_dir(self, key: str) -> str:
        return join(self.root, LEASES, key)

    def _lease(self, key: str) -> None:
        """Hold a lease on ``key`` (once per store)."""
        with self._lock:
            if key not in self._leased:
                kind = "keep" if self.keep else "use"
                _write(self._lease_dir(key), f"{kind}-{self.token}")
                self._leased.add(key)

    def _wait_unretired(self, key: str) -> bool:
        """Wait while another process deletes ``key`` (``False`` when that takes longer than
        :data:`RETIRE_WAIT_S`); hold its lease first, so that the deleter sees it."""
        deadline = time.monotonic() + RETIRE_WAIT_S
        while any(n.startswith("retiring-") for n in _names(self._lease_dir(key))):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _leave(self, key: str) -> None:
        folder = self._lease_dir(key)
        fs, path = resolve(folder)
        fs.delete_file(join(path, f"use-{self.token}"))
        if TEMPORARY not in _names(folder):
            return  # kept by its writer, or written before leases: never deleted here
        retiring = join(path, f"retiring-{self.token}")
        _write(folder, f"retiring-{self.token}")
        try:
            if any(n.startswith(("use-", "keep-")) for n in _names(folder)):
                return  # someone else holds it: the last one to leave deletes it
            entry_fs, entry = resolve(join(self.root, key))
            with contextlib.suppress(FileNotFoundError):
                entry_fs.delete_dir(entry)
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(join(path, TEMPORARY))
        finally:
            fs.delete_file(retiring)

    def _at_exit(self) -> None:
        self.cleanup()
        if self._owned_root and not self.keep:
            shutil.rmtree(self._owned_root, ignore_errors=True)


def _is_file(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


def _names(folder: str) -> list[str]:
    fs, path = resolve(folder)
    selector = pafs.FileSelector(path, allow_not_found=True)
    return [info.base_name for info in fs.get_file_info(selector)]


def _write(folder: str, name: str) -> None:
    fs, path = resolve(folder)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(join(path, name)) as out:
        out.write(b"")


_STORES: dict[tuple[str | None, bool], RunStore] = {}
_STORES_LOCK = threading.Lock()


def open_store(root: str | None = None, *, keep: bool = False) -> RunStore:
    """The process's :class:`RunStore` for ``root`` (one per root and ``keep``, so that fits in
    one process find each other's shards; ``None``: one temporary store per process)."""
    with _STORES_LOCK:
        key = (root, keep)
        if key not in _STORES:
            _STORES[key] = RunStore(root, keep=keep)
        return _STORES[key]


__all__ = ["Fingerprint", "RunStore", "fingerprint", "open_store"]
