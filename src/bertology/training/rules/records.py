"""What the training rules read: the run's history as plain records, and what a rule reports.

A training loop (or Hugging Face's ``Trainer``, through
:class:`~bertology.training.callback.RulesCallback`) feeds a :class:`~bertology.training.rules.Watchdog`
these records as they are made: training-loss rows, dev evaluations, the per-layer signals of a watched
optimizer step (:mod:`bertology.training.signals`), the attention monitor's records and the training
labels' counts. The records hold numbers only (numpy arrays, no tensors), so a rule is a pure function of
the history and is tested on constructed histories.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class LossRecord:
    """A training-loss row: the training loss (mean cross-entropy over the batch, nats) at optimizer step
    ``step``; :func:`~bertology.training.finetune` gives one per step, a ``Trainer`` one per log (the mean
    since the previous log)."""

    step: int
    loss: float


@dataclass(frozen=True)
class DevRecord:
    """A dev evaluation at ``step``: mean cross-entropy (nats) and accuracy. confusion [C, C] int or None:
    dev examples by true label (row) and predicted label (column, the arg-max of the logits), recorded
    when a rule reads it (SageMaker Debugger's ``Confusion`` and ``ClassImbalance``)."""

    step: int
    loss: float
    accuracy: float
    confusion: np.ndarray | None = None


@dataclass(frozen=True)
class SignalRecord:
    """One watched optimizer step, per parameter group (``G`` groups: ``"embeddings"``, ``"layer 0"``, ...,
    ``"head"`` for the rest, e.g. pooler and classifier).

    step: the optimizer step (1-based) these were measured in; learning_rate: the rate it used.
    parameters [G] int: trainable weights per group (0: nothing of the group trains).
    gradient_norm [G]: L2 norm of the group's gradients (before clipping in :func:`finetune`).
    weight_norm [G]: L2 norm of the group's weights before the step.
    update_norm [G]: L2 norm of the step's change of the group's weights.
    saturation [G]: fraction of the group's activations that are saturated (NaN: no activation function
        in the group); see :mod:`bertology.training.signals` for the definition.
    """

    step: int
    learning_rate: float
    groups: tuple[str, ...]
    parameters: np.ndarray
    gradient_norm: np.ndarray
    weight_norm: np.ndarray
    update_norm: np.ndarray
    saturation: np.ndarray

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object (a line of ``signals.jsonl``; NaN as null)."""
        arrays = ("parameters", "gradient_norm", "weight_norm", "update_norm", "saturation")
        values = {
            name: [None if not np.isfinite(v) else float(v) for v in getattr(self, name)] for name in arrays
        }
        return {"step": self.step, "learning_rate": self.learning_rate, "groups": list(self.groups), **values}


@dataclass(frozen=True)
class AttentionRecord:
    """An attention monitor record at ``step``.

    statistics: the S names of ``stats``; stats [S, L, H]: per-head surface statistics over the probe set
    (:mod:`bertology.stats.surface`: ``entropy`` in nats, ``cls`` and ``sep`` attention mass...).
    change [L, H] or None: mean Jensen-Shannon divergence (nats) of each head's attention since the
    previous record (:func:`bertology.training.compare.head_change`); None at the first record.
    """

    step: int
    statistics: tuple[str, ...]
    stats: np.ndarray
    change: np.ndarray | None = None

    def statistic(self, name: str) -> np.ndarray | None:
        """[L, H] statistic ``name``, or None when it was not recorded."""
        return self.stats[self.statistics.index(name)] if name in self.statistics else None


@dataclass(frozen=True)
class ActivationRecord:
    """One activation function module's activity during a watched step's forward pass.

    name: the module's path in the model; group: its parameter group (``"layer 3"``); kind: ``"tanh"``,
    ``"sigmoid"`` or ``"relu"`` (ReLU and the functions that gate at 0 like it: GELU, SiLU...);
    function: the module's class (``"GELUActivation"``, ``"Tanh"``), which an alert names.
    activity [N]: for each of the module's N nodes (the last dimension of its input), the fraction of the
    batch's positions (padding included) at which the node was active: for tanh and sigmoid, its input
    strictly inside the recorder's bounds; for ReLU-like functions, its output above 0.
    input_variance: variance of all the module's inputs in the batch.
    """

    name: str
    group: str
    kind: str
    function: str
    activity: np.ndarray
    input_variance: float


@dataclass(frozen=True)
class TensorRecord:
    """Statistics of a watched step's tensors, per parameter group (``G`` groups as in
    :class:`SignalRecord`), for SageMaker Debugger's rules (:mod:`bertology.training.rules.smdebug`).

    Gradients are taken after ``backward`` and before clipping, weights before the optimizer step.
    ``gradient`` and ``weight`` map a statistic's name to its [G] array (NaN for a group without
    trainable tensors): ``abs_mean`` (mean absolute value), ``zero_fraction``, ``variance``, ``nan`` and
    ``inf`` (counts of such values), ``spread`` (gradients only: 95th minus 5th percentile).
    activations: the activation modules' records (empty unless recorded). token_counts: how often each
    token id was among the word embeddings' inputs of the step (padding included); tokens: their number.
    """

    step: int
    groups: tuple[str, ...]
    gradient: dict[str, np.ndarray] = field(default_factory=dict)
    weight: dict[str, np.ndarray] = field(default_factory=dict)
    activations: tuple[ActivationRecord, ...] = ()
    token_counts: dict[int, int] = field(default_factory=dict)
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record as a line of ``tensors.jsonl`` (NaN as null): the per-group statistics, each
        activation module's mean activity and input variance, and the token count with the most frequent
        ids."""

        def listed(values: np.ndarray) -> list[float | None]:
            return [float(v) if np.isfinite(v) else None for v in values]

        activations = [
            {"name": a.name, "kind": a.kind, "function": a.function,
             "mean_activity": float(np.mean(a.activity)), "input_variance": a.input_variance}
            for a in self.activations
        ]  # fmt: skip
        commonest = sorted(self.token_counts.items(), key=lambda item: -item[1])[:10]
        return {
            "step": self.step,
            "groups": list(self.groups),
            "gradient": {name: listed(values) for name, values in self.gradient.items()},
            "weight": {name: listed(values) for name, values in self.weight.items()},
            "activations": activations,
            "tokens": self.tokens,
            "commonest_tokens": [[token, count] for token, count in commonest],
        }


@dataclass
class History:
    """Everything recorded so far, oldest first."""

    train: list[LossRecord] = field(default_factory=list)
    dev: list[DevRecord] = field(default_factory=list)
    signals: list[SignalRecord] = field(default_factory=list)
    attention: list[AttentionRecord] = field(default_factory=list)
    #: training examples per label, in the task's label order (a confusion matrix's rows and columns)
    label_counts: dict[str, int] | None = None
    tensors: list[TensorRecord] = field(default_factory=list)
    #: wall-clock time (seconds, monotonic) at which each record of any kind arrived, in order
    record_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """What a rule found at one place: ``where`` names it (``"layer 3"``, ``"layer 2 head 5"``,
    ``"dev loss"``), ``what`` says what was found, with the numbers; ``head`` is ``(layer, head)``
    (0-based) for a finding about one head, ``layer`` the layer for one about a layer's heads."""

    where: str
    what: str
    head: tuple[int, int] | None = None
    layer: int | None = None


@dataclass(frozen=True)
class Alert:
    """A rule that fired: its name, the step it fired at, what it found and where (one entry per place;
    ``heads``: the ``[layer, head]`` pairs it names, 0-based, for the watch page's marks). ``follows``:
    the divergence it came after (``"exploding_gradient at step 3"``), so likely a consequence of it;
    None when the run had not diverged (:mod:`~bertology.training.rules.watchdog`)."""

    rule: str
    step: int
    what: str
    where: tuple[str, ...]
    heads: tuple[tuple[int, int], ...] = ()
    follows: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As ``run.json`` keeps it: ``{"rule", "step", "what", "where": [...], "heads": [[l, h], ...],
        "follows"}``."""
        return {
            "rule": self.rule,
            "step": self.step,
            "what": self.what,
            "where": list(self.where),
            "heads": [list(head) for head in self.heads],
            "follows": self.follows,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Alert:
        """The alert of :meth:`to_json`'s object."""
        heads = tuple((int(layer), int(head)) for layer, head in data.get("heads", []))
        follows = data.get("follows")
        return cls(
            str(data["rule"]), int(data["step"]), str(data["what"]), tuple(data["where"]), heads,
            None if follows is None else str(follows),
        )  # fmt: skip

    def __str__(self) -> str:
        after = "" if self.follows is None else f" (after {self.follows})"
        return f"step {self.step}: {self.rule}{after}: {self.what}"
