"""The job configurations shipped with sparkdl (``sparkdl/conf/*.yaml``), found by name.

``--conf NAME`` is looked up in this order:

1. ``NAME`` as a path (relative to the working directory), when that file exists;
2. a URI (``scheme://...``) is passed on unchanged;
3. the packaged conf ``NAME`` or ``NAME.yaml``, when ``NAME`` has no directory part
   (``--conf digits`` and ``--conf digits.yaml`` are ``sparkdl/conf/digits.yaml``).

Paths inside a conf (``data.dir``, ``output.dir``, ...) stay relative to the working directory,
wherever the conf itself was found.
"""

from __future__ import annotations

from pathlib import Path

from sparkdl.errors import ConfigurationError

PACKAGED_DIR = Path(__file__).with_name("conf")
SUFFIX = ".yaml"

LOOKUP_ORDER = (
    "--conf NAME is looked up in this order: 1. the file NAME, relative to the working "
    "directory; 2. a URI (scheme://...) as given; 3. the conf shipped with sparkdl named NAME "
    "or NAME.yaml ({names}). Paths inside a conf (data.dir, output.dir) are relative to the "
    "working directory."
)


def packaged_confs() -> list[str]:
    """Names of the confs shipped with sparkdl, without ``.yaml``."""
    return sorted(path.stem for path in PACKAGED_DIR.glob(f"*{SUFFIX}"))


def lookup_help() -> str:
    """The lookup order, for ``--help``."""
    return LOOKUP_ORDER.format(names=", ".join(packaged_confs()))


def resolve_conf(name: str) -> str:
    """The file (or URI) that ``--conf name`` means; see the module docstring for the order.

    Raises:
        ConfigurationError: no such file and no packaged conf of that name.
    """
    if Path(name).is_file() or "://" in name:
        return name
    if Path(name).name != name:
        raise ConfigurationError(f"configuration file {name} does not exist")
    for candidate in (name, name + SUFFIX):
        packaged = PACKAGED_DIR / candidate
        if packaged.is_file():
            return str(packaged)
    raise ConfigurationError(
        f"configuration file {name} does not exist, and sparkdl ships no conf of that name "
        f"(packaged: {', '.join(packaged_confs())})"
    )
