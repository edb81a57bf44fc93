"""What a head intervention is measured by: a :class:`Task` is a model, its evaluation inputs in batches and a
score, so one ablation sweep, pruning curve and importance (:mod:`~bertology.interventions.ablation`,
:mod:`~bertology.interventions.curves`, :mod:`~bertology.interventions.importance`) serve a classifier
(:class:`ClassifierTask`: accuracy on labelled examples) and a language model
(:class:`~bertology.interventions.language_model.LanguageModelTask`: next-token cross-entropy on a corpus).

A score is a ratio of sums over examples, ``sum_x s(x) / sum_x w(x)``: for a classifier ``s(x)`` is 1 when
the arg-max label is the gold one and ``w(x) = 1`` (accuracy); for a language model ``s(x)`` is the summed
next-token cross-entropy of sequence ``x`` and ``w(x)`` its number of predicted tokens (nats per token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.nn.functional import cross_entropy

from bertology.errors import BertologyError
from bertology.interventions.data import LabelledTexts, batches, eval_mode, token_counts
from bertology.interventions.gates import head_gates
from bertology.interventions.replacement import HeadReplacement, ZeroReplacement, head_replacement
from bertology.models.heads import HeadSelection
from bertology.models.loading import LoadedModel

#: A model's inputs for one batch and the rows of the task's examples they hold.
Inputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Score:
    """How a task's score reads.

    name: its column in the files (``"accuracy"``, ``"loss"``). higher_is_better: whether a head whose
    removal raises it hurt the task (no: the loss). unit: what it is measured in, for plots and text.
    """

    name: str
    higher_is_better: bool
    unit: str


#: A classifier's share of examples whose predicted label is the gold one.
ACCURACY = Score("accuracy", True, "accuracy")
#: A language model's mean next-token cross-entropy.
LOSS = Score("loss", False, "nats per token")

#: Examples per batch of a classifier's importance (:mod:`~bertology.interventions.importance`).
IMPORTANCE_BATCH = 16


@dataclass(frozen=True)
class Terms:
    """How an ablation study of a task (:mod:`~bertology.interventions.run`) words its files, report and
    message: the differences of a classifier's, a decoder's and an encoder-decoder's study, as data.

    source: the summary key of what the examples were read from (``"task"``, ``"corpus"``). examples: the
    summary key of their number. counted: the summary key of the count the score averages over where it is
    not the examples (``"predicted tokens"``), else ``None``. baseline: the summary key of the score with
    every head. sentence, headline: the report's and the command's account of that score, formatted with
    ``score``, ``count`` and ``examples``. head: what a removed head is called. averaged: what the
    importance averages over. loss: the loss it differentiates. axis: the score on a plot's axis.
    sign: what the sign of a change means (or ""). pruned_as: ``load_model``'s keyword that loads a pruned
    copy (``"classifier"``, ``"language_model"``), ``None`` where heads are not removed structurally.
    title: the report title's end.
    """

    source: str
    examples: str
    baseline: str
    sentence: str
    headline: str
    head: str
    averaged: str
    loss: str
    axis: str
    counted: str | None = None
    sign: str = ""
    pruned_as: str | None = None
    title: str = ""


#: A classifier's study on a task's dev set.
CLASSIFIER_TERMS = Terms(
    source="task",
    examples="dev examples",
    baseline="dev accuracy, all heads",
    sentence="Dev accuracy with every head: {score:.4f}.",
    headline="Dev accuracy {score:.4f} on {examples} examples",
    head="head",
    averaged="dev examples",
    loss="the example's cross-entropy",
    axis="dev accuracy",
    pruned_as="classifier",
)


class Task(ABC):
    """A model and its evaluation inputs, scored per example (see the module docstring).

    loaded: the model. score: how the score reads. examples: what ``__len__`` counts (``"examples"``,
    ``"sequences"``).
    """

    loaded: LoadedModel
    score: Score
    #: How its ablation study words its numbers.
    terms: Terms
    #: Why a score of no weight at all cannot be given (``None``: it is NaN).
    nothing_scored: str | None = None
    #: Examples per batch of the importance (``None``: the study's batch size).
    importance_batch: int | None = None
    #: The input whose 1s mark the token positions of the logits that are scored (``None``: the logits
    #: have no token axis).
    token_mask: str | None = None

    @abstractmethod
    def __len__(self) -> int:
        """Number of examples."""

    @abstractmethod
    def batches(self, batch_size: int, *, by_length: bool = False) -> Iterator[tuple[Inputs, np.ndarray]]:
        """The examples in batches of ``batch_size``: the model's inputs and the rows they hold (consecutive
        ones; with ``by_length``, where the task allows, examples of similar length together)."""

    @abstractmethod
    def parts(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        """[batch, 2] float64 per example of a batch: ``s(x)`` and ``w(x)`` of the score, from the model's
        ``logits`` on ``inputs``."""

    @abstractmethod
    def loss(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        """The differentiable loss summed over the examples of a batch (nats; Michel et al.'s importance
        differentiates it)."""

    def on(self, loaded: LoadedModel) -> Task:
        """The same examples and score on another model ``loaded`` (a pruned copy, say)."""
        return replace(self, loaded=loaded)  # type: ignore[type-var]

    @abstractmethod
    def replacement(
        self, ablation: str | HeadReplacement, *, seed: int = 0, batch_size: int = 8
    ) -> HeadReplacement:
        """What a removed head's output becomes with these examples as the reference set: ``ablation``
        ``"zero"``, ``"mean"`` or ``"resample"`` (seeded by ``seed``; see
        :mod:`~bertology.interventions.replacement`), or a replacement already built (returned as it is).

        Raises:
            BertologyError: an unknown kind, or a set too small for it.
        """

    def ratio(self, parts: np.ndarray) -> float:
        """The score of per-example ``parts`` ([examples, 2], see :meth:`parts`).

        Raises:
            BertologyError: weights that sum to 0, where the task has :attr:`nothing_scored` to say so.
        """
        total = parts[:, 1].sum()
        if total == 0 and self.nothing_scored is not None:
            raise BertologyError(self.nothing_scored)
        return float(parts[:, 0].sum() / total)

    def evaluate(
        self,
        *,
        gates: torch.Tensor | HeadSelection | None = None,
        replacement: HeadReplacement | None = None,
        batch_size: int = 8,
    ) -> float:
        """The score of the model with head ``gates`` if given (see
        :func:`~bertology.interventions.gates.head_gates`), gated heads taking ``replacement`` (from
        :meth:`replacement`; ``None``: zero)."""
        replace = replacement or ZeroReplacement()
        parts = np.empty((len(self), 2))
        with torch.inference_mode(), eval_mode(self.loaded):
            for inputs, rows in self.batches(batch_size):
                if gates is None:
                    logits = self.loaded.model(**inputs).logits
                else:
                    with head_gates(self.loaded, gates, replace(inputs, rows)):
                        logits = self.loaded.model(**inputs).logits
                parts[rows] = self.parts(logits, inputs, rows).cpu().numpy()
        return self.ratio(parts)


@dataclass(frozen=True)
class ClassifierTask(Task):
    """A classifier ``loaded`` scored by its accuracy on the labelled examples ``data``."""

    loaded: LoadedModel
    data: LabelledTexts
    score: Score = ACCURACY
    terms: Terms = CLASSIFIER_TERMS
    importance_batch: int | None = IMPORTANCE_BATCH

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, batch_size: int, *, by_length: bool = False) -> Iterator[tuple[Inputs, np.ndarray]]:
        for batch in batches(self.loaded, self.data, batch_size=batch_size, by_length=by_length):
            yield batch.inputs, batch.rows

    def _labels(self, rows: np.ndarray, device: torch.device) -> torch.Tensor:
        return torch.as_tensor(self.data.labels[rows], device=device)

    def parts(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        right = logits.float().argmax(-1) == self._labels(rows, logits.device)
        return torch.stack([right.double(), torch.ones_like(right, dtype=torch.float64)], -1)

    def loss(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        return cross_entropy(logits.float(), self._labels(rows, logits.device), reduction="sum")

    def replacement(
        self, ablation: str | HeadReplacement, *, seed: int = 0, batch_size: int = 32
    ) -> HeadReplacement:
        def reference(rows: np.ndarray | None, size: int) -> Iterator[tuple[Inputs, np.ndarray]]:
            chosen = self.data if rows is None else self.data.take(rows)
            for batch in batches(self.loaded, chosen, batch_size=size):
                yield batch.inputs, batch.rows if rows is None else rows[batch.rows]

        return head_replacement(
            self.loaded,
            ablation,
            batches=reference,
            lengths=lambda: token_counts(self.loaded, self.data),
            seed=seed,
            batch_size=batch_size,
        )
