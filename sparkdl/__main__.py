"""``python -m sparkdl``: the ``sparkdl`` command."""

import sys

from sparkdl.cli import main

if __name__ == "__main__":
    sys.exit(main())
