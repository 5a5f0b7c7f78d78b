"""Filesystems by URI: a local path or any URI pyarrow or fsspec resolves, and atomic writes.

:func:`resolve` turns a location into ``(pyarrow filesystem, path)``: local paths and
``file://``, then the schemes pyarrow knows (``s3://``, ``gs://``, ``hdfs://`` through libhdfs,
...), then any scheme fsspec knows (``memory://``, ``abfs://``, ...) wrapped as a pyarrow
filesystem. Every failure is one :class:`DataError` naming the URI.

Publishing is atomic where the store allows it: on filesystems that rename (local, HDFS) a
file is written under a temporary name and renamed; on object stores (S3, GCS, fsspec) one
object appears whole or not at all when its upload completes, so it is written in place, and
a multi-file output writes its marker object last. Local files and directories are written
through :func:`atomic_path` (a temporary sibling, renamed over the target when complete,
removed when not).

S3: pyarrow reads credentials from the standard AWS chain (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance roles) and the endpoint from
``AWS_ENDPOINT_URL`` (an S3-compatible server such as MinIO or moto). :func:`configure_s3`
sets the endpoint and region from ``cluster.s3`` for this process; :func:`s3_environment`
hands them to the Spark tasks sparkdl ships, which apply them with :func:`apply_environment`
(classic Spark and Spark Connect alike: no executor environment is changed at run time).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from sparkdl.errors import DataError

#: Environment variables :func:`configure_s3` sets (pyarrow's S3 filesystem reads them).
S3_ENDPOINT_ENV = "AWS_ENDPOINT_URL"
S3_REGION_ENV = "AWS_DEFAULT_REGION"

# Filesystems whose ``move`` is an atomic rename of files and directories.
_RENAMING = ("local", "hdfs")


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and path of a local path or a URI.

    ``file://`` and the schemes pyarrow knows (``hdfs://`` through libhdfs, ``s3://``,
    ``gs://``, ...) use pyarrow's own filesystems; any other scheme goes through fsspec when
    it is installed (``memory://``, ``abfs://``, ...).
    """
    local = _local(uri)
    if local is not None:
        return pafs.LocalFileSystem(), local
    scheme = uri.split("://", 1)[0].lower()
    try:
        return pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        if scheme in ("hdfs", "viewfs"):
            raise DataError(
                f"cannot open {uri}: hdfs:// needs libhdfs (Hadoop's native client, "
                f"libhdfs.so) and a Hadoop CLASSPATH; set HADOOP_HOME or ARROW_LIBHDFS_DIR "
                f"and CLASSPATH=$(hadoop classpath --glob). pyarrow said: {exc}"
            ) from None
        if scheme != "file" and isinstance(exc, ValueError) and "nrecognized" in str(exc):
            return _fsspec(uri, scheme)
        raise DataError(f"cannot open filesystem for {uri}: {exc}") from None


def _fsspec(uri: str, scheme: str) -> tuple[pafs.FileSystem, str]:
    """Wrap an fsspec filesystem for ``uri`` as a pyarrow filesystem."""
    try:
        import fsspec
    except ImportError:
        raise DataError(
            f"cannot open {uri}: pyarrow has no filesystem for {scheme}:// and fsspec is not "
            f"installed (pip install fsspec)"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ValueError, ImportError, OSError) as exc:
        raise DataError(f"cannot open filesystem for {uri} through fsspec: {exc}") from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _local(location: str) -> str | None:
    """The absolute local path (symbolic links kept) of a path or ``file:`` URI; None for
    another filesystem. ``/abs``, ``file:/abs``, ``file:///abs`` and ``file://localhost/abs``
    are one place; a relative path (or ``file:rel``) is relative to the working directory."""
    if location[:5].lower() == "file:":
        parsed = urlparse(location)
        if parsed.netloc not in ("", "localhost"):
            return None  # another host's files: pyarrow says what it makes of them
        return os.path.abspath(unquote(parsed.path))
    if "://" in location:
        return None
    return os.path.abspath(os.path.expanduser(location))


def local_path(location: str) -> Path | None:
    """The local path of a path or ``file:`` URI, symbolic links resolved; None for any
    other filesystem. Every spelling of one local place gives the same path."""
    local = _local(location)
    return None if local is None else Path(local).resolve()


def as_uri(location: str) -> str:
    """A filesystem URI for a path or URI: every spelling of a local place is the same
    ``file:///abs`` (what Spark and pyarrow are given); other URIs are returned unchanged."""
    local = local_path(location)
    return location if local is None else local.as_uri()


def spark_uri(uri: str) -> str:
    """``uri`` as Spark reads and writes it. Hadoop's ``Path`` takes a string literally (a
    ``%20`` is a directory named ``%20``; ``#`` and ``?`` are part of the name), so the
    percent-escapes of a URI are decoded here, the one place sparkdl hands a location over."""
    uri = as_uri(uri)
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{unquote(rest)}"


def child(uri: str, name: str) -> str:
    """``uri/name`` for a URI or a local path."""
    return f"{uri.rstrip('/')}/{name}"


def renames_atomically(fs: pafs.FileSystem) -> bool:
    """Whether ``fs.move`` renames files and directories atomically (not an object store)."""
    return fs.type_name in _RENAMING


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``path`` so that readers see the old content or all of the new, never a part."""
    if not renames_atomically(fs):
        with fs.open_output_stream(path) as stream:  # one object, visible once complete
            stream.write(data)
        return
    head, _, name = path.rpartition("/")
    tmp = f"{head}/{temporary_name(name)}" if head else temporary_name(name)
    try:
        with fs.open_output_stream(tmp) as stream:
            stream.write(data)
        fs.move(tmp, path)
    except BaseException:
        _discard(fs, tmp)
        raise


def temporary_name(name: str) -> str:
    """A hidden, unique sibling name for writing ``name`` before it is renamed into place."""
    return f".{name}.tmp-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary sibling of the local ``target`` to write (a file or a directory): when the
    block ends without an error it replaces ``target`` in one rename (:func:`replace_path`);
    whatever happens, nothing of it is left behind.

    >>> with atomic_path(run_dir / "metrics.json") as tmp:
    ...     tmp.write_text(text)
    """
    target = Path(target)
    tmp = target.with_name(temporary_name(target.name))
    try:
        yield tmp
        replace_path(tmp, target)
    finally:
        remove_path(tmp)


def write_text_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to the local ``path`` (parents created) atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def replace_path(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target`` on one filesystem; a directory replaces the old one
    through a hidden name, so ``target`` is the old or the new directory, never a mix."""
    if source.is_dir() and target.exists():
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:12]}")
        os.replace(target, old)
        os.replace(source, target)
        remove_path(old)
    else:
        os.replace(source, target)


def remove_path(path: Path) -> None:
    """Remove the local file or directory ``path`` if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _discard(fs: pafs.FileSystem, tmp: str) -> None:
    """Delete a temporary file a failed write may have left; a failure here is not the news."""
    try:
        if fs.get_file_info(tmp).type == pafs.FileType.File:
            fs.delete_file(tmp)
    except (OSError, pa.ArrowException):
        pass


def move_dir(fs: pafs.FileSystem, src: str, dst: str) -> None:
    """Move directory ``src`` to ``dst``: a rename where the store has one, else file by file
    (object stores have no directories to rename)."""
    if renames_atomically(fs):
        fs.move(src, dst)
        return
    fs.create_dir(dst, recursive=True)
    for info in fs.get_file_info(pafs.FileSelector(src, recursive=True)):
        if info.type == pafs.FileType.File:
            fs.copy_file(info.path, f"{dst}/{info.path[len(src):].lstrip('/')}")
    fs.delete_dir(src)


def read_bytes(uri: str, *, what: str = "file", limit: int | None = None) -> bytes:
    """The content of the file at ``uri``; one :class:`DataError` naming it on failure."""
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            raise DataError(f"{what} {uri} does not exist")
        if limit is not None and info.size is not None and info.size > limit:
            raise DataError(f"{what} {uri}: {info.size} bytes; at most {limit} expected")
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read {what} {uri}: {exc}") from None


def exists(uri: str) -> bool:
    """Whether a file or directory is at ``uri``."""
    fs, path = resolve(uri)
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot reach {uri}: {exc}") from None


def upload(local: str | os.PathLike[str], uri: str) -> None:
    """Copy the local file or directory ``local`` to ``uri``; files of a directory in sorted
    order, so a caller can name its marker to sort last or upload it separately."""
    fs, path = resolve(uri)
    source = Path(local)
    try:
        if source.is_dir():
            fs.create_dir(path, recursive=True)
            for file in sorted(p for p in source.rglob("*") if p.is_file()):
                _upload_file(file, fs, f"{path}/{file.relative_to(source).as_posix()}")
        else:
            _upload_file(source, fs, path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot write {uri}: {exc}") from None


def copy_in(local: str | os.PathLike[str], fs: pafs.FileSystem, path: str) -> None:
    """Copy the local file ``local`` to ``path`` on ``fs`` in chunks (no copy of it in
    memory); the caller makes the result visible atomically."""
    pafs.copy_files(str(local), path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)


def _upload_file(source: Path, fs: pafs.FileSystem, path: str) -> None:
    if renames_atomically(fs):
        head, _, name = path.rpartition("/")
        fs.create_dir(head, recursive=True)
        tmp = f"{head}/{temporary_name(name)}"
        try:
            copy_in(source, fs, tmp)
            fs.move(tmp, path)
        except BaseException:
            _discard(fs, tmp)
            raise
    else:
        copy_in(source, fs, path)


def download(uri: str, local: str | os.PathLike[str]) -> None:
    """Copy the file or directory at ``uri`` to the local path ``local``."""
    fs, path = resolve(uri)
    target = Path(local)
    try:
        if fs.get_file_info(path).type == pafs.FileType.Directory:
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
        pafs.copy_files(path, str(target), source_filesystem=fs,
                        destination_filesystem=pafs.LocalFileSystem())
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read {uri}: {exc}") from None


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[Path]:
    """The file at ``uri`` as a local path while the block runs: the file itself on a local
    filesystem (not checked for existence), else a copy downloaded in chunks into a temporary
    directory and removed after."""
    local = local_path(uri)
    if local is not None:
        yield local
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sparkdl-copy-") as tmp:
        copy = Path(tmp, uri.rstrip("/").rsplit("/", 1)[-1] or "file")
        download(uri, copy)
        yield copy


def delete(uri: str) -> None:
    """Delete the file or directory at ``uri`` if there is one."""
    fs, path = resolve(uri)
    try:
        kind = fs.get_file_info(path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(path)
        elif kind == pafs.FileType.File:
            fs.delete_file(path)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot delete {uri}: {exc}") from None


def make_dirs(uri: str, *, key: str = "directory") -> None:
    """Create the directory at ``uri`` (and its parents); one error naming ``key`` and the
    URI if it cannot be (a file in the way, a missing S3 bucket, no permission)."""
    fs, path = resolve(uri)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            raise DataError(f"{key}: {uri} cannot be a directory: it is a file")
        if info.type == pafs.FileType.NotFound:
            fs.create_dir(path, recursive=True)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{key}: cannot create {uri}: {exc}") from None


def configure_s3(endpoint_override: str | None = None, region: str | None = None) -> None:
    """Point ``s3://`` URIs at ``endpoint_override`` (``http://host:9000`` for MinIO or
    moto) and ``region`` in this process; Spark tasks get them through
    :func:`s3_environment`. Credentials stay with the AWS chain of each machine."""
    settings = {S3_ENDPOINT_ENV: endpoint_override, S3_REGION_ENV: region}
    for name, value in settings.items():
        if value:
            os.environ[name] = value


def s3_environment() -> dict[str, str]:
    """This process's S3 endpoint and region settings, for the Spark tasks it launches."""
    return {name: os.environ[name] for name in (S3_ENDPOINT_ENV, S3_REGION_ENV)
            if os.environ.get(name)}


def apply_environment(environment: dict[str, str]) -> None:
    """In a Spark task: take the driver's :func:`s3_environment`."""
    os.environ.update(environment)
