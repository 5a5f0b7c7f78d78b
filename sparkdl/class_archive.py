"""The driver JVM's class-data-sharing archive: Spark's classes mapped from one file instead of
read, parsed and verified from its jars at every start.

The first driver JVM for a given Java, Spark and classpath writes the archive as it exits
(``-XX:ArchiveClassesAtExit``); every later one maps it (``-XX:SharedArchiveFile``). On
2 cores that takes about a third off a local session's start and a small job's JVM time, and
changes nothing once the classes are loaded. A JVM that cannot use the file (another
classpath, a file still being written or cut short) starts as it would without it, silently:
the options turn the JVM's ``cds`` log off.

The archives live in ``$SPARKDL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/sparkdl`` or
``~/.cache/sparkdl``), about 190 MB each. Driver options that already choose class sharing
(``-Xshare:off``, ``-XX:SharedArchiveFile``, ``-XX:ArchiveClassesAtExit``) are left as
they are: ``-Xshare:off`` turns this off. So is a cache directory whose path has spaces or
quotes (the options are one string that Spark's launcher splits).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

#: The first bytes of a complete dynamic archive of JDK 17+ (``0xf00baba8``, little-endian).
#: The JVM writes the header last, so a file cut short or still being written lacks it.
_MAGIC = b"\xa8\xab\x0b\xf0"
#: A writer's marker this old was abandoned (its JVM killed, or the archive refused).
_ABANDONED_AFTER_S = 600.0
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_CHOSEN = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")
#: Characters that Spark's launcher would split or unquote in a path among the options.
_SPLITS_OPTIONS = " \t\n'\"\\"
#: What Spark's launcher puts on the driver's classpath besides its jars.
_CLASSPATH_ENV = ("SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                  "SPARK_PREPEND_CLASSES")
#: Spark settings that change the driver JVM's classpath.
CLASSPATH_KEYS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath",
                  "spark.driver.userClassPathFirst")


def cache_dir() -> Path:
    """Where sparkdl keeps files it can rebuild: ``$SPARKDL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sparkdl``, else ``~/.cache/sparkdl``."""
    if os.environ.get("SPARKDL_CACHE_DIR"):
        return Path(os.environ["SPARKDL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "sparkdl")


def driver_options(current: str | None, settings: Mapping[str, str] | None = None) -> str:
    """``spark.driver.extraJavaOptions`` with the class archive added: mapped when it exists,
    written at exit when it does not. ``current`` unchanged when it already chooses class
    sharing, when the cache directory cannot be written, while another JVM writes the
    archive, or when the classpath holds a non-empty directory (a ``$SPARK_CONF_DIR`` with
    files in it: the JVM archives no classpath like that). ``settings``: the session's Spark
    settings; those of :data:`CLASSPATH_KEYS` are part of the archive's key."""
    current = (current or "").strip()
    if any(option in current for option in _CHOSEN):
        return current
    classpath = {key: settings[key] for key in CLASSPATH_KEYS if settings and settings.get(key)}
    if any(_non_empty_directory(entry) for entry in _classpath_directories(classpath)):
        return current
    path = archive_path(classpath)
    if path is None or any(char in str(path) for char in _SPLITS_OPTIONS):
        return current
    marker = path.with_name(path.name + ".writing")
    if _complete(path):
        marker.unlink(missing_ok=True)
        return f"{current} -XX:SharedArchiveFile={path} {_QUIET}".strip()
    if not _claim(marker):
        return current  # another JVM writes it, or the cache directory is not writable
    path.unlink(missing_ok=True)  # a file its writer left without a header
    return f"{current} -XX:ArchiveClassesAtExit={path} {_QUIET}".strip()


def _claim(marker: Path) -> bool:
    """Whether this JVM is the one to write the archive: ``marker`` created here, or found
    abandoned (older than its writer could take) and created anew."""
    for _ in range(2):
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            try:
                if time.time() - marker.stat().st_mtime < _ABANDONED_AFTER_S:
                    return False
                marker.unlink()
            except FileNotFoundError:
                pass
        except OSError:
            return False
    return False


def archive_path(classpath: Mapping[str, str] | None = None) -> Path | None:
    """The archive for this Java, this Spark and the ``classpath`` settings
    (:data:`CLASSPATH_KEYS`); ``None`` when no Java or Spark is found."""
    java = _java()
    jars = _spark_jars()
    if java is None or jars is None:
        return None
    stat = java.stat()
    key = "\n".join([
        f"{java}:{stat.st_size}:{stat.st_mtime_ns}",
        str(jars), *sorted(entry.name for entry in jars.iterdir()),
        *(f"{name}={os.environ.get(name, '')}" for name in _CLASSPATH_ENV),
        *(f"{key}={value}" for key, value in sorted((classpath or {}).items())),
    ])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / f"spark-driver-{digest}.jsa"


def _classpath_directories(classpath: Mapping[str, str]) -> list[Path]:
    """The directories Spark's launcher may put on the driver's classpath: its conf
    directory, Hadoop's and YARN's, and the directories among the extra entries."""
    jars = _spark_jars()
    conf = os.environ.get("SPARK_CONF_DIR") or (str(jars.parent / "conf") if jars else "")
    entries = [conf, os.environ.get("HADOOP_CONF_DIR", ""), os.environ.get("YARN_CONF_DIR", "")]
    for extra in (os.environ.get("SPARK_DIST_CLASSPATH", ""),
                  classpath.get("spark.driver.extraClassPath", "")):
        entries.extend(extra.split(os.pathsep))
    if os.environ.get("SPARK_PREPEND_CLASSES"):
        entries.append(str(jars.parent) if jars else "")
    return [Path(entry) for entry in entries if entry and not entry.endswith("*")]


def _non_empty_directory(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return True


def _complete(path: Path) -> bool:
    try:
        with path.open("rb") as archive:
            return archive.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not found or not os.path.exists(found):
        return None
    return Path(found).resolve()


def _spark_jars() -> Path | None:
    home = os.environ.get("SPARK_HOME")
    if home:
        jars = Path(home, "jars")
    else:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            return None
        jars = Path(spec.origin).parent / "jars"
    return jars.resolve() if jars.is_dir() else None
