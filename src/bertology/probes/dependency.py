"""Which attention heads track which dependency relations (Clark et al. 2019, Section 4.2, Table 1).

Every head predicts a head word for every word of a sentence from its word-level attention
(:mod:`bertology.attention.words`) over the sentence's words, in two directions (as in Clark et al.'s released
code, ``Syntax_Analysis.ipynb``, modes "normal" and "transpose"):

* ``0`` dependent -> head: the word the dependent attends to most, ``argmax_j W[d, j]``;
* ``1`` head -> dependent: the word that attends to the dependent most, ``argmax_j W[j, d]``;

with ``W`` the word-to-word attention among the words only (special tokens are never candidates) and the
word itself excluded (``W[d, d]`` is not a candidate), as Clark et al.'s code does. A ``max_j`` tie goes
to the first word. The accuracy of a head for a relation is the fraction of the relation's dependents
whose predicted head is the gold head; root words have no head and are not scored. Direction 1 scores
each dependent on its own column; it is not "the argmax of the head's row is the dependent", under which
a head word with several dependents could find only one of them.

The baseline predicts, for every dependent ``d``, the word at a fixed offset ``d + k`` (``k`` in
``OFFSETS``, -5..+5 without 0); an offset past the sentence's edge is simply wrong. Per relation the best
offset is reported (Clark et al. report the best of -3..+2 and clamp to the sentence).

Clark et al.'s special case for ``poss`` (score the possessive "'s" instead) is not applied.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertology.attention.words import WordAttention
from bertology.corpus.readers.treebank import Sentence, base_relation
from bertology.errors import BertologyError
from bertology.probes.base import BestHead
from bertology.stats.base import check_same_shape

if TYPE_CHECKING:
    import pandas as pd

#: Names of the two prediction directions; a direction is an index into this tuple.
DIRECTIONS = ("dependent->head", "head->dependent")
#: Offsets of the fixed-offset baseline, from the dependent to its predicted head.
OFFSETS = np.array([-5, -4, -3, -2, -1, 1, 2, 3, 4, 5])
#: Name of the row over the dependents of every relation.
ALL = "all"


def predictions(between_words: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """[2, ..., n_words] int64: each word's predicted head in both directions (see the module docstring).

    between_words: [..., n_words, n_words] attention among the words (``WordAttention.between_words``), or
    a batch [batch, ..., w, w] padded to ``w`` words with ``lengths`` [batch] the words of each sentence
    (padding is never a candidate; its predictions mean nothing). A one-word sentence predicts the word
    itself (there is no other candidate).
    """
    n = between_words.shape[-1]
    candidate = ~torch.eye(n, dtype=torch.bool, device=between_words.device)
    if lengths is not None:
        word = torch.arange(n, device=between_words.device) < lengths.to(between_words.device)[:, None]
        word = word.reshape(word.shape[:1] + (1,) * (between_words.dim() - 3) + word.shape[1:])
        candidate = candidate & word[..., :, None] & word[..., None, :]
    candidates = between_words.masked_fill(~candidate, float("-inf"))
    # max(...).indices: the first maximum, as argmax, and faster along a strided dimension
    return torch.stack([candidates.max(-1).indices, candidates.max(-2).indices])


def predicted_heads(word_attention: WordAttention, layer: int, head: int, direction: int) -> np.ndarray:
    """[n_words] int: the head word one head ``(layer, head)`` predicts for every word, in ``direction``
    (0 dependent -> head, 1 head -> dependent); 0-based word indices, for drawing predicted arcs."""
    between = torch.from_numpy(word_attention.between_words()[layer, head])
    return predictions(between)[direction].numpy()


@dataclass(frozen=True)
class Baseline:
    """The best fixed offset for a relation and its accuracy."""

    offset: int
    accuracy: float


@dataclass
class _Counts:
    """Counts of one relation.

    correct: [2, layers, heads] dependents whose head each head predicts, per direction.
    offset_correct: [len(OFFSETS)] dependents whose head is at each offset.
    total: dependents scored.
    """

    correct: np.ndarray
    offset_correct: np.ndarray
    total: int

    def add(self, other: _Counts) -> None:
        self.correct += other.correct
        self.offset_correct += other.offset_correct
        self.total += other.total


@dataclass
class DependencyProbe:
    """Per relation and head, how often the head's attention finds the gold head word.

    relations: relation labels, most dependents first (ties by name).
    correct: [relations, 2, layers, heads] int64 correct predictions per direction (``DIRECTIONS``).
    counts: [relations] int64 dependents scored per relation.
    offset_correct: [relations, len(OFFSETS)] int64 dependents whose head is at each offset.
    sentences: sentences scored.

    Every method that takes a relation also takes ``ALL`` ("all"): the dependents of every relation.
    """

    relations: list[str]
    correct: np.ndarray
    counts: np.ndarray
    offset_correct: np.ndarray
    sentences: int
    _rows: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rows = {relation: row for row, relation in enumerate(self.relations)}

    @property
    def num_layers(self) -> int:
        return self.correct.shape[2]

    @property
    def num_heads(self) -> int:
        return self.correct.shape[3]

    def _counts(self, relation: str) -> _Counts:
        if relation == ALL:
            return _Counts(self.correct.sum(0), self.offset_correct.sum(0), int(self.counts.sum()))
        if relation not in self._rows:
            raise BertologyError(
                f"The probe saw no '{relation}' dependents; known relations: {', '.join(self.relations)}."
            )
        row = self._rows[relation]
        return _Counts(self.correct[row], self.offset_correct[row], int(self.counts[row]))

    def count(self, relation: str) -> int:
        """Dependents scored for ``relation``."""
        return self._counts(relation).total

    def accuracy(self, relation: str) -> np.ndarray:
        """[2, layers, heads] float64 accuracy of every head in both directions."""
        counts = self._counts(relation)
        return counts.correct / counts.total

    def heatmap(self, relation: str, direction: int) -> np.ndarray:
        """[layers, heads] float64 accuracy of every head in one direction (0 or 1)."""
        return self.accuracy(relation)[direction]

    def best(self, relation: str) -> BestHead:
        """The most accurate head and direction (ties: the first in direction, layer, head order); its
        ``score`` is the accuracy."""
        accuracy = self.accuracy(relation)
        direction, layer, head = np.unravel_index(accuracy.argmax(), accuracy.shape)
        return BestHead(int(layer), int(head), float(accuracy[direction, layer, head]), int(direction))

    def baseline(self, relation: str) -> Baseline:
        """The most accurate fixed offset (ties: the first in ``OFFSETS`` order)."""
        counts = self._counts(relation)
        best = int(counts.offset_correct.argmax())
        return Baseline(int(OFFSETS[best]), float(counts.offset_correct[best] / counts.total))

    def table(self) -> pd.DataFrame:
        """Clark et al.'s Table 1: one row per relation, ``"all"`` first, then most dependents first.

        Columns: relation, count (dependents), best_head (``"layer-head"``, 0-based), layer, head,
        direction (0 or 1), direction_name, accuracy, baseline_offset, baseline_accuracy.
        """
        import pandas as pd

        rows = []
        for relation in [ALL, *self.relations]:
            best, baseline = self.best(relation), self.baseline(relation)
            rows.append(
                {
                    "relation": relation,
                    "count": self.count(relation),
                    "best_head": best.label,
                    "layer": best.layer,
                    "head": best.head,
                    "direction": best.direction,
                    "direction_name": DIRECTIONS[best.direction],
                    "accuracy": best.score,
                    "baseline_offset": baseline.offset,
                    "baseline_accuracy": baseline.accuracy,
                }
            )
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """Long form: one row per relation (``"all"`` first), direction, layer and head, with columns
        relation, direction (0 or 1), layer, head (0-based), accuracy, count."""
        import pandas as pd

        names = [ALL, *self.relations]
        accuracy = np.stack([self.accuracy(relation) for relation in names])  # [R + 1, 2, layers, heads]
        relation, direction, layer, head = np.indices(accuracy.shape).reshape(4, -1)
        counts = np.array([self.count(name) for name in names])
        return pd.DataFrame(
            {
                "relation": np.array(names, dtype=object)[relation],
                "direction": direction,
                "layer": layer,
                "head": head,
                "accuracy": accuracy.reshape(-1),
                "count": counts[relation],
            }
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain counts: every accuracy and baseline is ``correct / count``."""
        return {
            "layers": self.num_layers,
            "heads": self.num_heads,
            "sentences": self.sentences,
            "directions": list(DIRECTIONS),
            "offsets": OFFSETS.tolist(),
            "relations": {
                relation: {
                    "count": int(self.counts[row]),
                    "correct": self.correct[row].tolist(),
                    "offset_correct": self.offset_correct[row].tolist(),
                }
                for row, relation in enumerate(self.relations)
            },
        }

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict` (``correct`` per relation is ``[2][layers][heads]``)."""
        return json.dumps(self.to_dict())


class DependencyAccumulator:
    """Streams sentences and their word attention into a :class:`DependencyProbe`.

    relations: score only dependents with these labels (after ``strip_subtypes``); ``None``: all.
        The ``"all"`` row covers the scored dependents only.
    strip_subtypes: drop UD relation subtypes ("nmod:poss" -> "nmod"); labels are otherwise kept as given.

    Merging the accumulators of two halves of a treebank gives the result of one pass.
    """

    def __init__(self, relations: Iterable[str] | None = None, *, strip_subtypes: bool = False) -> None:
        self.relations = None if relations is None else frozenset(relations)
        self.strip_subtypes = strip_subtypes
        self.sentences = 0
        self._counts: dict[str, _Counts] = {}
        self._shape: tuple[int, int] | None = None

    def _label(self, relation: str) -> str:
        return base_relation(relation) if self.strip_subtypes else relation

    def _add(self, relation: str, counts: _Counts) -> None:
        if relation in self._counts:
            self._counts[relation].add(counts)
        else:
            self._counts[relation] = counts

    def update(self, sentence: Sentence, word_attention: WordAttention) -> None:
        """Score every head on one sentence.

        Raises:
            BertologyError: the word attention is not over the sentence's words, or is for another
                model than earlier updates.
        """
        if len(word_attention.word_positions) != len(sentence.heads):
            raise BertologyError(
                f"Sentence {sentence.origin} has {len(sentence.heads)} words but its attention has "
                f"{len(word_attention.word_positions)}; capture the sentence's word list."
            )
        between = torch.from_numpy(word_attention.between_words())
        self.add_predictions(sentence, predictions(between).numpy())

    def add_predictions(self, sentence: Sentence, predicted: np.ndarray) -> None:
        """Score every head on one sentence from the head words its heads predict.

        predicted: [2, layers, heads, n_words] int (:func:`predictions` of the sentence's word attention).

        Raises:
            BertologyError: predictions for another model than earlier updates.
        """
        heads = np.asarray(sentence.heads, dtype=np.int64)
        shape = predicted.shape[1:3]
        check_same_shape(self._shape, shape, "This accumulator")
        self._shape = shape
        self.sentences += 1
        labels = np.array([self._label(relation) for relation in sentence.relations], dtype=object)
        kept = heads >= 0
        if self.relations is not None:
            kept &= np.isin(labels, list(self.relations))
        dependents = np.flatnonzero(kept)
        if len(dependents) == 0:
            return
        gold = heads[dependents]
        hits = predicted[..., dependents] == gold  # [2, L, H, d]
        offset_hits = (gold - dependents)[:, None] == OFFSETS  # [d, offsets]
        names, relation_of = np.unique(labels[dependents], return_inverse=True)
        one_hot = np.eye(len(names), dtype=np.int64)[relation_of.reshape(-1)]  # [d, relations]
        correct = np.einsum("slhd,dr->rslh", hits.astype(np.int64), one_hot)  # [relations, 2, L, H]
        offset_correct = one_hot.T @ offset_hits.astype(np.int64)  # [relations, offsets]
        totals = one_hot.sum(0)
        for index, name in enumerate(names):
            self._add(str(name), _Counts(correct[index], offset_correct[index], int(totals[index])))

    def merge(self, other: DependencyAccumulator) -> DependencyAccumulator:
        """Fold ``other``'s counts into this one (``other`` is left as it was) and return ``self``.

        Raises:
            BertologyError: different relation settings, or counts for another model.
        """
        if (other.relations, other.strip_subtypes) != (self.relations, self.strip_subtypes):
            raise BertologyError("Cannot merge dependency accumulators with different relation settings.")
        if other._shape is not None:
            check_same_shape(self._shape, other._shape, "This accumulator")
            self._shape = other._shape
        for relation, counts in other._counts.items():
            self._add(relation, _Counts(counts.correct.copy(), counts.offset_correct.copy(), counts.total))
        self.sentences += other.sentences
        return self

    def result(self) -> DependencyProbe:
        """The probe over everything seen so far.

        Raises:
            BertologyError: no dependent has been scored yet.
        """
        if not self._counts:
            raise BertologyError("The dependency probe has scored no dependents yet; update it first.")
        relations = sorted(self._counts, key=lambda name: (-self._counts[name].total, name))
        return DependencyProbe(
            relations=relations,
            correct=np.stack([self._counts[name].correct for name in relations]),
            counts=np.array([self._counts[name].total for name in relations], dtype=np.int64),
            offset_correct=np.stack([self._counts[name].offset_correct for name in relations]),
            sentences=self.sentences,
        )
