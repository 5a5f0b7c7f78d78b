"""Small DataFrames and Keras models for the DataFrame / Spark ML tests."""

from __future__ import annotations

from typing import Any


def iris_frame(spark: Any) -> Any:
    """Iris (scikit-learn) with four numeric columns a..d and a string ``species`` label."""
    from sklearn.datasets import load_iris

    data = load_iris()
    names = [str(n) for n in data.target_names]
    rows = [(*map(float, x), names[int(y)]) for x, y in zip(data.data, data.target, strict=True)]
    return spark.createDataFrame(rows, "a double, b double, c double, d double, species string")


def classifier(num_inputs: int, num_classes: int, seed: int = 3) -> Any:
    """A compiled two-layer softmax classifier with seeded weights."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input(shape=(num_inputs,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    return model


def regressor(num_inputs: int, num_outputs: int, seed: int = 3) -> Any:
    """A compiled linear regression model with seeded weights."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input(shape=(num_inputs,)), keras.layers.Dense(num_outputs)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model
