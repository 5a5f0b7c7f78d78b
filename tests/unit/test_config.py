"""Configuration loading, validation and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdl.config import JobConfig, load_config, parse_override
from sparkdl.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_conf_loads():
    confs = sorted((REPO / "conf").glob("*.yaml"))
    assert confs, "conf/ has no YAML files"
    for conf in confs:
        assert isinstance(load_config(conf), JobConfig)


def test_overrides_apply_with_yaml_types():
    config = load_config(
        REPO / "conf" / "digits.yaml",
        ["output.dir=runs/run1", "training.mode=averaging", "training.epochs=3",
         "model.params.hidden=[32, 16]", "cluster.spark_conf.spark.executor.cores=1"],
    )
    assert config.output.dir == "runs/run1"
    assert config.training.mode == "averaging"
    assert config.training.epochs == 3
    assert config.model.params["hidden"] == [32, 16]
    assert config.cluster.spark_conf["spark.executor.cores"] == "1"


def test_unknown_key_is_named(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text("training:\n  epochz: 3\n")
    with pytest.raises(ConfigurationError, match=r"bad.yaml: unknown key 'training.epochz'"):
        load_config(conf)


def test_wrong_type_is_named(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text("training:\n  epochs: ten\n")
    with pytest.raises(ConfigurationError, match=r"training\.epochs: .*integer.*'ten'"):
        load_config(conf)


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("training.mode=sideways", r"training\.mode"),
        ("training.num_workers=0", r"training\.num_workers"),
        ("cluster.transport=udp", r"cluster\.transport"),
        ("cluster.timeout_s=-1", r"cluster\.timeout_s"),
        ("nonsense=1", r"unknown key 'nonsense'"),
        ("training.threshold.decay=1.0", r"training\.threshold\.decay: .*less than 1"),
        ("training.threshold.decay=0", r"training\.threshold\.decay"),
        ("training.shake_up.factor=1.5", r"training\.shake_up\.factor"),
        ("training.report_score_after_averaging=maybe",
         r"training\.report_score_after_averaging"),
    ],
)
def test_bad_override_values(override, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        load_config(REPO / "conf" / "digits.yaml", [override])


def test_threshold_knobs_and_score_after_averaging_from_yaml():
    config = load_config(
        REPO / "conf" / "digits.yaml",
        ["training.threshold.decay=0.95", "training.shake_up.factor=0.3333",
         "training.shake_up.frequency=10", "training.report_score_after_averaging=true"],
    )
    assert config.training.threshold.decay == 0.95
    assert config.training.shake_up.factor == 0.3333
    assert config.training.report_score_after_averaging is True
    assert JobConfig().training.threshold.initial == 1e-3


def test_malformed_override():
    with pytest.raises(ConfigurationError, match="key=value"):
        parse_override("training.epochs")
    with pytest.raises(ConfigurationError, match="holds a value"):
        load_config(data={"training": {"epochs": 3}}, overrides=["training.epochs.x=1"])


def test_missing_file():
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_config("no/such/conf.yaml")


def test_yaml_floats_without_a_dot_are_numbers(tmp_path):
    """PyYAML reads ``1e-3`` as a string; a configuration reads it as the number users mean."""
    conf = tmp_path / "job.yaml"
    conf.write_text("model:\n  optimizer:\n    learning_rate: 2e-3\ntraining:\n  threshold:\n"
                    "    initial: 1E-4\n")
    config = load_config(conf, ["cluster.timeout_s=1e2"])
    assert config.model.optimizer.learning_rate == 0.002
    assert config.training.threshold.initial == 1e-4 and config.cluster.timeout_s == 100.0


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("training.seed=4294967296", r"training\.seed: .*less than 4294967296"),
        ("training.seed=-1", r"training\.seed: .*greater than or equal to 0"),
        ("cluster.timeout_s=1e10", r"cluster\.timeout_s: .*less than or equal to"),
        ("evaluation.metrics=[top_n:0]", r"evaluation\.metrics: .*top_n:0.*at least 1"),
        ("evaluation.metrics=[roc:0]", r"evaluation\.metrics: .*roc:0.*at least 1"),
        ("evaluation.metrics=[roc:abc]", r"evaluation\.metrics: .*roc:abc.*integer"),
    ],
)
def test_values_that_would_fail_after_spark_starts_are_refused_when_loading(override, pattern):
    with pytest.raises(ConfigurationError, match=pattern):
        load_config(REPO / "conf" / "digits.yaml", [override])


def test_an_empty_config_file_is_refused_naming_it(tmp_path):
    for text in ("", "# nothing but a comment\n", "---\n"):
        conf = tmp_path / "empty.yaml"
        conf.write_text(text)
        with pytest.raises(ConfigurationError, match=r"the config .*empty\.yaml is empty"):
            load_config(conf)


def test_an_explicitly_empty_mapping_means_every_default(tmp_path):
    conf = tmp_path / "defaults.yaml"
    conf.write_text("{}\n")
    assert load_config(conf) == JobConfig()


def test_a_duplicate_key_is_named_with_its_line(tmp_path):
    conf = tmp_path / "dup.yaml"
    conf.write_text("training:\n  epochs: 3\n  mode: dense\n  epochs: 5\n")
    with pytest.raises(ConfigurationError,
                       match=r"dup\.yaml: line 4: duplicate key 'epochs' \(first on line 2\)"):
        load_config(conf)


def test_a_duplicate_section_is_named_with_its_line(tmp_path):
    conf = tmp_path / "dup.yaml"
    conf.write_text("training:\n  epochs: 3\noutput:\n  dir: a\ntraining:\n  mode: dense\n")
    with pytest.raises(ConfigurationError, match=r"line 5: duplicate key 'training'"):
        load_config(conf)


def test_a_duplicate_key_in_an_override_value_is_named():
    with pytest.raises(ConfigurationError, match=r"--set model\.params: .*duplicate key 'a'"):
        load_config(REPO / "conf" / "digits.yaml", ["model.params={a: 1, a: 2}"])


def test_class_weight_and_sample_weight_column_come_from_yaml():
    config = load_config(REPO / "conf" / "csv.yaml",
                         ["training.class_weight={0: 1.0, 2: 4}", "data.sample_weight_column=w"])
    assert config.training.class_weight == {0: 1.0, 2: 4.0}
    assert config.data.sample_weight_column == "w"
    with pytest.raises(ConfigurationError, match=r"training\.class_weight"):
        load_config(REPO / "conf" / "csv.yaml", ["training.class_weight={a: 1.0}"])
