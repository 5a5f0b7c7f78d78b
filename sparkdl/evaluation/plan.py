"""Which evaluations run over a shard directory, per output, and how a model's predictions
are matched to each output's labels. Knows the shard metadata, not Spark."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkdl.data.metadata import ShardMetadata
from sparkdl.errors import ConfigurationError, DataError
from sparkdl.evaluation.base import BaseEvaluation, DataInfo, create_evaluation

EvaluationList = Sequence[BaseEvaluation | str]
EvaluationRequest = EvaluationList | Mapping[str, EvaluationList]


def default_metrics(kind: str) -> list[str]:
    """The evaluation a label kind gets when none is asked for."""
    return ["classification"] if kind == "class" else ["regression"]


def data_infos(metadata: ShardMetadata) -> dict[str | None, tuple[str, DataInfo]]:
    """Label kind and :class:`DataInfo` per output (key ``None`` for single-output shards)."""
    if not metadata.multi:
        return {None: (metadata.label_kind,
                       DataInfo(metadata.classes, metadata.label_size))}
    return {t.name: (t.kind, DataInfo(t.classes, t.size, _column_names(t.name, t.kind, t.size)))
            for t in metadata.outputs}


def _column_names(name: str, kind: str, size: int) -> list[str] | None:
    if kind == "class":
        return None
    return [name] if size == 1 else [f"{name}_{i}" for i in range(size)]


def evaluation_plan(
    metadata: ShardMetadata, request: EvaluationRequest | None
) -> dict[str | None, list[BaseEvaluation]]:
    """Fresh evaluations per output for ``request`` (see ``SparkModel.evaluate``)."""
    infos = data_infos(metadata)
    if request is None:
        wanted: Mapping[str | None, EvaluationList] = {}
    elif isinstance(request, Mapping):
        if not metadata.multi:
            raise ConfigurationError("evaluations by output name need shards with several "
                                     "outputs; pass a list for these shards")
        unknown = sorted(set(request) - set(infos))
        if unknown:
            raise ConfigurationError(f"evaluations: no output named {unknown[0]!r}; the "
                                     f"shards' outputs are {sorted(k for k in infos if k)}")
        wanted = request
    elif metadata.multi:
        wanted = {key: request for key in infos}
    else:
        wanted = {None: request}
    plan = {}
    for key, (kind, info) in infos.items():
        items = wanted.get(key) or default_metrics(kind)
        try:
            plan[key] = [create_evaluation(e, info) if isinstance(e, str) else e.empty_copy()
                         for e in items]
        except ConfigurationError as exc:
            if key is None:
                raise
            raise ConfigurationError(f"{exc} (output {key!r}, {kind})") from None
    return plan


def by_output(model: Any, y_pred: Any, y: Any) -> dict[str | None, tuple[Any, Any]]:
    """``(labels, predictions)`` per output: a model's several outputs (a list in
    ``model.output_names`` order, or a dict) matched to the label dict by name."""
    if not isinstance(y, Mapping):
        return {None: (y, y_pred)}
    if not isinstance(y_pred, Mapping):
        names = list(getattr(model, "output_names", None) or [])
        preds = list(y_pred) if isinstance(y_pred, list | tuple) else [y_pred]
        if len(names) != len(preds):
            raise DataError(f"the model has {len(preds)} outputs but names {names}")
        y_pred = dict(zip(names, preds, strict=True))
    missing = sorted(set(y) - set(y_pred))
    if missing:
        raise DataError(f"the shards' output {missing[0]!r} is not an output of the model "
                        f"(its outputs: {sorted(y_pred)})")
    return {name: (y[name], y_pred[name]) for name in y}
