"""Rules that watch a training run and raise alerts: bertology's own rules on the optimisation (several
watch what a SageMaker Debugger built-in rule of a similar name watches, with other conditions, stated in
each rule's docstring) and rules for attention's own failure modes.

Each rule is a small frozen dataclass: a ``name``, its thresholds as fields (the defaults), and
``check(history)`` whose docstring states the condition. A :class:`Watchdog` evaluates a list of rules on
the run's records as they come (:mod:`~bertology.training.rules.records`) and raises each finding once,
the divergence rule first (the alerts of other rules after a divergence say that they follow it).
:func:`select_rules` turns the command line's ``--rules`` (and ``--rule-param``) into rule objects.

``--rules smdebug`` selects instead SageMaker Debugger's built-in rules under Debugger's names, with its
documented conditions and defaults (:mod:`~bertology.training.rules.smdebug`: ``VanishingGradient``,
``LossNotDecreasing``, ...); names of both sets may be mixed in ``NAME,NAME``.

=======================  ======================================================================
rule                      fires when (defaults)
=======================  ======================================================================
vanishing_gradient        a group's RMS gradient < 1e-7
exploding_gradient        the divergence rule: the training loss's 10-step running mean > 10 x its lowest
                          or not finite, the dev loss > 10 x its lowest or not finite, or the gradient
                          norm > 1000 or not finite
weight_update_ratio       a group's update / weight norm < 1e-8 or > 1
saturated_activation      > 50 % of a group's activations saturated (tanh, sigmoid) or dead (ReLU-like)
loss_not_decreasing       no 1 % fall of the mean training loss in 4 windows of 50 steps
overfitting               dev loss 5 % above its lowest while the training loss fell
stalled_training          weights unchanged at 2 watched steps with a learning rate above 0
class_imbalance           most / least frequent training label >= 10, or a label without examples
one_class_predictions     >= 95 % of the dev predictions are one label, which < 95 % of the dev examples have
entropy_collapse          a head's or layer's attention entropy, first above 0.5 nats, <= 0.25 x that
                          first value and <= 0.2 nats
no_op_heads               a head's [CLS] + [SEP] attention >= 0.9 and up by >= 0.3
frozen_heads              a head's attention changed <= 1e-9 nats between 2 pairs of records
=======================  ======================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from bertology.errors import BertologyError
from bertology.training.rules.attention import EntropyCollapse, FrozenHeads, NoOpHeads
from bertology.training.rules.optimisation import (
    ClassImbalance,
    ExplodingGradient,
    LossNotDecreasing,
    OneClassPredictions,
    Overfitting,
    SaturatedActivation,
    StalledTraining,
    VanishingGradient,
    WeightUpdateRatio,
)
from bertology.training.rules.parameters import with_params
from bertology.training.rules.records import (
    Alert,
    AttentionRecord,
    DevRecord,
    Finding,
    History,
    LossRecord,
    SignalRecord,
    TensorRecord,
)
from bertology.training.rules.smdebug import SMDEBUG_RULES
from bertology.training.rules.watchdog import Rule, Watchdog

#: Every rule by name, with its default thresholds; ``--rules default`` evaluates them all.
RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        VanishingGradient(),
        ExplodingGradient(),
        WeightUpdateRatio(),
        SaturatedActivation(),
        LossNotDecreasing(),
        Overfitting(),
        StalledTraining(),
        ClassImbalance(),
        OneClassPredictions(),
        EntropyCollapse(),
        NoOpHeads(),
        FrozenHeads(),
    )
}


#: Every rule, ours and SageMaker Debugger's, by name.
KNOWN_RULES: dict[str, Rule] = RULES | SMDEBUG_RULES
#: The presets of ``--rules``: ours (``default``) and SageMaker Debugger's (``smdebug``).
PRESETS: dict[str, list[str]] = {"default": list(RULES), "smdebug": list(SMDEBUG_RULES), "none": []}


def rule_names(spec: str) -> list[str]:
    """The rule names of ``spec``: ``"default"`` (our rules), ``"smdebug"`` (SageMaker Debugger's),
    ``"none"`` or ``"NAME,NAME,..."`` (names of either set).

    Raises:
        BertologyError: an unknown name (the message lists the known ones) or an empty list.
    """
    spec = spec.strip()
    if spec in PRESETS:
        return list(PRESETS[spec])
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in KNOWN_RULES]
    if unknown or not names:
        raise BertologyError(
            f"Unknown rule {', '.join(unknown) or repr(spec)}; give default, smdebug, none or names among: "
            f"{', '.join(KNOWN_RULES)}."
        )
    return list(dict.fromkeys(names))


def select_rules(spec: str, params: Sequence[str] = ()) -> list[Rule]:
    """The rules of ``spec`` (see :func:`rule_names`) with their default parameters, except those that
    ``params`` sets (``NAME.PARAM=VALUE`` each, :func:`~bertology.training.rules.parameters.with_params`).

    Raises:
        BertologyError: an unknown rule name, or a bad ``params`` entry.
    """
    return with_params([KNOWN_RULES[name] for name in rule_names(spec)], params)


def stop_names(names: Sequence[str]) -> list[str]:
    """``names`` (rules to stop on) checked against :data:`KNOWN_RULES`.

    Raises:
        BertologyError: an unknown name.
    """
    unknown = [name for name in names if name not in KNOWN_RULES]
    if unknown:
        raise BertologyError(
            f"Unknown rule {', '.join(unknown)} to stop on; the rules: {', '.join(KNOWN_RULES)}."
        )
    return list(dict.fromkeys(names))


__all__ = [
    "KNOWN_RULES",
    "PRESETS",
    "RULES",
    "SMDEBUG_RULES",
    "Alert",
    "AttentionRecord",
    "ClassImbalance",
    "DevRecord",
    "EntropyCollapse",
    "ExplodingGradient",
    "Finding",
    "FrozenHeads",
    "History",
    "LossNotDecreasing",
    "LossRecord",
    "NoOpHeads",
    "OneClassPredictions",
    "Overfitting",
    "Rule",
    "SaturatedActivation",
    "SignalRecord",
    "StalledTraining",
    "TensorRecord",
    "VanishingGradient",
    "Watchdog",
    "WeightUpdateRatio",
    "rule_names",
    "select_rules",
    "stop_names",
]
