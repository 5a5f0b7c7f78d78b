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
``retiring-T`` a process is deleting the entry (``T`` is its token, ``HOST-PID-RANDOM``)
``retired-T``  a directory: the entry's files, moved away to be deleted
============== ==========================================================================

At exit (or :meth:`RunStore.cleanup`) a process removes its ``use`` leases; for a temporary
entry it then writes ``retiring-T``, lists the leases and deletes the entry only if no other
``use`` or ``keep`` lease is there. A process about to reuse writes its lease first and then
waits (bounded) while a ``retiring`` file is there: of two processes racing, at least one sees
the other's file, so an entry is never deleted under a process that reuses it. A process that
dies without cleaning up leaves its lease: the entry stays (deleting it is then up to you).

A deletion is made so that a crash at any point leaves either the whole entry or an entry no
reader uses: it removes the entry's ``_sparkdl.json`` first (readers and reusers take an entry
without it for absent), then ``temporary``, moves the directory to ``retired-T``, removes
``retiring-T``, and only then deletes the files. The next process to use the key cleans what
a crash left: a ``retiring`` marker older than :data:`RETIRE_WAIT_S` (by its time stamp, or by
how long this process waited on it) is removed with a warning naming its host, process and
age, so at most one process ever waits on it; a ``retired`` directory whose marker is gone is
deleted; an entry directory without ``_sparkdl.json`` is moved away and deleted before the
shards are written again. ``write(uri)`` must publish atomically, as
:func:`~sparkdl.data.writer.write_shards` does (a temporary sibling renamed into place): a
directory without ``_sparkdl.json`` at ``uri`` is never a write in progress.

:data:`_retire_step`, when set, is called with the name of each step of a deletion as it
completes (``"marked"``, ``"unpublished"``, ``"untemporary"``, ``"moved"``, ``"unmarked"``,
``"deleted"``): the tests kill a process there.
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
RETIRING = "retiring-"
RETIRED = "retired-"

# a test hook: called with each step's name as a deletion completes it (see the docstring)
_retire_step: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if _retire_step is not None:
        _retire_step(name)


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
        self._settle(name)
        uri = join(self.root, name)
        fs, path = resolve(uri)
        if found.reusable and _is_file(fs, join(path, METADATA_FILE)):
            log.info("reusing shards %s: %s", uri, found.why)
            return uri
        self._discard_remains(name)
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

    def _settle(self, key: str) -> None:
        """Wait while another process deletes ``key``; hold its lease first, so that the
        deleter sees it. Clean what a crashed deletion left: a ``retiring`` marker older than
        :data:`RETIRE_WAIT_S` (by its time stamp or by this wait), a ``retired`` directory
        without its marker (its deleter died, or is deleting it too)."""
        folder = self._lease_dir(key)
        fs, path = resolve(folder)
        start = time.monotonic()
        while True:
            waited = time.monotonic() - start
            infos = _infos(folder)
            young = False
            for info in infos:
                if not info.base_name.startswith(RETIRING):
                    continue
                age = max(_age_s(info), waited)
                if age <= RETIRE_WAIT_S:
                    young = True
                    continue
                host, pid = _host_pid(info.base_name.removeprefix(RETIRING))
                log.warning(
                    "removing %s: a deletion of shards %s by host %s, process %s, started "
                    "%.0f s ago and never finished (it is taken as dead after %.0f s)",
                    join(folder, info.base_name), join(self.root, key), host, pid, age,
                    RETIRE_WAIT_S,
                )
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(join(path, info.base_name))
            if not young:
                break
            time.sleep(0.05)
        # no marker is left: every retired directory is a dead deleter's, or one about to go
        for info in infos:
            if info.base_name.startswith(RETIRED):
                with contextlib.suppress(OSError):
                    fs.delete_dir(join(path, info.base_name))

    def _discard_remains(self, key: str) -> None:
        """Move away and delete an entry directory without ``_sparkdl.json`` (what a crashed
        deletion left), so that the shards can be written there again."""
        fs, path = resolve(join(self.root, key))
        if (fs.get_file_info(path).type != pafs.FileType.Directory
                or _is_file(fs, join(path, METADATA_FILE))):
            return
        log.warning("removing %s: shards without %s, left by a deletion that did not finish",
                    join(self.root, key), METADATA_FILE)
        _, lease_path = resolve(self._lease_dir(key))
        retired = join(lease_path, f"{RETIRED}{self.token}-{secrets.token_hex(4)}")
        try:
            fs.move(path, retired)
        except FileNotFoundError:
            return  # another process moved it meanwhile
        except OSError:
            retired = path  # a filesystem that cannot move directories: delete in place
        if retired != path and _is_file(fs, join(retired, METADATA_FILE)):
            # another process published whole shards there just now: put them back (if the
            # move fails, the path holds newer shards and these are garbage)
            with contextlib.suppress(OSError):
                fs.move(retired, path)
        with contextlib.suppress(FileNotFoundError):
            fs.delete_dir(retired)

    def _leave(self, key: str) -> None:
        folder = self._lease_dir(key)
        fs, path = resolve(folder)
        fs.delete_file(join(path, f"use-{self.token}"))
        if TEMPORARY not in _names(folder):
            return  # kept by its writer, or written before leases: never deleted here
        marker = f"{RETIRING}{self.token}"
        _write(folder, marker)
        marked = True
        try:
            if any(n.startswith(("use-", "keep-")) for n in _names(folder)):
                return  # someone else holds it: the last one to leave deletes it
            _step("marked")
            entry_fs, entry = resolve(join(self.root, key))
            with contextlib.suppress(FileNotFoundError):
                entry_fs.delete_file(join(entry, METADATA_FILE))  # no reader uses it now
            _step("unpublished")
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(join(path, TEMPORARY))
            _step("untemporary")
            retired = join(path, f"{RETIRED}{self.token}")
            try:
                entry_fs.move(entry, retired)
            except FileNotFoundError:
                retired = ""
            except OSError:
                retired = entry  # a filesystem that cannot move directories: delete in place
            _step("moved")
            if retired == entry:
                with contextlib.suppress(FileNotFoundError):
                    entry_fs.delete_dir(entry)
            fs.delete_file(join(path, marker))
            marked = False
            _step("unmarked")
            if retired and retired != entry:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_dir(retired)
            _step("deleted")
        finally:
            if marked:
                fs.delete_file(join(path, marker))

    def _at_exit(self) -> None:
        self.cleanup()
        if self._owned_root and not self.keep:
            shutil.rmtree(self._owned_root, ignore_errors=True)


def _is_file(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


def _infos(folder: str) -> list[pafs.FileInfo]:
    fs, path = resolve(folder)
    return list(fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def _names(folder: str) -> list[str]:
    return [info.base_name for info in _infos(folder)]


def _age_s(info: pafs.FileInfo) -> float:
    """Seconds since ``info`` was last modified (0 where the filesystem does not say)."""
    mtime_ns = info.mtime_ns
    return 0.0 if mtime_ns is None else max(0.0, time.time() - mtime_ns / 1e9)


def _host_pid(token: str) -> tuple[str, str]:
    """The host and process id in a store's token (``HOST-PID-RANDOM``)."""
    parts = token.rsplit("-", 2)
    return (parts[0], parts[1]) if len(parts) == 3 else (token, "unknown")


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
