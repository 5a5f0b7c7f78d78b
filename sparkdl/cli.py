"""Command line for the job stages: ``sparkdl STAGE --conf FILE [--set key=value ...]``.

``sparkdl report RUN_DIR`` (re)writes ``RUN_DIR/report.html`` from its ``metrics.json`` and
``evaluation.json``.

``sparkdl samples [DIR]`` writes the sample inputs of ``conf/mnist.yaml``, ``conf/csv.yaml``
and ``conf/images.yaml`` (default ``data/``, where those confs look).

``jobs/etl.py``, ``jobs/train.py``, ``jobs/evaluate.py``, ``jobs/predict.py`` and
``jobs/pipeline.py`` are this command with the stage fixed, for ``spark-submit``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from sparkdl.errors import SparkDLError
from sparkdl.logs import LEVELS, configure_logging, quiet_tensorflow

STAGES = ("etl", "train", "evaluate", "predict", "pipeline")


def build_parser(stage: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"sparkdl {stage}" if stage else "sparkdl",
        description="Run a sparkdl job stage on Spark.",
    )
    if stage is None:
        parser.add_argument("stage", choices=STAGES, help="the stage to run (or: samples [DIR])")
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
    args = parser.parse_args(argv)
    from sparkdl.etl.samples import write_samples

    print(json.dumps(write_samples(args.dir), indent=2), flush=True)
    return 0


def report_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="sparkdl report",
        description="Write RUN_DIR/report.html: plots of a run's history and evaluation.",
    )
    parser.add_argument("run_dir", help="a run's output.dir (holds metrics.json)")
    args = parser.parse_args(argv)
    from sparkdl.report import write_report

    try:
        path = write_report(args.run_dir)
    except SparkDLError as exc:
        print(f"sparkdl report: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps({"report": str(path)}), flush=True)
    return 0


def main(argv: Sequence[str] | None = None, stage: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if stage is None and argv[:1] == ["samples"]:
        return samples_main(argv[1:])
    if stage is None and argv[:1] == ["report"]:
        return report_main(argv[1:])
    args = build_parser(stage).parse_args(argv)
    stage = stage or args.stage
    configure_logging(args.log_level)
    quiet_tensorflow()
    from sparkdl import stages
    from sparkdl.config import load_config
    from sparkdl.session import get_spark

    spark = None
    try:
        config = load_config(args.conf, args.overrides)
        spark = get_spark(config.cluster)
        run = getattr(stages, f"run_{stage}")
        resume = stage in ("train", "pipeline") and getattr(args, "resume", False)
        result = run(config, spark, resume=True) if resume else run(config, spark)
    except SparkDLError as exc:
        print(f"sparkdl {stage}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if spark is not None:
            spark.stop()  # a job owns its session; stopping it lets executors exit cleanly
    print(json.dumps(result, default=str), flush=True)  # one JSON object, the last line
    return 0


if __name__ == "__main__":
    sys.exit(main())
