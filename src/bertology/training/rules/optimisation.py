"""Rules on the optimisation: gradients, weight updates, activations, the losses and the training labels.

These are bertology's own rules. Several watch what a SageMaker Debugger built-in rule of a similar name
watches (VanishingGradient, ExplodingTensor, WeightUpdateRatio, SaturatedActivation / DeadRelu,
LossNotDecreasing, Overfit, StalledTrainingRule, ClassImbalance), but none computes Debugger's condition:
each docstring states our exact condition and how it differs from Debugger's, as Debugger's rule
documentation (``FirstPartyRules.md`` of the sagemaker-debugger repository) and the AWS developer guide's
built-in rules page define it. OneClassPredictions has no Debugger counterpart. Every rule reads only the
:class:`~bertology.training.rules.records.History` and returns what it finds now.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bertology.training.rules.records import Finding, History, LossRecord, SignalRecord


def running_means(values: np.ndarray, window: int) -> np.ndarray:
    """[n] the mean of ``values`` [n] over the last ``window`` entries up to each one (fewer at the start).
    A non-finite value makes every later mean non-finite."""
    sums = np.cumsum(np.concatenate([[0.0], values.astype(np.float64)]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    with np.errstate(invalid="ignore"):
        return (sums[ends] - sums[starts]) / (ends - starts)


def _from(lowest: float) -> str:
    """The message part ", from LOWEST", or nothing when there was no earlier (finite) value."""
    return f", from {lowest:.4g}" if math.isfinite(lowest) else ""


def _mean_of(rows: int) -> str:
    """What a running mean over ``rows`` training-loss rows is, for a message: "mean of the last 4
    steps" (fewer than the window at the start), or "one step"."""
    return f"mean of the last {rows} steps" if rows > 1 else "one step"


def _latest_signals(history: History, moving: bool = False) -> SignalRecord | None:
    """The latest signal record (``moving``: the latest with a learning rate above 0), or None."""
    records = [r for r in history.signals if r.learning_rate > 0] if moving else history.signals
    return records[-1] if records else None


@dataclass(frozen=True)
class VanishingGradient:
    """Fires for a parameter group whose root-mean-square gradient, ``gradient_norm / sqrt(parameters)``,
    is below ``threshold`` at the latest watched step (groups that do not train are skipped).
    SageMaker Debugger's VanishingGradient uses the same threshold on the mean absolute gradient."""

    name: ClassVar[str] = "vanishing_gradient"
    threshold: float = 1e-7

    def check(self, history: History) -> list[Finding]:
        record = _latest_signals(history)
        if record is None:
            return []
        found = []
        for group, norm, count in zip(record.groups, record.gradient_norm, record.parameters, strict=True):
            rms = norm / math.sqrt(count) if count else math.nan
            if rms < self.threshold:
                found.append(Finding(group, f"{group}: RMS gradient {rms:.2e} < {self.threshold:g}"))
        return found


@dataclass(frozen=True)
class ExplodingGradient:
    """The divergence rule. Fires when any of these holds:

    - training loss: the running mean of the training loss over the last ``window`` steps (fewer at the
      start; one value per training-loss row, every step in :func:`~bertology.training.finetune`) is not
      finite or above ``loss_growth`` times the lowest earlier running mean;
    - dev loss: the latest dev loss is not finite or above ``loss_growth`` times the lowest earlier one;
    - gradients: at the latest watched step the gradient norm over all groups is above ``max_norm`` or a
      group's gradient is not finite (before clipping).

    With gradients clipped, a divergence shows in the loss first: a learning rate of 1e3 saturates every
    activation, so the gradients even vanish, as the loss grows a thousandfold. The running mean keeps
    one unlucky batch from firing the rule on a healthy run (a batch's loss late in training ranges over
    more than a factor 10).

    Differs from SageMaker Debugger's ExplodingTensor, which fires when any saved tensor has a NaN or
    infinite value (``only_nan``: NaN only) and has no threshold on a loss or a gradient norm."""

    name: ClassVar[str] = "exploding_gradient"
    #: The watchdog marks the other rules' later alerts as following this rule's first alert.
    divergence: ClassVar[bool] = True
    max_norm: float = 1000.0
    loss_growth: float = 10.0
    window: int = 10

    def check(self, history: History) -> list[Finding]:
        found = []
        if history.train:
            means = running_means(np.array([row.loss for row in history.train]), self.window)
            latest, lowest = float(means[-1]), float(np.min(means[:-1], initial=np.inf))
            if not math.isfinite(latest) or latest > self.loss_growth * lowest:
                mean = _mean_of(min(self.window, len(history.train)))
                found.append(Finding("training loss", f"training loss {latest:.4g} ({mean}){_from(lowest)}"))
        if history.dev:
            latest = history.dev[-1].loss
            lowest = min((row.loss for row in history.dev[:-1]), default=math.inf)
            if not math.isfinite(latest) or latest > self.loss_growth * lowest:
                found.append(Finding("dev loss", f"dev loss {latest:.4g}{_from(lowest)}"))
        record = _latest_signals(history)
        if record is None:
            return found
        total = float(np.sqrt(np.sum(np.square(record.gradient_norm))))
        norms = zip(record.groups, record.gradient_norm, strict=True)
        bad = [group for group, norm in norms if not np.isfinite(norm)]
        if bad:
            found.append(Finding("gradients", f"gradients not finite in {', '.join(bad)}"))
        elif total > self.max_norm:
            found.append(Finding("gradients", f"gradient norm {total:.3g} > {self.max_norm:g}"))
        return found


@dataclass(frozen=True)
class WeightUpdateRatio:
    """Fires for a group whose update ratio ``update_norm / weight_norm`` (one step's change of its weights
    relative to the weights) is below ``small`` or above ``large``, at the latest watched step with a
    learning rate above 0. Typical fine-tuning steps give about 1e-4 to 1e-2.

    Differs from SageMaker Debugger's WeightUpdateRatio ("ratio of updates to weights is larger than
    ``large_threshold`` or ... smaller than ``small_threshold``", defaults 10.0 and 1e-8, with ``epsilon``
    1e-9 added to the divisor) in the upper bound: ours is 1, a step that moves a group by its own size."""

    name: ClassVar[str] = "weight_update_ratio"
    small: float = 1e-8
    large: float = 1.0

    def check(self, history: History) -> list[Finding]:
        record = _latest_signals(history, moving=True)
        if record is None:
            return []
        found = []
        for group, update, weight, count in zip(
            record.groups, record.update_norm, record.weight_norm, record.parameters, strict=True
        ):
            if not count or weight == 0:
                continue
            ratio = update / weight
            if not ratio >= self.small:  # NaN counts as too small: nothing measurable moved
                found.append(
                    Finding(f"{group} (too small)", f"{group}: update ratio {ratio:.2e} < {self.small:g}")
                )
            elif ratio > self.large:
                found.append(
                    Finding(f"{group} (too large)", f"{group}: update ratio {ratio:.3g} > {self.large:g}")
                )
        return found


@dataclass(frozen=True)
class SaturatedActivation:
    """Fires for a group whose saturated fraction of activations is above ``max_fraction`` at the latest
    watched step (tanh and sigmoid *outputs* within 3 % of their range from a bound, a margin of our
    choosing; ReLU-like units, GELU and SiLU included, that are not positive for any token of the batch:
    dead units), counted over all the group's outputs.

    Differs from SageMaker Debugger's SaturatedActivation, which looks at the activations' *inputs*
    (tanh inputs outside (-9.4999, 9.4999), sigmoid inputs outside (-23, 16.99999)), counts a node as
    saturated when it is active for less than ``threshold_inactivity`` 1 % of the batch, and fires when
    more than ``threshold_layer`` 50 % of a layer's nodes are; and from DeadRelu (ReLU nodes active for
    less than 1 %, more than 50 % of a layer), which we fold in as units never positive."""

    name: ClassVar[str] = "saturated_activation"
    max_fraction: float = 0.5

    def check(self, history: History) -> list[Finding]:
        record = _latest_signals(history)
        if record is None:
            return []
        return [
            Finding(group, f"{group}: {fraction:.0%} of activations saturated > {self.max_fraction:.0%}")
            for group, fraction in zip(record.groups, record.saturation, strict=True)
            if fraction > self.max_fraction
        ]


def _window_means(rows: list[LossRecord], window: int) -> list[tuple[int, float]]:
    """(last step, mean loss) of each complete window of ``window`` steps: rows with step in
    ``((i - 1) * window, i * window]`` for i = 1, 2, ... up to the last full window."""
    if not rows:
        return []
    complete = rows[-1].step // window
    index = (np.array([row.step for row in rows]) - 1) // window  # the window of each row
    inside = index < complete
    counts = np.bincount(index[inside], minlength=complete)
    sums = np.bincount(index[inside], np.array([row.loss for row in rows])[inside], minlength=complete)
    return [((i + 1) * window, float(sums[i] / counts[i])) for i in range(complete) if counts[i]]


@dataclass(frozen=True)
class LossNotDecreasing:
    """Fires when the mean training loss has not fallen for ``patience`` windows: the training-loss rows
    are cut into windows of ``window`` steps, and none of the last ``patience`` complete windows has a
    mean below ``(1 - min_decrease)`` times the lowest mean of the windows before them. Evaluated when a
    window completes (what it finds changes only then).

    Differs from SageMaker Debugger's LossNotDecreasing, which every ``num_steps`` (10) steps compares
    the loss at that step with the loss at the newest saved step at least ``num_steps`` back and fires
    unless it is lower by ``diff_percent`` (0 %): a loss flat over steps 10 to 40 fires there at step 20
    and is silent here until 4 windows of 50 steps have passed."""

    name: ClassVar[str] = "loss_not_decreasing"
    window: int = 50
    patience: int = 4
    min_decrease: float = 0.01

    def check(self, history: History) -> list[Finding]:
        rows = history.train
        if len(rows) < 2 or rows[-1].step // self.window == rows[-2].step // self.window:
            return []
        means = _window_means(rows, self.window)
        if len(means) <= self.patience:
            return []
        best = min(mean for _, mean in means[: -self.patience])
        recent = [mean for _, mean in means[-self.patience :]]
        if min(recent) < (1 - self.min_decrease) * best:
            return []
        steps = self.window * self.patience
        return [
            Finding(
                "training loss",
                f"training loss not below {best:.4f} for {steps} steps (now {recent[-1]:.4f})",
            )
        ]


def _train_loss_near(rows: list[LossRecord], step: int, window: int) -> float:
    """Mean training loss of the rows in ``(step - window, step]`` (else the last row up to ``step``)."""
    end = bisect.bisect_right(rows, step, key=lambda row: row.step)  # rows are in step order
    start = bisect.bisect_right(rows, step - window, key=lambda row: row.step)
    if end > start:
        return float(np.mean([row.loss for row in rows[start:end]]))
    return rows[end - 1].loss if end else math.nan


@dataclass(frozen=True)
class Overfitting:
    """Fires when the latest dev loss is at least ``min_rise`` (relative) above the lowest earlier dev loss
    while the training loss fell since that evaluation (training loss: the mean of the rows in the
    ``window`` steps up to each evaluation).

    Differs from SageMaker Debugger's Overfit, which fires when ``(validation - training) / training``
    loss exceeds ``ratio_threshold`` 0.1 (``patience`` 1): a dev loss of 0.6 against a steady training
    loss of 0.3 fires there and not here, where the dev loss must rise from its own lowest."""

    name: ClassVar[str] = "overfitting"
    min_rise: float = 0.05
    window: int = 50

    def check(self, history: History) -> list[Finding]:
        if len(history.dev) < 2:
            return []
        latest = history.dev[-1]
        best = min(history.dev[:-1], key=lambda row: row.loss)
        if not latest.loss >= (1 + self.min_rise) * best.loss:
            return []
        then = _train_loss_near(history.train, best.step, self.window)
        now = _train_loss_near(history.train, latest.step, self.window)
        if not now < then:
            return []
        return [
            Finding(
                "dev loss",
                f"dev loss rose from {best.loss:.4f} (step {best.step}) to {latest.loss:.4f} while training "
                f"loss fell from {then:.4f} to {now:.4f}",
            )
        ]


@dataclass(frozen=True)
class StalledTraining:
    """Fires when the weights have not changed at the last ``records`` watched steps with a learning rate
    above 0: the update norm over all groups is at most ``max_ratio`` times the weight norm (or nothing
    trains at all).

    Not SageMaker Debugger's StalledTrainingRule, which fires when no new data has been saved for
    ``threshold`` 1,800 seconds (wall time); this rule watches the weights, not the clock."""

    name: ClassVar[str] = "stalled_training"
    records: int = 2
    max_ratio: float = 1e-10

    def check(self, history: History) -> list[Finding]:
        moving = [record for record in history.signals if record.learning_rate > 0][-self.records :]
        if len(moving) < self.records:
            return []
        for record in moving:
            update = float(np.sqrt(np.sum(np.square(record.update_norm))))
            weight = float(np.sqrt(np.sum(np.square(record.weight_norm))))
            if record.parameters.sum() and update > self.max_ratio * weight:
                return []
        first, last = moving[0].step, moving[-1].step
        return [Finding("weights", f"weights unchanged at steps {first} to {last} (learning rate above 0)")]


@dataclass(frozen=True)
class ClassImbalance:
    """Fires when the training labels' most frequent class has at least ``max_ratio`` times the examples
    of the least frequent one, or a label has no training example.

    Differs from SageMaker Debugger's ClassImbalance, which fires when the ratio is *larger than*
    ``threshold_imbalance`` 10 (a ratio of exactly 10 fires here, not there), and also when a class's
    misprediction rate exceeds ``threshold_misprediction`` 0.7 over ``samples`` 500; we do not look at
    predictions."""

    name: ClassVar[str] = "class_imbalance"
    max_ratio: float = 10.0

    def check(self, history: History) -> list[Finding]:
        counts = history.label_counts
        if not counts:
            return []
        rarest = min(counts, key=lambda label: counts[label])
        commonest = max(counts, key=lambda label: counts[label])
        if counts[rarest] == 0:
            return [Finding("training labels", f"label {rarest!r} has no training example")]
        ratio = counts[commonest] / counts[rarest]
        if ratio < self.max_ratio:
            return []
        return [
            Finding(
                "training labels",
                f"label {commonest!r} has {counts[commonest]} examples, {ratio:.1f} times {rarest!r}'s "
                f"{counts[rarest]}",
            )
        ]


def _label_name(history: History, label: int, labels: int) -> str:
    """Label ``label`` (an index into the task's ``labels`` labels) by name, as the training labels'
    counts list them (in the task's order), else by its index."""
    names = list(history.label_counts or ())
    return repr(names[label]) if len(names) == labels else str(label)


@dataclass(frozen=True)
class OneClassPredictions:
    """Fires at a dev evaluation where at least ``max_share`` (95 %) of the dev predictions (the arg-max
    of the logits) are one label while fewer than ``max_share`` of the dev examples have that label:
    the classifier answers (nearly) the same class whatever the input, as a run that has not left its
    constant start or has collapsed onto a label does (a fine-tuning run of SST-2 predicting one label for
    every dev sentence has a dev accuracy near 0.5 and trips no other default rule). Skipped: an
    evaluation whose accuracy is undefined (logits not finite: the divergence rule's finding) and one
    without predictions (the ``Trainer`` callback's evaluations carry none).

    Ours: SageMaker Debugger has no rule for it. Its Confusion and ClassImbalance read the same
    predictions with other conditions: Confusion fires for any predicted label right less than 90 % of the
    time, one class or not; ClassImbalance for a label more than 70 % mispredicted, and only once 500 dev
    examples are seen."""

    name: ClassVar[str] = "one_class_predictions"
    #: the dev evaluations' confusion matrices (:func:`~bertology.training.rules.smdebug.records_read`)
    reads: ClassVar[frozenset[str]] = frozenset({"confusion"})
    max_share: float = 0.95

    def check(self, history: History) -> list[Finding]:
        latest = history.dev[-1] if history.dev else None
        if latest is None or latest.confusion is None or not math.isfinite(latest.accuracy):
            return []
        predicted, actual = latest.confusion.sum(axis=0), latest.confusion.sum(axis=1)
        total = int(predicted.sum())
        label = int(np.argmax(predicted))
        if not total or predicted[label] / total < self.max_share or actual[label] / total >= self.max_share:
            return []
        name = _label_name(history, label, len(predicted))
        return [
            Finding(
                "dev predictions",
                f"{predicted[label]} of the {total} dev predictions are label {name}, which "
                f"{actual[label]} of the dev examples have; dev accuracy {latest.accuracy:.3f}",
            )
        ]
