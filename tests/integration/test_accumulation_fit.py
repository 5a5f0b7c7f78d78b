"""fit(accumulate_steps=k) through the workers: k micro-batches of B train as batches of k x B."""

from __future__ import annotations

import numpy as np
import pytest
from test_sample_weights import BATCH, _data, _model, write_shards

from sparkdl.errors import ConfigurationError
from sparkdl.parallel import ParallelWrapper
from sparkdl.training.masters import DenseTrainingMaster, SharedTrainingMaster


@pytest.mark.slow
def test_fit_with_accumulate_steps_trains_as_the_larger_batch(tmp_path):
    x, y, _ = _data()
    uri = write_shards(tmp_path / "shards", x, y, None)

    def fit(batch: int, accumulate: int):  # type: ignore[no-untyped-def]
        wrapper = ParallelWrapper(_model(), DenseTrainingMaster(batch, num_workers=1),
                                  timeout_s=60)
        history = wrapper.fit(uri, epochs=2, shuffle=False, verbose=0,
                              accumulate_steps=accumulate)
        return wrapper.model.get_weights(), history

    (micro, history), (large, _) = fit(BATCH // 2, 2), fit(BATCH, 1)
    assert history.params["steps"] == 2 * len(x) // BATCH  # steps count micro-batches
    for a, b in zip(micro, large, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigurationError, match="accumulate_steps=2 applies to dense"):
        ParallelWrapper(_model(), SharedTrainingMaster(num_workers=1)).fit(
            uri, accumulate_steps=2)
