"""``python -m sparkdl``: the ``sparkdl`` command."""

from sparkdl.cli import exit_quickly, main

if __name__ == "__main__":
    exit_quickly(main())
