"""A command's result: one JSON object, the last line of stdout, and optionally a file.

``--json-out PATH`` writes the same object to ``PATH`` atomically (a temporary file in the same
directory, then a rename), so a scheduler that reads it never sees half a result. A job that
fails writes nothing there.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from sparkdl.errors import ConfigurationError


def check_json_out(path: str | None) -> None:
    """Refuse a ``--json-out`` path that can never be written, before the job runs."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigurationError(f"--json-out {path}: is a directory")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigurationError(f"--json-out {path}: {parent} is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigurationError(f"--json-out {path}: {parent} is not writable")
            return


def emit_result(result: Any, json_out: str | None = None) -> None:
    """Print ``result`` as one JSON line on stdout; with ``json_out``, also write it there."""
    text = json.dumps(result, default=str)
    if json_out is not None:
        from sparkdl.storage import write_text_atomically

        write_text_atomically(Path(json_out), text + "\n")
    print(text, flush=True)


def fail(command: str, message: str) -> int:
    """Report a refused command on stderr, the way argparse does, and return exit code 2."""
    print(f"sparkdl {command}: error: {message}", file=sys.stderr, flush=True)
    return 2
