"""The ``sparkdl`` command: one argparse subcommand per job stage and tool.

``sparkdl COMMAND --help`` lists that command's own options; an option a command does not take
(``sparkdl etl --resume``) is refused with exit status 2. Every command that produces a result
prints it as one JSON object, the last line of stdout (``--json-out PATH`` also writes it to a
file, atomically); tables and logs go to stderr.

``jobs/etl.py``, ``jobs/train.py``, ``jobs/evaluate.py``, ``jobs/predict.py`` and
``jobs/pipeline.py`` are this command with the stage fixed, for ``spark-submit``;
``jobs/benchmark.py`` is ``sparkdl benchmark`` (from a source checkout). ``python -m sparkdl``
is ``sparkdl``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from sparkdl import __version__
from sparkdl.confs import lookup_help, resolve_conf
from sparkdl.errors import SparkDLError
from sparkdl.job_output import check_json_out, emit_result, fail
from sparkdl.logs import (
    LEVELS,
    configure_logging,
    quiet_tensorflow,
    started_while_tensorflow_imports,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkdl.config import JobConfig

STAGES = {
    "etl": "run the conf's data.pipeline on Spark and write train/test shards to data.dir",
    "train": "train on data.dir/train; write output.dir/model.keras and metrics.json",
    "evaluate": "evaluate output.dir/model.keras on data.dir/test; add test_accuracy to "
                "metrics.json",
    "predict": "write predictions for data.dir/test to output.dir/predictions (Parquet)",
    "pipeline": "etl, train and evaluate in one go; also writes report.html",
}
RESUMABLE = ("train", "pipeline")
#: The stages whose driver builds or loads a Keras model, and so imports TensorFlow (quietly,
#: first). The ETL stage's driver never needs it and starts without its ~4 s import.
MODEL_STAGES = ("train", "evaluate", "predict", "pipeline")
TOOLS = {
    "samples": "write the sample inputs of the mnist, csv, diabetes and images confs (no Spark)",
    "benchmark": "run a benchmark suite: sparkdl benchmark SUITE [--json PATH] [--quick]",
    "report": "(re)write RUN_DIR/report.html from its metrics.json and evaluation.json",
    "validate": "check a configuration without starting Spark",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``sparkdl`` parser: ``--version`` and one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="sparkdl",
        description="Distributed TensorFlow/Keras training on Apache Spark. Each command "
                    "prints its result as one JSON object, the last line of stdout.",
        epilog=lookup_help(),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for stage, summary in STAGES.items():
        add_stage_arguments(_command(commands, stage, summary), stage)
    add_samples_arguments(_command(commands, "samples", TOOLS["samples"], False))
    # forwarded to benchmarks.cli before parsing; listed here for --help
    commands.add_parser("benchmark", help=TOOLS["benchmark"], add_help=False)
    add_report_arguments(_command(commands, "report", TOOLS["report"], False))
    add_validate_arguments(_command(commands, "validate", TOOLS["validate"]))
    return parser


def stage_parser(stage: str) -> argparse.ArgumentParser:
    """The parser of one stage alone (``jobs/STAGE.py``): the same options as
    ``sparkdl STAGE``."""
    parser = argparse.ArgumentParser(prog=f"sparkdl {stage}", description=STAGES[stage],
                                     epilog=lookup_help())
    add_stage_arguments(parser, stage)
    parser.set_defaults(command=stage)
    return parser


def _command(commands: argparse._SubParsersAction, name: str, summary: str,
             takes_conf: bool = True) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=summary, description=summary,
                                 epilog=lookup_help() if takes_conf else None)
    parser.set_defaults(command_parser=parser)  # to refuse its unknown options in its name
    return parser


def _add_conf_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--conf", required=True, metavar="CONF",
        help="YAML job configuration: a file, or the name of a conf shipped with sparkdl "
             "(e.g. digits); lookup order below",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a configuration key, e.g. --set training.mode=averaging (repeatable)",
    )


def _add_json_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json-out", metavar="PATH",
        help="also write the result (the JSON last line of stdout) to PATH, atomically",
    )


def add_stage_arguments(parser: argparse.ArgumentParser, stage: str) -> None:
    """Options of a job stage; ``--resume`` only for the stages that train."""
    _add_conf_arguments(parser)
    if stage in RESUMABLE:
        parser.add_argument(
            "--resume", action="store_true",
            help="continue from the latest checkpoint in training.checkpoint_dir",
        )
    _add_json_out(parser)
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LEVELS,
        help="level of sparkdl's own log (default INFO)",
    )


def add_samples_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", nargs="?", default="data",
                        help="where to write them (default: data, where the confs look)")
    _add_json_out(parser)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run's output.dir (holds metrics.json)")
    _add_json_out(parser)


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_conf_arguments(parser)
    parser.add_argument("--stage", choices=tuple(STAGES), default="pipeline",
                        help="check what this stage needs (default: pipeline, i.e. all)")
    _add_json_out(parser)


def load_job_config(conf: str, overrides: Sequence[str]) -> JobConfig:
    """The one place ``--conf`` and ``--set`` become a validated configuration."""
    from sparkdl.config import load_config

    return load_config(resolve_conf(conf), overrides)


def run_stage(args: argparse.Namespace) -> int:
    """Run one stage on Spark: preflight (no Spark), start Spark, run, stop Spark."""
    stage = args.command
    configure_logging(args.log_level)
    quiet_tensorflow(load=False)  # the log level only: TensorFlow loads beside Spark below
    from sparkdl import stages
    from sparkdl.preflight import MODEL_CHECKED, check_model, preflight

    spark = None
    try:
        check_json_out(args.json_out)
        config = load_job_config(args.conf, args.overrides)
        # everything checkable without Spark before Spark starts; the model (it needs
        # TensorFlow, which imports while Spark starts) just after
        preflight(config, stage, model=False)
        spark = start_spark(config, load_tensorflow=stage in MODEL_STAGES)
        if stage in MODEL_CHECKED:
            check_model(config)
        run = getattr(stages, f"run_{stage}")
        resume = {"resume": True} if getattr(args, "resume", False) else {}
        result = run(config, spark, **resume)
    except SparkDLError as exc:
        return fail(stage, str(exc))
    finally:
        if spark is not None:
            spark.stop()  # a job owns its session; stopping it lets executors exit cleanly
    emit_result(result, args.json_out)  # one JSON object, the last line
    return 0


def start_spark(config: JobConfig, *, load_tensorflow: bool) -> SparkSession:
    """Start (or join) the stage's Spark session; with ``load_tensorflow``, import TensorFlow
    meanwhile on a helper thread where that is safe
    (:func:`sparkdl.session.starts_beside_tensorflow`), else before: each takes seconds."""
    from sparkdl.session import get_spark, starts_beside_tensorflow

    if not (load_tensorflow and starts_beside_tensorflow(config.cluster)):
        quiet_tensorflow(load=load_tensorflow)
        return get_spark(config.cluster)
    # pyspark's modules imported before the helper thread starts, so that the threads seldom
    # import one module at once (Python's per-module import locks keep that safe anyway)
    import pyspark.java_gateway
    import pyspark.sql  # noqa: F401

    return started_while_tensorflow_imports(
        lambda jvm_stderr: get_spark(config.cluster, jvm_stderr=jvm_stderr),
        lambda spark: spark.stop(),  # the import failed
    )


def run_samples(args: argparse.Namespace) -> int:
    """Write the sample inputs (made from scikit-learn's digits, iris and diabetes)."""
    from sparkdl.etl.samples import write_samples

    try:
        check_json_out(args.json_out)
        if Path(args.dir).exists() and not Path(args.dir).is_dir():
            return fail("samples", f"{args.dir} exists and is not a directory")
        written = write_samples(args.dir)
    except (SparkDLError, OSError) as exc:
        return fail("samples", _describe(exc))
    emit_result(written, args.json_out)
    return 0


def run_report(args: argparse.Namespace) -> int:
    """Write RUN_DIR/report.html."""
    from sparkdl.report import write_report

    try:
        check_json_out(args.json_out)
        path = write_report(args.run_dir)
    except SparkDLError as exc:
        return fail("report", str(exc))
    emit_result({"report": str(path)}, args.json_out)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """Check a configuration the way every stage does before Spark starts."""
    from sparkdl.preflight import MODEL_CHECKED, preflight

    quiet_tensorflow(load=args.stage in MODEL_CHECKED)  # only a model check needs it

    try:
        check_json_out(args.json_out)
        config = load_job_config(args.conf, args.overrides)
        preflight(config, args.stage)
    except SparkDLError as exc:
        return fail("validate", str(exc))
    emit_result({"valid": True, "conf": args.conf, "stage": args.stage,
                 "pipeline": config.data.pipeline, "model": config.model.name,
                 "data_dir": config.data.dir, "output_dir": config.output.dir}, args.json_out)
    return 0


def run_benchmark(argv: Sequence[str]) -> int:
    """``sparkdl benchmark ...`` is ``jobs/benchmark.py ...``: the benchmarks are the source
    tree's ``benchmarks/`` (not installed), found beside a sparkdl installed editable."""
    source_tree = Path(__file__).resolve().parents[1]
    if not (source_tree / "benchmarks" / "cli.py").is_file():
        return fail("benchmark", f"the benchmarks are not installed with sparkdl ({source_tree} "
                    "has no benchmarks/): install sparkdl from a source checkout "
                    "(pip install -e .) or run python jobs/benchmark.py there")
    tree = str(source_tree)
    if tree not in sys.path:
        sys.path.insert(0, tree)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if tree not in paths:  # the benchmarks' Spark workers import them too
        os.environ["PYTHONPATH"] = os.pathsep.join([tree, *paths])
    cli = importlib.import_module("benchmarks.cli")
    return int(cli.main(argv))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


RUNNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    **dict.fromkeys(STAGES, run_stage),
    "samples": run_samples,
    "report": run_report,
    "validate": run_validate,
}


def main(argv: Sequence[str] | None = None, stage: str | None = None) -> int:
    """Run ``sparkdl ARGV`` (or, with ``stage``, ``jobs/STAGE.py ARGV``); return the exit
    status (2: refused, with one line on stderr)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if stage is not None:
        args = stage_parser(stage).parse_args(argv)
    elif argv[:1] == ["benchmark"]:
        return run_benchmark(argv[1:])
    else:
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:  # "sparkdl etl: error: unrecognized arguments: --resume", exit 2
            args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return RUNNERS[args.command](args)


def exit_quickly(status: int) -> NoReturn:
    """End a job's process with ``status`` as Python's exit would, less the interpreter's
    teardown of its modules (1.3-1.6 s with TensorFlow and pyspark loaded, all of it the
    destructors of objects the process no longer needs): wait for the threads Python would
    wait for (a bounded wait), run the ``atexit`` handlers (temporary directories, logging's
    flush, a coverage hook), flush the standard streams, then ``os._exit``."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join(_THREAD_JOIN_S)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


#: How long :func:`exit_quickly` waits for each thread that is not a daemon.
_THREAD_JOIN_S = 60.0


if __name__ == "__main__":
    exit_quickly(main())
