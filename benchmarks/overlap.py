"""training.overlap vs synchronous gradient sharing: accuracy and step time.

Data: the digits pipeline's shards (Spark ETL, local[2]). Each run is a ``ParallelWrapper``
fit with 2 workers × batch 32 and gradient sharing, validated on the test shards; the
synchronous and the overlapped run alternate, for several model seeds (the seed-to-seed spread
of the synchronous runs is the noise the accuracy difference is judged against). Step time is
the median over runs of the steady-state step (epochs after the first, which traces), with
the exchange's exposed wait (``communicate_s``) beside it. Two models: the default MLP
(128, 64) and a wide one (1024, 1024) whose messages are larger.
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

from benchmarks.report import print_table

WORKERS, BATCH = 2, 32


def run(options: dict[str, Any]) -> dict[str, Any]:
    quick = bool(options.get("quick"))
    seeds = (1,) if quick else (1, 2, 3)
    epochs = 3 if quick else 8

    from sparkdl.pipelines import digits
    from sparkdl.session import get_spark

    spark = get_spark()
    shards = digits.run(spark, "file://" + tempfile.mkdtemp(prefix="sparkdl-overlap-") + "/d")
    figures: dict[str, Any] = {"epochs": epochs, "seeds": list(seeds)}
    rows = []
    for hidden in ((128, 64), (1024, 1024)):
        runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for i, seed in enumerate(seeds):
            for overlap in ((False, True) if i % 2 == 0 else (True, False)):
                runs[overlap].append(_fit(shards, hidden, seed, overlap, epochs))
                print(f"MLP {hidden} seed {seed} overlap={overlap}: {runs[overlap][-1]}",
                      flush=True)
        name = "x".join(map(str, hidden))
        for overlap in (False, True):
            r = runs[overlap]
            acc = [x["val_accuracy"] for x in r]
            step = statistics.median(x["step_ms"] for x in r)
            wait = statistics.median(x["communicate_ms"] for x in r)
            label = "overlap" if overlap else "sync"
            figures[f"{name}_{label}"] = {"val_accuracy": acc, "step_ms": step,
                                          "communicate_ms": wait}
            rows.append((f"MLP {name} {label}", " ".join(f"{a:.4f}" for a in acc),
                         f"{statistics.mean(acc):.4f}", f"{step:.2f}", f"{wait:.2f}",
                         f"{step / statistics.median(x['step_ms'] for x in runs[False]):.3f}"))
        diff = [o["val_accuracy"] - s["val_accuracy"] for s, o in zip(runs[False], runs[True])]
        figures[f"{name}_accuracy_difference_pp"] = [100 * d for d in diff]
    print_table(
        f"digits, ParallelWrapper {WORKERS} workers x {BATCH}, sharing, {epochs} epochs, "
        f"seeds {list(seeds)} (sync and overlap alternate)",
        ["run", "test accuracy per seed", "mean", "step ms", "exposed comm ms", "step vs sync"],
        rows,
    )
    return figures


def _fit(shards: dict[str, Any], hidden: tuple[int, ...], seed: int, overlap: bool,
         epochs: int) -> dict[str, float]:
    import keras

    from sparkdl.data.files import read_metadata
    from sparkdl.models import mlp
    from sparkdl.parallel import ParallelWrapper
    from sparkdl.training.masters import SharedTrainingMaster

    meta = read_metadata(shards["train"])
    keras.utils.set_random_seed(seed)
    model = mlp(meta.feature_shape, meta.num_classes, hidden=hidden)
    model.compile(optimizer=keras.optimizers.Adam(0.002),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    master = SharedTrainingMaster(BATCH, WORKERS, overlap=overlap, seed=seed)
    fit = ParallelWrapper(model, master, timeout_s=120).fit(
        shards["train"], epochs=epochs, validation_data=shards["test"], verbose=0
    )
    if not fit.metrics["replicas_identical"]:
        raise AssertionError("replicas differ")
    steady = fit.metrics["steady_samples_per_second"]
    timings = fit.metrics["step_timings_s"]
    return {
        "val_accuracy": fit.history["val_accuracy"][-1],
        "step_ms": 1000.0 * WORKERS * BATCH / steady,
        "communicate_ms": 1000.0 * timings.get("communicate_s", 0.0),
    }
