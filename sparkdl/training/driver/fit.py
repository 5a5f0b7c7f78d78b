"""What a fit takes, spelled once: :class:`FitOptions`, ``fit``'s arguments beyond the data,
built from ``fit()``'s keywords or a job's ``training`` section (imports no TensorFlow)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError

if TYPE_CHECKING:
    import keras

    from sparkdl.config import TrainingConfig


@dataclass
class FitOptions:
    """``fit``'s arguments beyond the data, checked once (see ``KerasFit.fit``)."""

    epochs: int = 1
    validation_data: str | None = None
    validation_freq: int = 1
    validation_batch_size: int = 256
    callbacks: Sequence[keras.callbacks.Callback] | None = None
    verbose: int | str = "auto"
    initial_epoch: int = 0
    shuffle: bool | str = True  # True: "global"; False: "none"; or "global" | "window" | "none"
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

    @classmethod
    def from_training_config(
        cls,
        training: TrainingConfig,
        *,
        validation_data: str | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        resume: bool = False,
    ) -> FitOptions:
        """A job's ``training`` section as fit options (its URIs made absolute)."""
        from sparkdl.storage import as_uri

        return cls(
            epochs=training.epochs,
            validation_data=validation_data,
            validation_freq=training.validation_freq,
            callbacks=callbacks,
            verbose=training.verbose,
            log_every_steps=training.log_every_steps,
            checkpoint_dir=as_uri(training.checkpoint_dir) if training.checkpoint_dir else None,
            checkpoint_every=training.checkpoint_every,
            checkpoint_unit=training.checkpoint_unit,
            resume=resume,
            prefetch=training.prefetch,
            decode_threads=training.decode_threads,
            timeline=as_uri(training.timeline) if training.timeline else None,
            class_weight=training.class_weight,
            accumulate_steps=training.accumulate_steps,
            shuffle=training.shuffle,
        )

    def check(self) -> None:
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


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
