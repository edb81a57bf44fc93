"""SageMaker Debugger's built-in rules that apply to fine-tuning a transformer, as one preset
(``--rules smdebug``): each under Debugger's name, with its documented condition and default parameters
(:mod:`~bertology.training.rules.smdebug_tensors`, :mod:`~bertology.training.rules.smdebug_losses`).

Left out: SimilarAcrossRuns (compares two runs), CheckInputImages (images), TreeDepth and
FeatureImportanceOverweight (XGBoost), and the profiler's rules.

Each rule's ``reads`` names what it reads beyond the records every run makes (training loss, dev
evaluations, per-layer signals): ``gradient`` and ``weight`` statistics, ``activations``, ``tokens``
(measured at the watched steps by :class:`~bertology.training.tensor_recorder.TensorRecorder`) and
``confusion`` (each dev evaluation's confusion matrix); a run measures them only when a selected rule
reads them (:func:`records_read`).
"""

from __future__ import annotations

from collections.abc import Iterable

from bertology.training.rules.smdebug_losses import (
    ClassImbalance,
    Confusion,
    LossNotDecreasing,
    Overfit,
    Overtraining,
    StalledTrainingRule,
    UnchangedTensor,
)
from bertology.training.rules.smdebug_tensors import (
    AllZero,
    DeadRelu,
    ExplodingTensor,
    NLPSequenceRatio,
    PoorWeightInitialization,
    SaturatedActivation,
    TensorVariance,
    VanishingGradient,
    WeightUpdateRatio,
)
from bertology.training.rules.watchdog import Rule

#: Debugger's rules by name, with Debugger's default parameters; ``--rules smdebug`` evaluates them all.
SMDEBUG_RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        VanishingGradient(),
        ExplodingTensor(),
        WeightUpdateRatio(),
        SaturatedActivation(),
        DeadRelu(),
        LossNotDecreasing(),
        Overfit(),
        Overtraining(),
        ClassImbalance(),
        StalledTrainingRule(),
        AllZero(),
        TensorVariance(),
        PoorWeightInitialization(),
        UnchangedTensor(),
        NLPSequenceRatio(),
        Confusion(),
    )
}


def records_read(rules: Iterable[Rule]) -> frozenset[str]:
    """What ``rules`` read beyond every run's records (module docstring); of our own rules, only
    OneClassPredictions reads something (``confusion``)."""
    return frozenset().union(*(getattr(rule, "reads", frozenset()) for rule in rules))


__all__ = [
    "SMDEBUG_RULES",
    "AllZero",
    "ClassImbalance",
    "Confusion",
    "DeadRelu",
    "ExplodingTensor",
    "LossNotDecreasing",
    "NLPSequenceRatio",
    "Overfit",
    "Overtraining",
    "PoorWeightInitialization",
    "SaturatedActivation",
    "StalledTrainingRule",
    "TensorVariance",
    "UnchangedTensor",
    "VanishingGradient",
    "WeightUpdateRatio",
    "records_read",
]
