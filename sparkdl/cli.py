"""Command line for the job stages: ``sparkdl STAGE --conf FILE [--set key=value ...]``.

``sparkdl report RUN_DIR`` (re)writes ``RUN_DIR/report.html`` from its ``metrics.json`` and
``evaluation.json``.

``sparkdl validate --conf FILE [--set key=value ...] [--stage STAGE]`` checks a configuration
without Spark (the same :func:`~sparkdl.preflight.preflight` every stage runs before Spark
starts) and prints ``{"valid": true, ...}``; a bad one exits 2 with the message on stderr.

``sparkdl samples [DIR]`` writes the sample inputs of ``conf/mnist.yaml``, ``conf/csv.yaml``
and ``conf/images.yaml`` (default ``data/``, where those confs look).

``jobs/etl.py``, ``jobs/train.py``, ``jobs/evaluate.py``, ``jobs/predict.py`` and
``jobs/pipeline.py`` are this command with the stage fixed, for ``spark-submit``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkdl.errors import SparkDLError
from sparkdl.job_output import check_json_out, emit_result, fail
from sparkdl.logs import LEVELS, configure_logging, quiet_tensorflow

STAGES = ("etl", "train", "evaluate", "predict", "pipeline")


def build_parser(stage: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"sparkdl {stage}" if stage else "sparkdl",
        description="Run a sparkdl job stage on Spark.",
    )
    if stage is None:
        parser.add_argument("stage", choices=STAGES, help="the stage to run (or: samples [DIR], "
                            "report RUN_DIR, validate --conf FILE)")
    parser.add_argument("--conf", required=True, help="YAML job configuration (conf/*.yaml)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a configuration key, e.g. --set training.mode=averaging (repeatable)",
    )
    if stage in (None, "train", "pipeline"):
        parser.add_argument(
            "--resume", action="store_true",
            help="continue from the latest checkpoint in training.checkpoint_dir",
        )
    parser.add_argument(
        "--json-out", metavar="PATH",
        help="also write the result (the JSON last line of stdout) to PATH, atomically",
    )
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LEVELS,
        help="level of sparkdl's own log (default INFO)",
    )
    return parser


def samples_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sparkdl samples",
        description="Write sample inputs for conf/mnist.yaml, conf/csv.yaml and "
                    "conf/images.yaml, made from scikit-learn's digits and iris.",
    )
    parser.add_argument("dir", nargs="?", default="data",
                        help="where to write them (default: data, where the confs look)")
    parser.add_argument(
        "--json-out", metavar="PATH",
        help="also write the result (the JSON last line of stdout) to PATH, atomically",
    )
    args = parser.parse_args(argv)
    from sparkdl.etl.samples import write_samples

    try:
        check_json_out(args.json_out)
    except SparkDLError as exc:
        return fail("samples", str(exc))
    root = Path(args.dir)
    if root.exists() and not root.is_dir():
        print(f"sparkdl samples: error: {args.dir} exists and is not a directory",
              file=sys.stderr, flush=True)
        return 2
    try:
        written = write_samples(args.dir)
    except (SparkDLError, OSError) as exc:
        print(f"sparkdl samples: error: {_describe(exc)}", file=sys.stderr, flush=True)
        return 2
    emit_result(written, args.json_out)
    return 0


def validate_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sparkdl validate",
        description="Check a job configuration without starting Spark: keys and types, "
                    "pipeline and options, model, optimizer, addresses, output directories.",
    )
    parser.add_argument("--conf", required=True, help="YAML job configuration (conf/*.yaml)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a configuration key (repeatable)",
    )
    parser.add_argument("--stage", choices=STAGES, default="pipeline",
                        help="check what this stage needs (default: pipeline, i.e. all)")
    parser.add_argument(
        "--json-out", metavar="PATH",
        help="also write the result (the JSON last line of stdout) to PATH, atomically",
    )
    args = parser.parse_args(argv)
    quiet_tensorflow()
    from sparkdl.config import load_config
    from sparkdl.preflight import preflight

    try:
        check_json_out(args.json_out)
        config = load_config(args.conf, args.overrides)
        preflight(config, args.stage)
    except SparkDLError as exc:
        print(f"sparkdl validate: error: {exc}", file=sys.stderr, flush=True)
        return 2
    emit_result({"valid": True, "conf": args.conf, "stage": args.stage,
                 "pipeline": config.data.pipeline, "model": config.model.name,
                 "data_dir": config.data.dir, "output_dir": config.output.dir}, args.json_out)
    return 0


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


def report_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sparkdl report",
        description="Write RUN_DIR/report.html: plots of a run's history and evaluation.",
    )
    parser.add_argument("run_dir", help="a run's output.dir (holds metrics.json)")
    parser.add_argument(
        "--json-out", metavar="PATH",
        help="also write the result (the JSON last line of stdout) to PATH, atomically",
    )
    args = parser.parse_args(argv)
    from sparkdl.report import write_report

    try:
        check_json_out(args.json_out)
        path = write_report(args.run_dir)
    except SparkDLError as exc:
        print(f"sparkdl report: error: {exc}", file=sys.stderr, flush=True)
        return 2
    emit_result({"report": str(path)}, args.json_out)
    return 0


def main(argv: Sequence[str] | None = None, stage: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if stage is None and argv[:1] == ["samples"]:
        return samples_main(argv[1:])
    if stage is None and argv[:1] == ["report"]:
        return report_main(argv[1:])
    if stage is None and argv[:1] == ["validate"]:
        return validate_main(argv[1:])
    args = build_parser(stage).parse_args(argv)
    stage = stage or args.stage
    configure_logging(args.log_level)
    quiet_tensorflow()
    from sparkdl import stages
    from sparkdl.config import load_config
    from sparkdl.data.spark_errors import quiet_task_failures
    from sparkdl.preflight import preflight
    from sparkdl.session import get_spark

    spark = None
    try:
        check_json_out(args.json_out)
        config = load_config(args.conf, args.overrides)
        preflight(config, stage)  # everything checkable without Spark, before Spark starts
        spark = get_spark(config.cluster)
        quiet_task_failures(spark)  # a bad record is one line, not a JVM stack trace
        run = getattr(stages, f"run_{stage}")
        resume = stage in ("train", "pipeline") and getattr(args, "resume", False)
        result = run(config, spark, resume=True) if resume else run(config, spark)
    except SparkDLError as exc:
        print(f"sparkdl {stage}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if spark is not None:
            spark.stop()  # a job owns its session; stopping it lets executors exit cleanly
    emit_result(result, args.json_out)  # one JSON object, the last line
    return 0


if __name__ == "__main__":
    sys.exit(main())
