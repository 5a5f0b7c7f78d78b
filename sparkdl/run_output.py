"""A run's ``output.dir`` on any filesystem, worked on through a local directory.

A local ``output.dir`` is read in place. Any other URI (``s3://bucket/run``, ``gs://...``,
an fsspec URI) gets a local copy: a stage :meth:`~RunOutput.fetch`-es what it reads.

A stage writes its new files into :attr:`~RunOutput.staging` (local files, as Keras,
matplotlib and MLflow write them; inside ``output.dir`` when it is local, so publishing is a
rename) and publishes them as one unit with :meth:`~RunOutput.publish_unit`: every target is
checked first; then the old completion file goes (the directory stops looking complete) with
the ``stale`` outputs of later stages (an ``evaluation.json`` of the model being replaced);
then each new file replaces its old one, the completion file (``metrics.json``) last. A stage
that fails before it publishes leaves the previous outputs as they were; its staging
directory is removed on :meth:`~RunOutput.close`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pyarrow.fs as pafs

from sparkdl.errors import ConfigurationError, DataError
from sparkdl.storage import (
    child,
    delete,
    download,
    exists,
    local_path,
    make_dirs,
    remove_path,
    replace_path,
    resolve,
    upload,
)

STAGING_PREFIX = ".sparkdl-staging-"

# The outputs (output_dir) -------------------------------------------------------------------
#: The trained Keras model (also inside a checkpoint and a saved ``KerasModel``).
MODEL_FILE = "model.keras"
#: The job's figures: the fit's metrics (``FitMetrics.to_json()``), then the evaluation's.
METRICS_FILE = "metrics.json"
EVALUATION_FILE = "evaluation.json"
REPORT_FILE = "report.html"
HISTORY_FILE = "history.csv"
PREDICTIONS_DIR = "predictions"
PREDICTIONS_MARKER = "_sparkdl_predictions.json"
SAVEDMODEL_DIR = "savedmodel"
SAVEDMODEL_MARKER = "saved_model.pb"  # what TF Serving looks for



class RunOutput:
    """``output.dir`` as a local directory :attr:`dir`, published to :attr:`uri` if remote."""

    def __init__(self, uri: str, *, key: str = "output.dir") -> None:
        self.uri = uri.rstrip("/") or uri
        self.key = key
        local = local_path(uri)
        self.remote = local is None
        self._staging: Path | None = None
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

    @property
    def staging(self) -> Path:
        """A fresh local directory for the files this stage writes, to :meth:`publish_unit`."""
        if self._staging is None:
            parent = self.dir.parent if self.remote else self.dir
            self._staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
        return self._staging

    def publish_unit(self, names: Sequence[str], *, stale: Sequence[str] = (),
                     markers: Mapping[str, str] | None = None) -> None:
        """Publish the staged ``names`` (files or directories) as one unit, the last of them
        (the stage's completion file) last, and remove the ``stale`` outputs of later stages.

        ``markers`` names the file that marks a directory as sparkdl's (``saved_model.pb``,
        ``_sparkdl_predictions.json``): a directory is published with its marker last, and a
        stale directory without its marker is not sparkdl's and stays. Raises
        :class:`DataError` before anything changes if a target is in the way (a file where
        a directory goes, or the other way round).
        """
        markers = dict(markers or {})
        staged = self.staging
        for name in names:
            self._check_target(name, (staged / name).is_dir(), markers.get(name))
        *body, completion = names
        self._remove(completion, markers.get(completion))
        for name in stale:
            self._remove(name, markers.get(name), only_ours=True)
        for name in (*body, completion):
            self._put(name, markers.get(name))
        shutil.rmtree(staged, ignore_errors=True)
        self._staging = None

    def check_targets(self, names: Sequence[str], directories: Sequence[str] = (),
                      markers: Mapping[str, str] | None = None) -> None:
        """Before a stage works: raise :class:`DataError` if one of ``names`` (the files and
        the ``directories`` it will publish) cannot be published."""
        for name in names:
            self._check_target(name, name in directories, (markers or {}).get(name))

    def _check_target(self, name: str, is_dir: bool, marker: str | None) -> None:
        where = self.location(name)
        fs, path = resolve(where)
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.NotFound:
            return
        if is_dir != (kind == pafs.FileType.Directory):
            raise DataError(
                f"{self.key}: cannot publish {name}: {where} is a "
                f"{'file' if is_dir else 'directory'} sparkdl did not write; move it away"
            )
        if is_dir and marker is not None and not self._is_ours(name, marker):
            raise DataError(f"{self.key}: cannot publish {name}: {where} holds files sparkdl "
                            f"did not write (no {marker}); move it away")

    def _is_ours(self, name: str, marker: str) -> bool:
        fs, path = resolve(self.location(name))
        entries = fs.get_file_info(pafs.FileSelector(path, recursive=False))
        return not entries or exists(child(self.location(name), marker))

    def _remove(self, name: str, marker: str | None, *, only_ours: bool = False) -> None:
        where = self.location(name)
        if not exists(where):
            return
        if marker is not None:
            if only_ours and not self._is_ours(name, marker):
                return
            delete(child(where, marker))  # it stops looking complete first
        if self.remote:
            delete(where)
        elif (self.dir / name).is_dir():
            shutil.rmtree(self.dir / name)
        else:
            (self.dir / name).unlink()
        if self.remote:
            remove_path(self.dir / name)  # the local copy of what was fetched

    def _put(self, name: str, marker: str | None) -> None:
        source = self.staging / name
        if not self.remote:
            replace_path(source, self.dir / name)
            return
        target = child(self.uri, name)
        if not source.is_dir():
            upload(source, target)
        else:
            if marker:
                delete(child(target, marker))
            delete(target)
            for file in sorted(p for p in source.rglob("*") if p.is_file() and p.name != marker):
                upload(file, child(target, file.relative_to(source).as_posix()))
            if marker:
                upload(source / marker, child(target, marker))
        replace_path(source, self.dir / name)  # later fetches see what was published

    def close(self) -> None:
        """Remove the staging directory and, for a remote ``output.dir``, the local copy (a
        local ``output.dir`` stays, of course)."""
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
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
