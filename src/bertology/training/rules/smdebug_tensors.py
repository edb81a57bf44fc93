"""SageMaker Debugger's built-in rules on tensors, under Debugger's names, with its documented conditions
and default parameters (the sagemaker-debugger repository's ``docs/FirstPartyRules.md`` and the AWS
developer guide's "List of Debugger built-in rules"; both quoted in each docstring).

Debugger evaluates each tensor of a *collection* (``gradients``, ``weights``, ``relu_input``...) that its
hook saved. Here a collection's tensors are those of a parameter group (``"embeddings"``, ``"layer 0"``,
..., ``"head"``) taken together, measured at the watched steps (every ``watch_every`` optimizer steps) by
:class:`~bertology.training.tensor_recorder.TensorRecorder`: gradients after ``backward`` and before
clipping (where Debugger's PyTorch hook saves them), weights before the optimizer step, and the inputs
and outputs of the activation function modules during the step's forward pass. Where Debugger leaves the
collection to the user (AllZero, TensorVariance), the rule inspects the gradients and the weights.

So VanishingGradient, WeightUpdateRatio, AllZero and TensorVariance work **per parameter group**, where
Debugger works per tensor: a group's statistic pools all its tensors (a layer of 16 weight and bias
tensors is one value), and a condition that holds for one tensor of a group need not hold for the group
(a bias whose mean absolute gradient is 1e-9 fires VanishingGradient in Debugger, not here when its
layer's other tensors have gradients of 1e-4). ExplodingTensor counts every tensor's NaN and infinite
values, so a group fires exactly when one of its tensors would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bertology.training.rules.records import Finding, History, TensorRecord
from bertology.training.rules.smdebug_losses import records_without_improvement

#: The tensor collections a rule on parameters inspects, as :class:`TensorRecord` keeps them.
COLLECTIONS = ("gradient", "weight")


def _latest(history: History) -> TensorRecord | None:
    return history.tensors[-1] if history.tensors else None


def _per_group(record: TensorRecord, collection: str, statistic: str) -> list[tuple[str, float]]:
    """(group, value) of ``statistic`` of ``collection`` for the groups that have trainable tensors."""
    values = getattr(record, collection).get(statistic)
    if values is None:
        return []
    return [(group, float(v)) for group, v in zip(record.groups, values, strict=True) if not math.isnan(v)]


@dataclass(frozen=True)
class VanishingGradient:
    """Debugger: "Gradients whose mean of absolute values are lower than this threshold will return True"
    (``threshold``, default 0.0000001). Fires for a group whose gradients' mean absolute value is below
    ``threshold`` at the latest watched step: per parameter group, where Debugger evaluates each tensor
    (module docstring)."""

    name: ClassVar[str] = "VanishingGradient"
    reads: ClassVar[frozenset[str]] = frozenset({"gradient"})
    threshold: float = 1e-7

    def check(self, history: History) -> list[Finding]:
        record = _latest(history)
        if record is None:
            return []
        return [
            Finding(group, f"{group}: mean |gradient| {mean:.2e} < {self.threshold:g}")
            for group, mean in _per_group(record, "gradient", "abs_mean")
            if mean < self.threshold
        ]


@dataclass(frozen=True)
class ExplodingTensor:
    """Debugger: "identify if you are running into a situation where any tensor has non finite values";
    ``only_nan`` (default False) "if you only want to monitor for nan and not for infinity". Fires for
    each group whose gradients or weights hold a NaN (or, unless ``only_nan``, an infinity) at the latest
    watched step, and for a training or dev loss that is NaN (or infinite): the losses are tensors that
    Debugger saves too."""

    name: ClassVar[str] = "ExplodingTensor"
    reads: ClassVar[frozenset[str]] = frozenset({"gradient", "weight"})
    only_nan: bool = False

    def _bad(self, value: float) -> bool:
        return math.isnan(value) or (not self.only_nan and math.isinf(value))

    def check(self, history: History) -> list[Finding]:
        found = []
        for label, rows in (("training loss", history.train), ("dev loss", history.dev)):
            if rows and self._bad(rows[-1].loss):
                found.append(Finding(label, f"{label} {rows[-1].loss} at step {rows[-1].step}"))
        record = _latest(history)
        if record is None:
            return found
        for collection in COLLECTIONS:
            nans = dict(_per_group(record, collection, "nan"))
            infs = {} if self.only_nan else dict(_per_group(record, collection, "inf"))
            for group in record.groups:
                count = nans.get(group, 0.0) + infs.get(group, 0.0)
                if count > 0:
                    place = f"{collection}s of {group}"
                    found.append(Finding(place, f"{place}: {count:.0f} values not finite"))
        return found


@dataclass(frozen=True)
class WeightUpdateRatio:
    """Debugger: "returns True if the ratio of updates to weights is larger than ``large_threshold`` or
    when this ratio is smaller than ``small_threshold``" (defaults 10.0 and 0.00000001; ``epsilon``
    0.000000001 "to ensure that we do not divide by 0"). Here the ratio of a group is
    ``update_norm / (weight_norm + epsilon)``: the L2 norm of one optimizer step's change of the group's
    weights over the L2 norm of the weights before it (the per-layer signals,
    :class:`~bertology.training.rules.records.SignalRecord`), at the latest watched step; groups that do
    not train are skipped. Per parameter group, where Debugger evaluates each tensor (module docstring)."""

    name: ClassVar[str] = "WeightUpdateRatio"
    reads: ClassVar[frozenset[str]] = frozenset()
    large_threshold: float = 10.0
    small_threshold: float = 1e-8
    epsilon: float = 1e-9

    def check(self, history: History) -> list[Finding]:
        if not history.signals:
            return []
        record = history.signals[-1]
        found = []
        for group, update, weight, count in zip(
            record.groups, record.update_norm, record.weight_norm, record.parameters, strict=True
        ):
            ratio = update / (weight + self.epsilon)
            if not count:
                continue
            if ratio > self.large_threshold:
                found.append(
                    Finding(
                        f"{group} (large)", f"{group}: update ratio {ratio:.3g} > {self.large_threshold:g}"
                    )
                )
            elif ratio < self.small_threshold:
                found.append(
                    Finding(
                        f"{group} (small)", f"{group}: update ratio {ratio:.2e} < {self.small_threshold:g}"
                    )
                )
        return found


def _inactive_layers(
    history: History,
    kinds: tuple[str, ...],
    threshold_inactivity: float,
    threshold_layer: float,
    what: str,
) -> list[Finding]:
    """A finding for each module of ``kinds`` in the latest watched step where more than
    ``threshold_layer`` percent of its nodes are active in less than ``threshold_inactivity`` percent of
    the batch; the message names the module's function (its class) and ``what`` such a node is (e.g.
    "saturated")."""
    record = _latest(history)
    found = []
    for module in record.activations if record is not None else ():
        if module.kind not in kinds or not module.activity.size:
            continue
        share = 100.0 * float(np.mean(100.0 * module.activity < threshold_inactivity))
        if share > threshold_layer:
            message = (
                f"{module.name} ({module.function}): {share:.0f}% of nodes {what} > {threshold_layer:g}%"
            )
            found.append(Finding(module.name, message))
    return found


@dataclass(frozen=True)
class SaturatedActivation:
    """Debugger: "An activation layer is saturated when the input of the layer is close to the maximum or
    minimum of the activation function ... If the activity of a node drops below the
    ``threshold_inactivity`` percentage, it is considered saturated. If more than a ``threshold_layer``
    percent of the nodes are saturated, the rule returns True" (inputs of tanh and sigmoid;
    ``threshold_tanh`` (-9.4999, 9.4999), ``threshold_sigmoid`` (-23, 16.99999), ``threshold_inactivity``
    1.0, ``threshold_layer`` 50.0). A node is one unit of the activation's input (its last dimension);
    its activity, the percentage of the watched step's batch positions (padding included) at which its
    input lies strictly inside the bounds. Fires per tanh or sigmoid module (BERT's pooler is one)."""

    name: ClassVar[str] = "SaturatedActivation"
    reads: ClassVar[frozenset[str]] = frozenset({"activations"})
    threshold_tanh: tuple[float, float] = (-9.4999, 9.4999)
    threshold_sigmoid: tuple[float, float] = (-23.0, 16.99999)
    threshold_inactivity: float = 1.0
    threshold_layer: float = 50.0

    def check(self, history: History) -> list[Finding]:
        return _inactive_layers(
            history, ("tanh", "sigmoid"), self.threshold_inactivity, self.threshold_layer, "saturated"
        )


@dataclass(frozen=True)
class DeadRelu:
    """Debugger: "If the ReLu is active less than the ``threshold_inactivity``, it is considered to be
    dead ... Returns True if the percentage of inactive ReLUs in a layer is greater than
    ``threshold_layer``" (defaults 1.0 and 50.0; ReLU outputs). A node is one unit of the activation's
    output (its last dimension), active at a batch position (padding included) where its output is above
    0. Transformers gate with GELU and the like rather than ReLU: their modules count as ReLUs (an output
    above 0 is an input above 0 for each of them), and an alert names the module's own function
    (``intermediate.intermediate_act_fn (GELUActivation): 60% of nodes dead > 50%``)."""

    name: ClassVar[str] = "DeadRelu"
    reads: ClassVar[frozenset[str]] = frozenset({"activations"})
    threshold_inactivity: float = 1.0
    threshold_layer: float = 50.0

    def check(self, history: History) -> list[Finding]:
        return _inactive_layers(history, ("relu",), self.threshold_inactivity, self.threshold_layer, "dead")


@dataclass(frozen=True)
class AllZero:
    """Debugger: "detects if all or a specified percentage of the values in the tensors are zero"
    (``threshold``, default 100: "the percentage of values in the tensor that needs to be zero for this
    rule to be invoked"). Fires for a group's gradients or weights with at least ``threshold`` percent
    zeros at the latest watched step: per parameter group, where Debugger evaluates each tensor (a layer
    with one all-zero bias fires there at the default 100 %, not here; module docstring)."""

    name: ClassVar[str] = "AllZero"
    reads: ClassVar[frozenset[str]] = frozenset({"gradient", "weight"})
    threshold: float = 100.0

    def check(self, history: History) -> list[Finding]:
        record = _latest(history)
        if record is None:
            return []
        found = []
        for collection in COLLECTIONS:
            for group, fraction in _per_group(record, collection, "zero_fraction"):
                if 100.0 * fraction >= self.threshold:
                    place = f"{collection}s of {group}"
                    found.append(Finding(place, f"{place}: {100 * fraction:.1f}% zero"))
        return found


@dataclass(frozen=True)
class TensorVariance:
    """Debugger: "detects if you have tensors with very high or low variances" (``max_threshold`` and
    ``min_threshold``, no defaults: a bound left unset is not checked). Fires for a group's gradients or
    weights whose variance is above ``max_threshold`` or below ``min_threshold`` at the latest watched
    step; with neither set (Debugger's defaults) it never fires. Per parameter group (the variance of all
    the group's values together), where Debugger evaluates each tensor (module docstring)."""

    name: ClassVar[str] = "TensorVariance"
    reads: ClassVar[frozenset[str]] = frozenset({"gradient", "weight"})
    max_threshold: float | None = None
    min_threshold: float | None = None

    def check(self, history: History) -> list[Finding]:
        record = _latest(history)
        if record is None:
            return []
        found = []
        for collection in COLLECTIONS:
            for group, variance in _per_group(record, collection, "variance"):
                place = f"{collection}s of {group}"
                if self.max_threshold is not None and variance > self.max_threshold:
                    found.append(Finding(place, f"{place}: variance {variance:.3g} > {self.max_threshold:g}"))
                elif self.min_threshold is not None and variance < self.min_threshold:
                    found.append(Finding(place, f"{place}: variance {variance:.3g} < {self.min_threshold:g}"))
        return found


@dataclass(frozen=True)
class PoorWeightInitialization:
    """Debugger: "checks the variance of activation inputs across layers, the distribution of gradients,
    and the loss convergence for the initial steps": "If the ratio between minimum and maximum variance
    of weights per layer exceeds the threshold at a step, the rule returns True" (``threshold`` 10.0, on
    ``.*relu_input``); "If the minimum difference between 5th and 95th percentiles of the gradient
    distribution is less than the ``distribution_range``, the rule returns True" (0.001); ``patience``
    (5) "The number of steps to wait until the loss is considered to be no longer decreasing"; ``steps``
    (10) "The number of steps this rule analyzes".

    Here, on the watched steps up to ``steps``: the largest over the smallest variance of the ReLU-like
    activations' inputs (one per module: a layer's feed-forward GELU) above ``threshold``; the smallest
    95th-minus-5th percentile of a group's gradients below ``distribution_range``; and, over the training
    loss records up to ``steps``, ``patience`` records in a row without a new lowest loss."""

    name: ClassVar[str] = "PoorWeightInitialization"
    reads: ClassVar[frozenset[str]] = frozenset({"gradient_spread", "activations"})
    threshold: float = 10.0
    distribution_range: float = 0.001
    patience: int = 5
    steps: int = 10

    def check(self, history: History) -> list[Finding]:
        found = []
        early = [row.loss for row in history.train if row.step <= self.steps]
        if (
            history.train
            and history.train[-1].step <= self.steps
            and records_without_improvement(early, 0.0) >= self.patience
        ):
            found.append(
                Finding("loss", f"training loss not below {min(early):.4g} for {self.patience} records")
            )
        record = _latest(history)
        if record is None or record.step > self.steps:
            return found
        variances = [a.input_variance for a in record.activations if a.kind == "relu"]
        if variances and min(variances) > 0 and max(variances) / min(variances) > self.threshold:
            ratio = max(variances) / min(variances)
            found.append(
                Finding(
                    "activation inputs",
                    f"activation input variances differ {ratio:.3g}-fold across layers > {self.threshold:g}",
                )
            )
        spreads = _per_group(record, "gradient", "spread")
        if spreads:
            group, spread = min(spreads, key=lambda item: item[1])
            if spread < self.distribution_range:
                found.append(
                    Finding(
                        "gradients",
                        f"{group}: gradients' 5-95th percentiles {spread:.2e} < {self.distribution_range:g}",
                    )
                )
        return found


@dataclass(frozen=True)
class NLPSequenceRatio:
    """Debugger: "calculates the ratio of specific tokens given the rest of the input sequence" on the
    embedding's input (``.*embedding0_input_0``): ``token_values`` (default 0) and
    ``token_thresholds_percent`` (documented default "50,50": one threshold per token value; with the
    one default value, 50; a value without a threshold of its own takes the last). Fires for a token
    value whose share of the word embeddings' inputs in the latest watched step (padding included) is
    above its threshold percent. Token 0 is [PAD] for BERT's vocabulary."""

    name: ClassVar[str] = "NLPSequenceRatio"
    reads: ClassVar[frozenset[str]] = frozenset({"tokens"})
    token_values: tuple[int, ...] = (0,)
    token_thresholds_percent: tuple[float, ...] = (50.0,)

    def check(self, history: History) -> list[Finding]:
        record = _latest(history)
        if record is None or not record.tokens:
            return []
        found = []
        thresholds = self.token_thresholds_percent
        for index, token in enumerate(self.token_values):
            threshold = thresholds[min(index, len(thresholds) - 1)]
            percent = 100.0 * record.token_counts.get(token, 0) / record.tokens
            if percent > threshold:
                found.append(
                    Finding(f"token {token}", f"token {token}: {percent:.1f}% of the inputs > {threshold:g}%")
                )
        return found
