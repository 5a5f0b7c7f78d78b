"""Bad inputs that need no Spark: each gets one clear sparkdl error (what, where), a non-zero
exit from the CLI, and leaves nothing half-written. The Spark ones are in
tests/integration/test_bad_inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_harness import run_cli as _run

from sparkdl.data.writer import check_replaceable
from sparkdl.errors import DataError

# --- item 1: only what sparkdl wrote is replaced ---------------------------------------------

def test_user_folder_is_not_replaceable(tmp_path: Path) -> None:
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(DataError, match=r"train holds files sparkdl did not write \(thesis.tex"):
        check_replaceable(folder.as_uri())
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_a_file_is_not_replaceable(tmp_path: Path) -> None:
    (tmp_path / "train").write_text("x")
    with pytest.raises(DataError, match="train exists and is not a directory"):
        check_replaceable((tmp_path / "train").as_uri())


def test_sparkdl_or_empty_or_absent_is_replaceable(tmp_path: Path) -> None:
    check_replaceable((tmp_path / "absent").as_uri())
    (tmp_path / "empty").mkdir()
    check_replaceable((tmp_path / "empty").as_uri())
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "_sparkdl.json").write_text("{}")
    (tmp_path / "shards" / "part-00000.parquet").write_text("")
    check_replaceable((tmp_path / "shards").as_uri())
    with pytest.raises(DataError, match=r"no _sparkdl_predictions\.json"):
        check_replaceable((tmp_path / "shards").as_uri(), marker="_sparkdl_predictions.json")


# --- configuration and CLI: `sparkdl validate` (no Spark), one line on stderr, exit 2 ----------

def _conf(tmp_path: Path, text: str = "", name: str = "job.yaml") -> Path:
    data = tmp_path / "data"
    out = tmp_path / "run"
    conf = tmp_path / name
    conf.write_text(f"data:\n  dir: {data}\noutput:\n  dir: {out}\n{text}")
    return conf


def _refused(capsys, argv: list[str], message: str) -> str:
    import re

    rc, out, err = _run(capsys, argv)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and out == ""
    assert re.search(message, err), err
    return err


BAD_SETS = [
    ("training.num_workers=true", r"training\.num_workers: input should be a valid integer, "
                                  r"got True"),
    ("training.epochs=1.5", r"training\.epochs: input should be a valid integer"),
    ("cluster.timeout_s=.inf", r"cluster\.timeout_s: input should be a finite number"),
    ("model.optimizer.learning_rate=.nan", r"model\.optimizer\.learning_rate: input should be "
                                           r"a finite number"),
    ("training.threshold.initial=-.inf", r"training\.threshold\.initial"),
    ("training.threshold.min_sparsity=0.5", r"min_sparsity \(0\.5\) must be <= max_sparsity"),
    ("training.verbose=true", r"training\.verbose"),
    ("data.overwrite=1", r"data\.overwrite: input should be a valid boolean"),
    ("cluster.port_range=70000-70001", r"cluster\.port_range: .*65535"),
    ("cluster.port_range=abc", r"cluster\.port_range: .*'LOW-HIGH'"),
    ("cluster.network_mask=10.0.0.0/99", r"cluster\.network_mask: expected CIDR"),
    ("cluster.network_mask=198.51.100.0/24", r"cluster\.network_mask: no local address inside "
                                          r"198\.51\.100\.0/24"),
    ("data.pipeline=nosuch", r"unknown pipeline 'nosuch'; known: csv, digits"),
    ("data.options.colour=red", r"data\.options\.colour: unknown option for the digits "
                                r"pipeline"),
    ("data.options.test_fraction=2", r"data\.options\.test_fraction: must be in \(0, 1\)"),
    ("data.options.seed=x", r"data\.options\.seed: expected int, got 'x'"),
    ("data.options.normalizer=bogus", r"data\.options\.normalizer: unknown normalizer 'bogus'"),
    ("data.options.rows_per_group=0", r"data\.options\.rows_per_group: must be > 0"),
    ("model.name=nosuch", r"model\.name: unknown model 'nosuch'"),
    ("model.name=no_such_module:build", r"model\.name: cannot import 'no_such_module:build'"),
    ("model.params.colour=1", r"model\.params: mlp: got an unexpected keyword argument "
                              r"'colour'"),
    ("model.optimizer.name=sgdx", r"model\.optimizer\.name: unknown optimizer 'sgdx'"),
    ("model.loss=hinge_of_doom", r"model\.loss: unknown loss 'hinge_of_doom'"),
    ("training.mode=sideways", r"training\.mode"),
    ("nonsense=1", r"unknown key 'nonsense'"),
    ("training", r"--set expects key=value"),
    ("training.epochs=*x", r"--set training\.epochs: .*aliases"),
    # DL4J's knobs (issue 14) and the fit's (issue 9)
    ("training.threshold.decay=1.5", r"training\.threshold\.decay"),
    ("training.shake_up.factor=0", r"training\.shake_up\.factor"),
    ("training.prefetch=0", r"training\.prefetch"),
    ("training.decode_threads=true", r"training\.decode_threads"),
    ("training.report_score_after_averaging=maybe", r"training\.report_score_after_averaging"),
    ("training.validation_freq=0", r"training\.validation_freq"),
    ("training.log_every_steps=-1", r"training\.log_every_steps"),
    ("training.verbose=3", r"training\.verbose"),
    # values that used to pass validate and fail after Spark started (issue 20)
    ("training.seed=4294967296", r"training\.seed: input should be less than 4294967296"),
    ("cluster.timeout_s=1e10", r"cluster\.timeout_s: input should be less than or equal to"),
    ("evaluation.metrics=[top_n:0]", r"evaluation\.metrics: .*'top_n:0': top_n's n must be "
                                     r"at least 1"),
    ("evaluation.metrics=[roc:0]", r"evaluation\.metrics: .*'roc:0': .*at least 1"),
    ("model.params.hidden=[64, 0]", r"model\.params\.hidden: expected a list of positive "
                                    r"integers \(units per hidden layer\), got \[64, 0\]"),
    ("model.params.hidden=[-3]", r"model\.params\.hidden: .*got \[-3\]"),
    ("model.params.hidden=[1.5]", r"model\.params\.hidden: .*got \[1\.5\]"),
    ("model.params.hidden=abc", r"model\.params\.hidden: .*got 'abc'"),
    ("model.params.hidden=5", r"model\.params\.hidden: .*got 5"),
    ("model.params.hidden=[true]", r"model\.params\.hidden: .*got \[True\]"),
    ("model.params.dropout=1.0", r"model\.params\.dropout: expected a number in \[0, 1\), "
                                 r"got 1\.0"),
    # class weights that fit refused only after Spark had started
    ("training.class_weight={0: -1}", r"training\.class_weight: .*class 0's weight must be a "
                                      r"finite number >= 0, got -1"),
    ("training.class_weight={-2: 1}", r"training\.class_weight: .*class index -2 is negative"),
    ("training.class_weight={}", r"training\.class_weight: .*at least one class"),
    # absurd values (issue 52, finding 8)
    ("training.powersgd.rank=100000", r"training\.powersgd\.rank: input should be less than "
                                      r"or equal to 1024, got 100000"),
]

# Keys that mean something only together, each refused in one short line naming the key(s)
# and value(s), never the whole section (issue 52, finding 8).
CROSS_FIELD = [
    (["training.mode=averaging", "training.overlap=true"],
     r"training\.overlap: true applies to mode 'sharing' or 'dense', not 'averaging'"),
    (["training.mode=sharing", "training.wire_dtype=bfloat16"],
     r"training\.wire_dtype: 'bfloat16' applies to mode 'dense', not 'sharing'"),
    (["training.mode=averaging", "training.accumulate_steps=4"],
     r"training\.accumulate_steps: 4 applies to mode 'dense', not 'averaging'"),
    (["training.mode=averaging", "training.compression=powersgd"],
     r"training\.compression: 'powersgd' applies to mode 'sharing' or 'auto', not 'averaging'"),
    (["training.mode=dense", "training.compression=powersgd"],
     r"training\.compression: 'powersgd' applies to mode 'sharing' or 'auto', not 'dense'"),
    (["training.elastic={min_workers: 3}", "training.checkpoint_dir=/tmp/x"],
     r"training\.elastic\.min_workers=3 is more than num_workers=2"),
    (["training.elastic={min_workers: 1}"], r"training\.elastic needs checkpoint_dir"),
    (["training.threshold.min_sparsity=0.5"],
     r"training\.threshold\.min_sparsity \(0\.5\) must be <= max_sparsity \(0\.01\)"),
    (["cluster.master=spark://h:7077", "cluster.spark_conf={spark.executor.cores: 4}",
      "cluster.task_cpus=8"],
     r"cluster\.task_cpus=8 is more than spark\.executor\.cores=4"),
]


@pytest.mark.parametrize(("overrides", "message"), CROSS_FIELD,
                         ids=[" ".join(o) for o, _ in CROSS_FIELD])
def test_validate_refuses_keys_that_mean_nothing_together_in_one_short_line(
        capsys, tmp_path: Path, overrides: list[str], message: str) -> None:
    conf = _conf(tmp_path)
    err = _refused(capsys, ["validate", "--conf", str(conf),
                            *[arg for o in overrides for arg in ("--set", o)]], message)
    line = err.strip()
    assert "\n" not in line and "{'" not in line and len(line) < 200, line


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    """What SparkLauncher.check_slots reads of a session: its settings."""

    def __init__(self, **values: str) -> None:
        self.conf = _Conf({k.replace("_", "."): v for k, v in values.items()})


@pytest.mark.parametrize(("conf", "message"), [
    ({"spark_master": "local[2]"},
     r"^cluster\.task_cpus=1000 is more than the 2 cores of master local\[2\]"),
    ({"spark_master": "spark://h:7077", "spark_executor_cores": "4"},
     r"^cluster\.task_cpus=1000 is more than spark\.executor\.cores=4"),
])
def test_task_cpus_beyond_what_the_session_has_fail_before_the_training_stage(
        conf: dict[str, str], message: str) -> None:
    """The master and spark.executor.cores that apply are known only once Spark runs
    (spark-submit's win over the configuration's): the launcher checks them before the
    training stage, which would otherwise wait for a slot no executor has."""
    from sparkdl.errors import ConfigurationError
    from sparkdl.spark.launcher import SparkLauncher

    launcher = object.__new__(SparkLauncher)
    launcher.spark = _Session(spark_default_parallelism="8", **conf)  # type: ignore[assignment]
    launcher.task_cpus, launcher.task_gpus, launcher.threads_per_worker = 1000, None, 1000
    with pytest.raises(ConfigurationError, match=message):
        launcher.check_slots(1)
    launcher.task_cpus = launcher.threads_per_worker = 2
    launcher.check_slots(1)


def test_validate_refuses_class_weight_ids_the_shards_do_not_have(capsys,
                                                                  tmp_path: Path) -> None:
    """The train shards the ETL wrote say their classes: a class_weight key outside them is
    refused by validate --stage train and by the train stage before Spark starts, not by fit
    after it (finding 7). The pipeline stage writes its shards first: fit checks them then."""
    from sparkdl.data.metadata import FORMAT_VERSION, ShardFile, ShardMetadata, write_metadata

    train = tmp_path / "data" / "train"
    train.mkdir(parents=True)
    (train / "part-00000.parquet").write_bytes(b"")
    write_metadata(str(train), ShardMetadata(
        format_version=FORMAT_VERSION, feature_shape=[4], feature_dtype="float32",
        label_kind="class", classes=["a", "b", "c"], label_shape=[], num_rows=5,
        files=[ShardFile("part-00000.parquet", 5, [5])], normalizer=None, transform=None,
        extra={}))
    conf = _conf(tmp_path)
    _refused(capsys, ["validate", "--conf", str(conf), "--stage", "train",
                      "--set", "training.class_weight={5: 2}"],
             r"training\.class_weight key 5 is not a class index in \[0, 3\) of the shards at "
             r".*train \(classes \['a', 'b', 'c'\]\)")
    _refused(capsys, ["train", "--conf", str(conf), "--set", "training.class_weight={5: 2}"],
             r"training\.class_weight key 5 is not a class index")
    rc, _, err = _run(capsys, ["validate", "--conf", str(conf), "--stage", "train",
                                 "--set", "training.class_weight={2: 2}"])
    assert rc == 0, err


@pytest.mark.parametrize(("override", "message"), BAD_SETS, ids=[s for s, _ in BAD_SETS])
def test_validate_refuses_bad_config(capsys, tmp_path: Path, override: str, message: str) -> None:
    conf = _conf(tmp_path)
    _refused(capsys, ["validate", "--conf", str(conf), "--set", override], message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]  # nothing written


def test_validate_accepts_a_good_config(capsys, tmp_path: Path) -> None:
    import json

    conf = _conf(tmp_path)
    knobs = ["training.threshold.decay=0.9", "training.shake_up.factor=0.333",
             "training.shake_up.frequency=50", "training.prefetch=8", "training.decode_threads=3",
             "training.report_score_after_averaging=true", "training.validation=none",
             "training.validation_freq=2", "training.log_every_steps=10", "training.verbose=2"]
    rc, out, err = _run(capsys, ["validate", "--conf", str(conf),
                                 *[arg for knob in knobs for arg in ("--set", knob)]])
    assert rc == 0, err
    result = json.loads(out)
    assert result["valid"] is True and result["pipeline"] == "digits"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def test_output_dir_that_is_a_file_is_found_before_training(capsys, tmp_path: Path) -> None:
    """Item 3: found by the train stage's preflight, before Spark starts or training runs."""
    (tmp_path / "run").write_text("not a directory")
    conf = _conf(tmp_path)
    _refused(capsys, ["train", "--conf", str(conf)],
             r"sparkdl train: error: output\.dir: .*run cannot be a directory: .*run is a file")
    _refused(capsys, ["validate", "--conf", str(conf), "--set", f"output.dir={tmp_path}/run/x"],
             r"output\.dir: .*run/x cannot be a directory: .*run is a file \(its parent")
    assert (tmp_path / "run").read_text() == "not a directory"


@pytest.mark.parametrize("key", ["data.dir", "training.checkpoint_dir",
                                 "training.tensorboard_dir", "training.timeline"])
def test_directories_that_are_files(capsys, tmp_path: Path, key: str) -> None:
    import re

    (tmp_path / "blocker").write_text("x")
    conf = _conf(tmp_path)
    _refused(capsys, ["validate", "--conf", str(conf), "--set", f"{key}={tmp_path}/blocker"],
             re.escape(key) + r": .*blocker is a file")


def test_unwritable_output_dir(capsys, tmp_path: Path) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    conf = _conf(tmp_path)
    try:
        _refused(capsys, ["validate", "--conf", str(conf), "--set", f"output.dir={locked}/run"],
                 r"output\.dir: .*locked is not writable")
    finally:
        locked.chmod(0o700)


def test_etl_overwrite_of_a_user_folder_is_found_first(capsys, tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    (tmp_path / "data" / "test").mkdir(parents=True)
    (tmp_path / "data" / "test" / "keep.csv").write_text("1,2\n")
    _refused(capsys, ["etl", "--conf", str(conf)],
             r"sparkdl etl: error: .*data/test holds files sparkdl did not write \(keep\.csv")
    assert (tmp_path / "data" / "test" / "keep.csv").read_text() == "1,2\n"


def test_predictions_over_a_user_folder(capsys, tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    (tmp_path / "run" / "predictions").mkdir(parents=True)
    (tmp_path / "run" / "predictions" / "mine.parquet").write_text("x")
    _refused(capsys, ["validate", "--conf", str(conf), "--stage", "predict"],
             r"predictions holds files sparkdl did not write \(mine\.parquet; no "
             r"_sparkdl_predictions\.json\)")


@pytest.mark.parametrize(("options", "message"), [
    ("{path: /no/such/file.csv, columns: {a: double, b: string}, transform: []}",
     r"data\.options\.path: /no/such/file\.csv does not exist"),
    ("{path: /etc/hostname, columns: {a: bogus_type}, transform: []}",
     r"data\.options\.columns"),
    ("{header: 'yes'}", r"data\.options\.header: expected bool, got 'yes'"),
    ("{nan_policy: ignore}", r"data\.options\.nan_policy: must be one of"),
])
def test_csv_options(capsys, tmp_path: Path, options: str, message: str) -> None:
    conf = tmp_path / "x.yaml"
    conf.write_text(f"data:\n  dir: {tmp_path}/data\n  pipeline: iris\n  options: {options}\n"
                    f"output:\n  dir: {tmp_path}/run\n")
    _refused(capsys, ["validate", "--conf", str(conf)], message)


# --- item 10: one clear message, never a traceback -------------------------------------------

def test_config_not_utf8(capsys, tmp_path: Path) -> None:
    conf = tmp_path / "latin1.yaml"
    conf.write_bytes(b"training:\n  mode: caf\xe9\n")
    _refused(capsys, ["validate", "--conf", str(conf)],
             r"latin1\.yaml: not UTF-8 text \(byte 0xe9 at offset 21\)")


def test_config_nested_thousands_deep(capsys, tmp_path: Path) -> None:
    conf = tmp_path / "deep.yaml"
    conf.write_text("data:\n  options:\n    x: " + "[" * 5000 + "]" * 5000 + "\n")
    _refused(capsys, ["validate", "--conf", str(conf)],
             r"deep\.yaml: line 3: nested more than 64 levels deep")


def test_config_alias_bomb_fails_fast(capsys, tmp_path: Path) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    conf = tmp_path / "bomb.yaml"
    conf.write_text("\n".join(lines) + "\n")
    assert len(conf.read_bytes()) < 600
    # refused at the first alias (line 2), before anything is expanded; pytest's timeout
    # bounds a hang
    _refused(capsys, ["validate", "--conf", str(conf)],
             r"bomb\.yaml: line 2: YAML aliases \(\*name\) are not allowed")


@pytest.mark.parametrize(("text", "message"), [
    ("- a\n- b\n", r"expected a mapping of sections, got list"),
    ("training: [unclosed\n", r"not valid YAML"),
    ("training:\n  epochs: 0\n", r"training\.epochs: input should be greater than or equal"),
])
def test_config_file_shape(capsys, tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text(text)
    _refused(capsys, ["validate", "--conf", str(conf)], rf"c\.yaml: {message}")


def test_an_empty_config_is_refused_before_anything_runs(capsys, tmp_path: Path) -> None:
    conf = tmp_path / "empty.yaml"
    conf.write_text("# to do\n")
    _refused(capsys, ["train", "--conf", str(conf)],
             r"sparkdl train: error: the config .*empty\.yaml is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.yaml"]


def test_a_duplicate_key_is_refused_naming_key_and_line(capsys, tmp_path: Path) -> None:
    conf = tmp_path / "dup.yaml"
    conf.write_text("output:\n  dir: a\n  dir: b\n")
    _refused(capsys, ["validate", "--conf", str(conf)],
             r"dup\.yaml: line 3: duplicate key 'dir' \(first on line 2\)")


def test_config_file_missing(capsys, tmp_path: Path) -> None:
    _refused(capsys, ["train", "--conf", str(tmp_path / "nope.yaml")],
             r"sparkdl train: error: configuration file .*nope\.yaml does not exist")


def test_log_level_verbose(capsys, tmp_path: Path) -> None:
    rc, _, err = _run(capsys, ["train", "--conf", str(_conf(tmp_path)),
                                 "--log-level", "verbose"])
    assert rc == 2 and "Traceback" not in err
    assert "argument --log-level: invalid choice: 'VERBOSE'" in err
    assert "DEBUG" in err  # the choices are listed


def test_unknown_stage(capsys) -> None:
    rc, _, err = _run(capsys, ["trian", "--conf", "x.yaml"])
    assert rc == 2 and "invalid choice: 'trian'" in err


def test_samples_into_a_file(capsys, tmp_path: Path) -> None:
    target = tmp_path / "data.txt"
    target.write_text("mine")
    _refused(capsys, ["samples", str(target)],
             r"sparkdl samples: error: .*data\.txt exists and is not a directory")
    assert target.read_text() == "mine"
    _refused(capsys, ["samples", str(target / "sub")], r"sparkdl samples: error: .*data\.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.txt"]


def test_report_of_a_missing_run(capsys, tmp_path: Path) -> None:
    _refused(capsys, ["report", str(tmp_path / "nope")], r"sparkdl report: error: ")


def test_stage_output_dir_that_is_a_file(tmp_path: Path) -> None:
    """run_train called directly (no CLI preflight) also fails before training."""
    from sparkdl.config import load_config
    from sparkdl.errors import ConfigurationError
    from sparkdl.stages import output_dir

    (tmp_path / "run").write_text("x")
    for target in ("run", "run/sub"):
        config = load_config(None, [f"output.dir={tmp_path / target}"])
        with pytest.raises(ConfigurationError, match=r"output\.dir: .*run.* cannot be a directory"):
            output_dir(config)
    assert (tmp_path / "run").read_text() == "x"
    assert output_dir(load_config(None, [f"output.dir={tmp_path / 'new'}"])).dir.is_dir()
