"""What a fit takes, defined once: :class:`FitOptions`, ``fit``'s arguments beyond the data,
with their defaults and their checks.

Every way into a fit builds one: ``fit()``'s keywords (their defaults are read from here),
a job's ``training`` section (:meth:`sparkdl.config.TrainingConfig.fit_options`; its keys
of the same names take their defaults from here too) and ``KerasEstimator``'s Params
(through its ``trainingConfig``). The workers get the same object (``WorkerSpec.options``),
its callbacks left on the driver. Imports no TensorFlow, no Spark and no NumPy: ``config``
builds on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    import keras


@dataclass
class FitOptions:
    """``fit``'s arguments beyond the data, with their defaults; each is described in
    :meth:`sparkdl.training.driver.keras_fit.KerasFit.fit`, whose keywords these are."""

    epochs: int = 1
    validation_data: str | None = None
    validation_freq: int = 1
    validation_batch_size: int = 256
    callbacks: Sequence[keras.callbacks.Callback] | None = None
    verbose: int | str = "auto"
    initial_epoch: int = 0
    shuffle: bool | str = "global"  # or "window", "none"; True: "global", False: "none"
    log_every_steps: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    checkpoint_unit: str = "epochs"
    resume: bool = False
    prefetch: int = 4
    decode_threads: int = 2
    timeline: str | None = None
    class_weight: dict[int, float] | None = None
    accumulate_steps: int = 1

    def for_workers(self, *, shuffle: str, class_weight: dict[int, float] | None
                    ) -> FitOptions:
        """What the workers get: the callbacks stay on the driver; ``shuffle`` resolved to
        its mode and ``class_weight`` checked against the shards."""
        return replace(self, callbacks=None, shuffle=shuffle, class_weight=class_weight)

    def check(self) -> None:
        """Refuse a value no fit can use, with one :class:`ConfigurationError` naming it."""
        import keras

        for name in ("epochs", "validation_freq", "validation_batch_size", "checkpoint_every",
                     "prefetch", "decode_threads", "accumulate_steps"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.initial_epoch, bool) or not isinstance(self.initial_epoch, int) or (
            not 0 <= self.initial_epoch < self.epochs
        ):
            raise ConfigurationError(
                f"initial_epoch must be an integer in [0, epochs={self.epochs}), "
                f"got {self.initial_epoch!r}"
            )
        if self.log_every_steps is not None and (
            isinstance(self.log_every_steps, bool) or not isinstance(self.log_every_steps, int)
            or self.log_every_steps < 0
        ):
            raise ConfigurationError(
                f"log_every_steps must be an integer >= 0, got {self.log_every_steps!r}"
            )
        if self.validation_data is not None and not isinstance(self.validation_data, str):
            raise ConfigurationError(
                "validation_data must be the URI of a shard directory, got "
                f"{type(self.validation_data).__name__}"
            )
        for callback in self.callbacks or ():
            if not isinstance(callback, keras.callbacks.Callback):
                raise ConfigurationError(
                    f"callbacks must be keras.callbacks.Callback instances, got "
                    f"{type(callback).__name__}"
                )
        from sparkdl.data.reader import shuffle_mode

        shuffle_mode(self.shuffle)
        if self.resume and not self.checkpoint_dir:
            raise ConfigurationError("resume=True needs a checkpoint_dir to resume from")
        if self.timeline is not None:
            if not isinstance(self.timeline, str) or not self.timeline.strip():
                raise ConfigurationError(
                    f"timeline must be a directory URI, got {self.timeline!r}"
                )
            from sparkdl.storage import resolve

            resolve(self.timeline)  # an unknown filesystem fails here, naming the URI


#: The options a job's ``training`` section holds, under the same names (``config.py``'s
#: ``TrainingConfig`` takes their defaults from :class:`FitOptions`); the others exist only
#: per call: the validation shards' URI (the section's ``validation`` names them its own
#: way), the callbacks, ``initial_epoch`` and ``resume`` (the CLI's ``--resume``).
YAML_KEYS = tuple(
    field.name for field in fields(FitOptions)
    if field.name not in ("validation_data", "validation_batch_size", "callbacks",
                          "initial_epoch", "resume")
)


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
