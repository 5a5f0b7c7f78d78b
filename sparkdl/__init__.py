"""sparkdl: distributed TensorFlow/Keras training on Apache Spark.

Heavy modules (TensorFlow, Spark) are imported lazily so that ``import sparkdl`` stays cheap
and the communication and compression layers work without either.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from sparkdl.errors import (
    CommunicationError,
    ConfigurationError,
    DataError,
    SparkDLError,
    TrainingError,
)

__version__ = "0.1.0"

_LAZY = {
    "SparkModel": "sparkdl.spark_model",
    "SharedTrainingMaster": "sparkdl.training.masters",
    "ParameterAveragingTrainingMaster": "sparkdl.training.masters",
    "DenseTrainingMaster": "sparkdl.training.masters",
    "ElasticPolicy": "sparkdl.training.elastic",
    "Evaluation": "sparkdl.evaluation",
    "RegressionEvaluation": "sparkdl.evaluation",
    "ROC": "sparkdl.evaluation",
    "ROCMultiClass": "sparkdl.evaluation",
    "EvaluationBinary": "sparkdl.evaluation",
    "TopNAccuracy": "sparkdl.evaluation",
    "ParallelWrapper": "sparkdl.parallel",
    "FixedThreshold": "sparkdl.compression.threshold",
    "AdaptiveThreshold": "sparkdl.compression.threshold",
    "TargetSparsityThreshold": "sparkdl.compression.threshold",
    "write_shards": "sparkdl.data.writer",
    "read_metadata": "sparkdl.data.files",
}

__all__ = [
    "CommunicationError",
    "ConfigurationError",
    "DataError",
    "SparkDLError",
    "TrainingError",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkdl' has no attribute {name!r}")
    return getattr(import_module(module), name)
