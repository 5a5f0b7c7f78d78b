"""Run the ``sparkdl`` command line in-process, as the CLI tests do."""

from __future__ import annotations


def run_cli(capsys, argv: list[str], stage: str | None = None) -> tuple[int, str, str]:
    """``sparkdl ARGV`` (or ``jobs/STAGE.py ARGV``): exit status, stdout, stderr."""
    from sparkdl.cli import main

    try:
        rc = main(argv, stage=stage)
    except SystemExit as exc:  # argparse: --help, --version, refused options
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err
