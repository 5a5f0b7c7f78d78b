"""Small Keras models that more than one test folder builds."""

from __future__ import annotations

from typing import Any


def zero_branch_model() -> Any:
    """A tanh of a zero-initialised layer feeds a 64 x 32 kernel (compressed at PowerSGD rank
    2): that kernel's gradient is exactly zero on the first step, as a LoRA-style zero
    branch's is."""
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((12,)), keras.layers.Dense(64, "tanh", kernel_initializer="zeros"),
        keras.layers.Dense(32, "tanh"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
