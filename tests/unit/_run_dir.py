"""A realistic run directory for the report, history and tracking tests.

Loss and accuracy (train and validation) come from a real model: scikit-learn's logistic
regression trained epoch by epoch on the digits; the test-set confusion matrix is a real
:class:`sparkdl.evaluation.Evaluation` of its predictions. sparkdl's own figures (bytes, τ,
sparsity, phase times) follow the shape of a 2-worker sharing run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

EPOCHS = 6


def digits_history(epochs: int = EPOCHS, validation_freq: int = 1) -> tuple[dict, Any]:
    """Per-epoch loss/accuracy (+ val_*, shorter when ``validation_freq`` > 1) and the
    final test evaluation of an SGD logistic regression on the digits."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import log_loss
    from sklearn.model_selection import train_test_split

    from sparkdl.evaluation import Evaluation

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    model = SGDClassifier(loss="log_loss", learning_rate="constant", eta0=0.01, random_state=0)
    classes = np.arange(10)
    history: dict[str, list[float]] = {"loss": [], "accuracy": [], "val_loss": [],
                                       "val_accuracy": []}
    for epoch in range(epochs):
        model.partial_fit(x_train, y_train, classes=classes)
        history["loss"].append(log_loss(y_train, model.predict_proba(x_train), labels=classes))
        history["accuracy"].append(model.score(x_train, y_train))
        if (epoch + 1) % validation_freq == 0:
            history["val_loss"].append(log_loss(y_test, model.predict_proba(x_test),
                                                labels=classes))
            history["val_accuracy"].append(model.score(x_test, y_test))
    evaluation = Evaluation(10).eval(y_test, model.predict_proba(x_test))
    return history, evaluation


def sharing_figures(epochs: int = EPOCHS, num_parameters: int = 18_570) -> dict[str, list]:
    dense = 4.0 * num_parameters  # 2 workers: 4 * n * 2 * (2 - 1) / 2
    tau = [1e-3 * 0.8**e for e in range(epochs)]
    sparsity = [2e-3 * 1.1**e for e in range(epochs)]
    sent = [dense * s * 1.6 + 64 for s in sparsity]
    return {
        "samples_per_second": [3100.0 if e == 0 else 9100.0 + 50 * e for e in range(epochs)],
        "bytes_sent_per_step": sent,
        "bytes_received_per_step": [b * 1.02 for b in sent],
        "tau": tau,
        "sparsity": sparsity,
        "compute_s": [0.9 if e == 0 else 0.21 for e in range(epochs)],
        "encode_s": [0.05] * epochs,
        "communicate_s": [0.04] * epochs,
        "decode_s": [0.02] * epochs,
        "apply_s": [0.03] * epochs,
        "data_wait_s": [0.01] * epochs,
        "epoch_s": [1.1 if e == 0 else 0.37 for e in range(epochs)],
    }


def write_run_dir(run_dir: Path, *, mode: str = "sharing", evaluate: bool = True,
                  validation_freq: int = 1) -> dict[str, Any]:
    """Write metrics.json (and evaluation.json) as the train and evaluate stages do."""
    history, evaluation = digits_history(validation_freq=validation_freq)
    figures = sharing_figures()
    if mode != "sharing":
        del figures["tau"], figures["sparsity"]
        figures["loss_after_averaging"] = [v * 0.97 for v in history["loss"]]
    history.update(figures)
    dense = 4.0 * 18_570
    bytes_per_step = sum(figures["bytes_sent_per_step"]) / EPOCHS
    metrics = {
        "mode": mode, "num_workers": 2, "batch_size_per_worker": 32, "epochs": EPOCHS,
        "steps": EPOCHS * 21, "samples_per_second": 7900.0, "train_seconds": 3.0,
        "dense_bytes_per_step": dense, "bytes_per_step": bytes_per_step,
        "compression_ratio": dense / bytes_per_step, "final_loss": history["loss"][-1],
        "replicas_identical": True, "validation_freq": validation_freq, "history": history,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    if evaluate:
        metrics.update(test_accuracy=evaluation.accuracy(), test_macro_f1=evaluation.macro_f1(),
                       test_examples=evaluation.count)
        (run_dir / "evaluation.json").write_text(json.dumps(evaluation.to_dict()))
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    assert all(math.isfinite(v) for v in history["loss"])
    return metrics
