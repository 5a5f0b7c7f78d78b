"""The ``sparkdl`` command line: subcommands, per-command options, conf lookup, and the
installed console script run as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_harness import run_cli as _run

import sparkdl
from sparkdl.cli import build_parser
from sparkdl.confs import PACKAGED_DIR, packaged_confs, resolve_conf
from sparkdl.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ["etl", "train", "evaluate", "predict", "pipeline", "samples", "benchmark", "report",
            "validate"]


def test_top_level_help_lists_every_command(capsys):
    rc, out, _ = _run(capsys, ["--help"])
    assert rc == 0
    for command in COMMANDS:
        assert f"\n    {command}" in out, command
    assert "looked up in this order" in out


def test_version_is_the_package_version(capsys):
    rc, out, _ = _run(capsys, ["--version"])
    assert rc == 0 and out.strip() == f"sparkdl {sparkdl.__version__}"


@pytest.mark.parametrize("stage", ["etl", "train", "evaluate", "predict", "pipeline"])
def test_each_stage_help_lists_only_its_own_options(capsys, stage):
    rc, out, _ = _run(capsys, [stage, "--help"])
    assert rc == 0 and out.startswith(f"usage: sparkdl {stage} ")
    for option in ("--conf", "--set", "--json-out", "--log-level"):
        assert option in out, option
    assert ("--resume" in out) == (stage in ("train", "pipeline"))
    assert "--stage" not in out and "run_dir" not in out
    # jobs/STAGE.py parses the same options
    assert _run(capsys, ["--help"], stage=stage)[1] == out


@pytest.mark.parametrize("argv, refused", [
    (["etl", "--conf", "digits", "--resume"], "--resume"),
    (["evaluate", "--conf", "digits", "--resume"], "--resume"),
    (["predict", "--conf", "digits", "--stage", "etl"], "--stage etl"),
    (["report", "run", "--conf", "digits"], "--conf digits"),
    (["samples", "data", "--set", "a=1"], "--set a=1"),
    (["validate", "--conf", "digits", "--resume"], "--resume"),
])
def test_an_option_the_command_does_not_take_is_refused_in_its_name(capsys, argv, refused):
    rc, out, err = _run(capsys, argv)
    assert rc == 2 and out == ""
    assert f"sparkdl {argv[0]}: error: unrecognized arguments: {refused}" in err, err
    assert err.startswith(f"usage: sparkdl {argv[0]} ")


def test_a_fixed_stage_job_refuses_options_of_other_stages(capsys):
    rc, _, err = _run(capsys, ["--conf", "digits", "--resume"], stage="etl")
    assert rc == 2 and "sparkdl etl: error: unrecognized arguments: --resume" in err


def test_unknown_and_missing_commands_are_refused(capsys):
    rc, _, err = _run(capsys, ["fit"])
    assert rc == 2 and "invalid choice: 'fit'" in err
    rc, _, err = _run(capsys, [])
    assert rc == 2 and "required: COMMAND" in err


def test_benchmark_forwards_to_the_benchmark_command_line(capsys):
    rc, out, _ = _run(capsys, ["benchmark", "--help"])
    assert rc == 0 and "encoding" in out and "--quick" in out
    rc, _, err = _run(capsys, ["benchmark", "no-such-suite"])
    assert rc == 2 and "invalid choice: 'no-such-suite'" in err


def test_parser_commands_match_the_documented_list():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert list(commands.choices) == COMMANDS


def test_packaged_confs_are_found_by_name_with_or_without_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the source tree: no conf/ here
    assert packaged_confs() == [
        "csv", "diabetes", "digits", "digits_split", "images", "iris", "mnist"
    ]
    assert resolve_conf("digits") == str(PACKAGED_DIR / "digits.yaml")
    assert resolve_conf("mnist.yaml") == str(PACKAGED_DIR / "mnist.yaml")
    assert resolve_conf("s3://bucket/job.yaml") == "s3://bucket/job.yaml"


def test_a_file_in_the_working_directory_wins_over_a_packaged_conf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits.yaml").write_text("training:\n  epochs: 3\n")
    assert resolve_conf("digits.yaml") == "digits.yaml"
    assert resolve_conf("digits") == str(PACKAGED_DIR / "digits.yaml")  # no file "digits"


def test_an_unknown_conf_names_the_packaged_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError,
                       match=r"no conf of that name \(packaged: csv, diabetes, digits"):
        resolve_conf("digit")
    with pytest.raises(ConfigurationError, match=r"^configuration file sub/digits.yaml does not "
                                                 r"exist$"):
        resolve_conf("sub/digits.yaml")  # a path is a path: no packaged fallback


def test_the_repository_conf_folder_is_the_packaged_one():
    assert (REPO / "conf").resolve() == PACKAGED_DIR.resolve()


def _sparkdl_script() -> str:
    script = Path(sys.executable).parent / "sparkdl"
    found = str(script) if script.is_file() else shutil.which("sparkdl")
    assert found, "the sparkdl console script is not installed (pip install -e .)"
    return found


def _console(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH",
                                                                                  "")])}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_console_script_as_a_user_runs_it(tmp_path):
    script = _sparkdl_script()
    version = _console([script, "--version"], tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"sparkdl {sparkdl.__version__}"
    etl_help = _console([script, "etl", "--help"], tmp_path)
    assert etl_help.returncode == 0 and "--conf" in etl_help.stdout
    assert "--resume" not in etl_help.stdout
    refused = _console([script, "etl", "--conf", "digits", "--resume"], tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "sparkdl etl: error: unrecognized arguments: --resume" in refused.stderr
    assert "Traceback" not in refused.stderr
    module = _console([sys.executable, "-m", "sparkdl", "--help"], tmp_path)
    assert module.returncode == 0 and "validate" in module.stdout
