"""A stage's tasks report the rows they processed to the driver, which draws a bar of them:
real Spark tasks, the driver's authenticated channel, Keras's ``Progbar``."""

from __future__ import annotations

import pytest

from sparkdl import DenseTrainingMaster, SparkModel
from sparkdl.data.files import read_metadata
from sparkdl.spark.row_progress import row_progress

pytestmark = pytest.mark.spark


def test_every_row_a_stage_processes_is_reported_and_the_bar_reaches_the_total(spark, capsys):
    total = 1000
    with row_progress(spark, total) as progress:
        assert progress is not None
        reporter = progress.reporter

        def count(frames):
            with reporter.task() as rows:
                for frame in frames:
                    for start in range(0, len(frame), 50):  # several reports per task
                        rows.add(len(frame[start:start + 50]))
                    yield frame

        assert spark.range(0, total, 1, 4).mapInPandas(count, "id long").count() == total
    assert progress.reported == total  # from the tasks, not the bar's own finish
    assert f"{total}/{total}" in capsys.readouterr().out


def test_evaluate_draws_the_bar_at_verbose_1_and_none_at_0(spark, digits_shards, make_mlp,
                                                           capsys):
    test, rows = digits_shards["test"], digits_shards["test_rows"]
    meta = read_metadata(test)
    spark_model = SparkModel(spark, make_mlp(meta.feature_shape, meta.num_classes),
                             DenseTrainingMaster(batch_size_per_worker=32, num_workers=2))
    quiet = spark_model.evaluate(test, batch_size=64, verbose=0)
    assert f"/{rows}" not in capsys.readouterr().out
    shown = spark_model.evaluate(test, batch_size=64, verbose=1)
    assert f"{rows}/{rows}" in capsys.readouterr().out
    assert shown.stats() == quiet.stats()  # the same evaluation, bar or not
