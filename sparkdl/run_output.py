"""A run's ``output.dir`` on any filesystem, worked on through a local directory.

A local ``output.dir`` is used in place. Any other URI (``s3://bucket/run``, ``gs://...``,
an fsspec URI) gets a local staging directory: a stage :meth:`~RunOutput.fetch`-es what it
reads, writes its files there exactly as it would locally (Keras, matplotlib and MLflow
write local files), then :meth:`~RunOutput.publish`-es them in the order given, so the file
that says a stage finished (``metrics.json``, a directory's marker) is written last.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType

from sparkdl.errors import ConfigurationError
from sparkdl.storage import child, delete, download, exists, local_path, make_dirs, upload


class RunOutput:
    """``output.dir`` as a local directory :attr:`dir`, published to :attr:`uri` if remote."""

    def __init__(self, uri: str, *, key: str = "output.dir") -> None:
        self.uri = uri.rstrip("/") or uri
        self.key = key
        local = local_path(uri)
        self.remote = local is None
        if local is None:
            make_dirs(uri, key=key)
            staging = Path(tempfile.mkdtemp(prefix="sparkdl-output-"))
            self.dir = staging / (self.uri.rsplit("/", 1)[-1] or "output")
            self.dir.mkdir()
        else:
            self.dir = local
            _make_local_dir(local, uri, key)

    def location(self, name: str) -> str:
        """Where ``name`` is published: a local path, or the URI on the remote filesystem."""
        return child(self.uri, name) if self.remote else str(self.dir / name)

    def fetch(self, name: str) -> Path | None:
        """The local copy of ``name`` (downloaded when remote); None if there is none."""
        path = self.dir / name
        if self.remote and not path.exists() and exists(child(self.uri, name)):
            download(child(self.uri, name), path)
        return path if path.exists() else None

    def publish(self, *names: str) -> None:
        """Upload ``names`` (files or directories) in this order; nothing to do when local."""
        if not self.remote:
            return
        for name in names:
            upload(self.dir / name, child(self.uri, name))

    def publish_dir(self, name: str, marker: str) -> None:
        """Replace the directory ``name`` with the local one: the old marker goes first (the
        old output stops looking complete), then the old files, then the new files, and the
        new ``marker`` last. Where the output is local the caller has already renamed it."""
        if not self.remote:
            return
        target = child(self.uri, name)
        delete(child(target, marker))
        delete(target)
        source = self.dir / name
        for file in sorted(p for p in source.rglob("*") if p.is_file() and p.name != marker):
            upload(file, child(target, file.relative_to(source).as_posix()))
        upload(source / marker, child(target, marker))

    def close(self) -> None:
        """Remove the staging directory (a local ``output.dir`` stays, of course)."""
        if self.remote:
            shutil.rmtree(self.dir.parent, ignore_errors=True)

    def __enter__(self) -> RunOutput:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _make_local_dir(path: Path, uri: str, key: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigurationError(
            f"{key}: {uri} cannot be a directory: it or a parent is a file"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"{key}: cannot create {path}: {exc.strerror or exc}") from None
