"""Mergeable evaluations (DL4J's Evaluation, RegressionEvaluation, ROC, ROCMultiClass,
EvaluationBinary), one module each, and the registry ``evaluation.metrics`` names them in.

>>> evaluations = [Evaluation(10), TopNAccuracy(10, n=3), ROCMultiClass(10)]
>>> for e in evaluations:
...     e.eval(labels, scores)
>>> print(evaluations[2].stats())
"""

from sparkdl.evaluation.base import (
    BaseEvaluation,
    DataInfo,
    check_spec,
    create_evaluation,
    evaluation_from_dict,
    parse_spec,
    registered_kinds,
)
from sparkdl.evaluation.binary import EvaluationBinary
from sparkdl.evaluation.classification import Evaluation, TopNAccuracy
from sparkdl.evaluation.regression import RegressionEvaluation
from sparkdl.evaluation.roc import ROC, ROCMultiClass

__all__ = [
    "ROC",
    "BaseEvaluation",
    "DataInfo",
    "Evaluation",
    "EvaluationBinary",
    "ROCMultiClass",
    "RegressionEvaluation",
    "TopNAccuracy",
    "check_spec",
    "create_evaluation",
    "evaluation_from_dict",
    "parse_spec",
    "registered_kinds",
]
