"""``fit`` as Keras's, shared by ``SparkModel`` and ``ParallelWrapper`` (no TensorFlow at
import): :class:`KerasFit` builds the :class:`~sparkdl.fit_options.FitOptions` once and runs
:func:`sparkdl.training.driver.run_fit.run_fit` with the class's
:class:`~sparkdl.training.driver.launcher.Launcher`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from sparkdl.errors import ConfigurationError
from sparkdl.fit_options import FitOptions

#: ``fit()``'s keywords beyond the data: :class:`FitOptions`' fields, whose defaults (the
#: dataclass's class attributes) are the keywords' defaults too.
FIT_OPTIONS = tuple(field.name for field in fields(FitOptions))

if TYPE_CHECKING:
    import keras

    from sparkdl.training.driver.launcher import ChannelSettings, Launcher
    from sparkdl.training.driver.run_fit import FitResult
    from sparkdl.training.masters import TrainingMaster


class KerasFit:
    """``fit`` as Keras's, shared by ``SparkModel`` and ``ParallelWrapper``: a class that
    holds ``model``, ``training_master`` and ``custom_objects`` and makes a
    :class:`Launcher`."""

    model: keras.Model
    training_master: TrainingMaster
    custom_objects: dict[str, object] | None
    last_fit: FitResult | None

    def _launcher(self) -> Launcher:
        raise NotImplementedError

    def _channel_settings(self) -> ChannelSettings:
        """The driver's event channel."""
        raise NotImplementedError

    def fit(
        self,
        data: str,
        epochs: int = FitOptions.epochs,
        *,
        validation_data: str | None = FitOptions.validation_data,
        validation_freq: int = FitOptions.validation_freq,
        validation_batch_size: int = FitOptions.validation_batch_size,
        callbacks: Sequence[keras.callbacks.Callback] | None = FitOptions.callbacks,
        verbose: int | str = FitOptions.verbose,
        initial_epoch: int = FitOptions.initial_epoch,
        shuffle: bool | str = FitOptions.shuffle,
        log_every_steps: int | None = FitOptions.log_every_steps,
        checkpoint_dir: str | None = FitOptions.checkpoint_dir,
        checkpoint_every: int = FitOptions.checkpoint_every,
        checkpoint_unit: str = FitOptions.checkpoint_unit,
        resume: bool = FitOptions.resume,
        prefetch: int = FitOptions.prefetch,
        decode_threads: int = FitOptions.decode_threads,
        timeline: str | None = FitOptions.timeline,
        class_weight: dict[int, float] | None = FitOptions.class_weight,
        accumulate_steps: int = FitOptions.accumulate_steps,
    ) -> FitResult:
        """Train on the shard directory ``data``, as Keras's ``Model.fit`` does.

        Returns a :class:`keras.callbacks.History` (``history.history`` holds ``loss``, every
        compiled metric, ``val_*`` and sparkdl's per-epoch figures) that also carries the job's
        measurements (``.metrics``); the trained weights and optimizer state are loaded into
        :attr:`model` (trained in place, as Keras's ``fit`` does).

        Args:
            data: URI of the training shards (written by the ETL / ``write_shards``).
            epochs: train until this epoch index (Keras semantics, with ``initial_epoch``).
            validation_data: URI of validation shards, evaluated distributed at the end of
                every ``validation_freq``-th epoch (``val_loss`` and ``val_<metric>``).
            callbacks: Keras callbacks; they run on the driver. Hooks that fire:
                ``on_train_begin/end``, ``on_epoch_begin/end`` (with the epoch's figures
                combined over all workers), ``on_test_begin/end`` (validation figures),
                ``on_train_batch_end`` every ``log_every_steps`` steps (rank 0's running
                figures). ``model.stop_training`` and a new learning rate set by a callback
                take effect on every worker before the next epoch.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch; ``"auto"`` is 1 in a
                terminal or notebook, else 2.
            shuffle: ``"global"`` (or True): every epoch a new seeded assignment of row groups
                to workers (equal steps kept), then each worker shuffles its row groups' order
                and rows within a window of them; ``"window"``: the in-worker shuffle of a
                fixed assignment; ``"none"`` (or False): file order. Rows beyond the workers'
                equal steps are dropped: ``rows_dropped`` in every epoch's figures and
                ``metrics["rows_dropped_per_epoch"]``.
            log_every_steps: batch events every this many steps (``None``: enough for the bar).
            checkpoint_dir: rank 0 checkpoints there every ``checkpoint_every`` epochs (or
                steps, ``checkpoint_unit="steps"``); a retried stage resumes from the latest
                checkpoint, and ``resume=True`` continues a fit that was killed as a whole.
            prefetch: row groups each worker's reader decodes ahead (DL4J's
                ``workerPrefetchNumBatches``).
            decode_threads: threads that decode those row groups.
            timeline: a directory URI: every worker writes a Chrome trace of its steps there,
                ``rank-<N>.json`` (see :mod:`sparkdl.training.worker.timeline`); the files' URIs are
                in ``history.metrics["timeline"]``.
            class_weight: ``{class index: weight}``, Keras's ``class_weight``: each training
                row's loss and metrics weighted by its class's weight (unnamed classes: 1);
                not with shards that carry sample weights (Keras refuses both at once).
                Sample weights come from the shards' weight column (``write_shards(...,
                sample_weight=True)``, ``SparkModel.fit(df, sample_weight_col=...)``).
            accumulate_steps: exchange once every this many steps (micro-batches), the mean
                of their gradients: dense training's equivalent of a batch this many times
                larger (Horovod's ``backward_passes_per_step``).
        """
        given = locals()
        return self.fit_with(data, FitOptions(**{name: given[name] for name in FIT_OPTIONS}))

    def fit_with(self, data: str, options: FitOptions) -> FitResult:
        """:meth:`fit` with its options built already (e.g.
        :meth:`sparkdl.config.TrainingConfig.fit_options`)."""
        if not isinstance(data, str):
            raise ConfigurationError(
                f"fit() takes the URI of a shard directory, got {type(data).__name__}"
            )
        from sparkdl.data.metadata import load_metadata
        from sparkdl.training.model_check import check_model_fits_shards, check_training_step

        check_training_step(self.model)
        for uri in (data, options.validation_data):  # on the driver, before any task starts
            if isinstance(uri, str):
                check_model_fits_shards(self.model, load_metadata(uri), uri)
        from sparkdl.training.driver.run_fit import run_fit
        from sparkdl.training.model_files import adopt

        history, self.model = run_fit(
            self.model, self.training_master, self._launcher(), data, options,
            custom_objects=self.custom_objects, channel=self._channel_settings(),
        )
        # evaluate and predict read the trained model from rank 0's file while it is unchanged
        adopt(history.model_file, self.model)
        self.last_fit = history
        return history
