"""The coreference probe's counts: per mention type and head, the mentions each head gets right
(:class:`CorefProbe`), streamed and merged by :class:`CorefAccumulator`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bertology.errors import BertologyError
from bertology.probes.base import BestHead
from bertology.probes.coreference.mentions import ALL, BASELINES, TYPES
from bertology.probes.coreference.windows import CorefWindow
from bertology.stats.base import check_same_shape

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class DocumentsRead:
    """What the documents read before a window add to a coreference run beside the window's own scores.

    documents, mentions: how many were read. skipped: [types] int64 mentions in sentences too long for
    the model alone. out_of_reach: [types] int64 out-of-reach mentions of windows with nothing to score.
    """

    documents: int = 0
    mentions: int = 0
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(len(TYPES), dtype=np.int64))
    out_of_reach: np.ndarray = field(default_factory=lambda: np.zeros(len(TYPES), dtype=np.int64))

    @property
    def empty(self) -> bool:
        return self.documents == 0 and not self.out_of_reach.any()


@dataclass(frozen=True)
class MentionAnswer:
    """One scored mention and every head's choice of antecedent.

    document: its document's name; span: its words ``[start, end)`` in the document; text: those words;
    kind: its type (index into :data:`TYPES`). candidates: [k] document indices of the distinct head words
    of its in-reach candidates; candidate_texts: [k] the nearest candidate's words for each;
    antecedents: [k] bool, whether each is an antecedent's head word. choice: [layers, heads] int32, the
    candidate each head picks (an index into ``candidates``). baselines: whether nearest, same head and
    sieve (:data:`BASELINES`) are right.
    """

    document: str
    span: tuple[int, int]
    text: str
    kind: int
    candidates: np.ndarray
    candidate_texts: tuple[str, ...]
    antecedents: np.ndarray
    choice: np.ndarray
    baselines: tuple[bool, bool, bool]


def _ratio(correct: np.ndarray, counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64).reshape(counts.shape + (1,) * (correct.ndim - counts.ndim))
    return np.divide(correct, counts, out=np.full(correct.shape, np.nan), where=counts > 0)


@dataclass
class CorefProbe:
    """Per mention type and head, how often the head's attention picks an antecedent.

    correct: [types, layers, heads] int64 mentions each head gets right (types: :data:`TYPES`).
    counts: [types] int64 mentions scored. baselines: [types, 3] int64 mentions each baseline
    (:data:`BASELINES`) gets right. out_of_reach: [types] coreferent mentions whose antecedents were all
    before their window. skipped: [types] mentions in sentences too long for the model alone, or whose
    head word has no tokens. documents, windows: how many were read and captured. answers: every scored
    mention with each head's choice (:meth:`antecedents`), in the order scored.

    Every method taking ``kind`` takes a type name or ``ALL`` ("all", the default).
    """

    correct: np.ndarray
    counts: np.ndarray
    baselines: np.ndarray
    out_of_reach: np.ndarray
    skipped: np.ndarray
    documents: int
    windows: int
    answers: list[MentionAnswer] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return self.correct.shape[1]

    @property
    def num_heads(self) -> int:
        return self.correct.shape[2]

    def _row(self, kind: str) -> int:
        names = [*TYPES, ALL]
        if kind not in names:
            raise BertologyError(f"Unknown mention type '{kind}'; use one of: {', '.join(names)}.")
        return names.index(kind)

    def count(self, kind: str = ALL) -> int:
        return int(np.append(self.counts, self.counts.sum())[self._row(kind)])

    @property
    def accuracy(self) -> np.ndarray:
        """[types + 1, layers, heads] float64 accuracy per head; the last row is "all"; NaN where a type
        has no mentions."""
        correct = np.concatenate([self.correct, self.correct.sum(0, keepdims=True)])
        return _ratio(correct, np.append(self.counts, self.counts.sum()))

    def baseline_accuracy(self) -> np.ndarray:
        """[types + 1, 3] float64 accuracy of each baseline (:data:`BASELINES`), the last row "all"."""
        correct = np.concatenate([self.baselines, self.baselines.sum(0, keepdims=True)])
        return _ratio(correct, np.append(self.counts, self.counts.sum()))

    def heatmap(self, kind: str = ALL) -> np.ndarray:
        """[layers, heads] float64 accuracy of every head."""
        return self.accuracy[self._row(kind)]

    def best(self, kind: str = ALL) -> BestHead:
        """The most accurate head (ties: the first in layer, head order); its ``score`` is the accuracy, NaN
        without mentions."""
        return BestHead.of_grid(self.heatmap(kind))

    def table(self) -> pd.DataFrame:
        """Clark et al.'s Table 2: one row per mention type, then ``"all"``.

        Columns: type, count, out_of_reach, best_head (``"layer-head"``, 0-based; chosen per row),
        accuracy, nearest, same_head, sieve (accuracies).
        """
        import pandas as pd

        baselines = self.baseline_accuracy()
        out = np.append(self.out_of_reach, self.out_of_reach.sum())
        rows = []
        for row, kind in enumerate([*TYPES, ALL]):
            best = self.best(kind)
            rows.append(
                {
                    "type": kind,
                    "count": self.count(kind),
                    "out_of_reach": int(out[row]),
                    "best_head": best.label,
                    "accuracy": best.score,
                    **{name: float(baselines[row, i]) for i, name in enumerate(BASELINES)},
                }
            )
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """Long form: one row per type (then "all"), layer and head: type, layer, head, accuracy, count."""
        import pandas as pd

        accuracy = self.accuracy
        kind, layer, head = np.indices(accuracy.shape).reshape(3, -1)
        counts = np.append(self.counts, self.counts.sum())
        return pd.DataFrame(
            {
                "type": np.array([*TYPES, ALL], dtype=object)[kind],
                "layer": layer,
                "head": head,
                "accuracy": accuracy.reshape(-1),
                "count": counts[kind],
            }
        )

    def antecedents(self) -> pd.DataFrame:
        """The antecedent the best head over all mentions (:meth:`best`) picks for every scored mention,
        one row each: ``document``, ``mention_start``, ``mention_end`` (its words in the document,
        0-based, end excluded), ``mention``, ``type``, ``best_head`` (``"layer-head"``), ``predicted``
        (the words of the nearest candidate mention with the head word the head attends to most),
        ``predicted_word`` (that head word's index in the document), ``correct`` (it is an antecedent's
        head word), ``gold`` (the head words of the mention's in-reach antecedents, ``;``-separated) and
        whether each baseline (:data:`BASELINES`) is right."""
        import pandas as pd

        best = self.best()
        rows = []
        for answer in self.answers:
            picked = int(answer.choice[best.layer, best.head])
            rows.append(
                {
                    "document": answer.document,
                    "mention_start": answer.span[0],
                    "mention_end": answer.span[1],
                    "mention": answer.text,
                    "type": TYPES[answer.kind],
                    "best_head": best.label,
                    "predicted": answer.candidate_texts[picked],
                    "predicted_word": int(answer.candidates[picked]),
                    "correct": bool(answer.antecedents[picked]),
                    "gold": ";".join(str(word) for word in answer.candidates[answer.antecedents]),
                    **{name: right for name, right in zip(BASELINES, answer.baselines, strict=True)},
                }
            )
        columns = ["document", "mention_start", "mention_end", "mention", "type", "best_head", "predicted"]
        columns += ["predicted_word", "correct", "gold", *BASELINES]
        return pd.DataFrame(rows, columns=columns)

    def to_dict(self) -> dict[str, Any]:
        """Plain counts per type: every accuracy is ``correct / count``."""
        return {
            "layers": self.num_layers,
            "heads": self.num_heads,
            "documents": self.documents,
            "windows": self.windows,
            "baselines": list(BASELINES),
            "types": {
                kind: {
                    "count": int(self.counts[row]),
                    "correct": self.correct[row].tolist(),
                    "baseline_correct": self.baselines[row].tolist(),
                    "out_of_reach": int(self.out_of_reach[row]),
                    "skipped": int(self.skipped[row]),
                }
                for row, kind in enumerate(TYPES)
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class CorefAccumulator:
    """Streams windows and their attention rows into a :class:`CorefProbe` (an
    :class:`~bertology.accumulator.Accumulator`: :meth:`update` takes one window and its rows)."""

    def __init__(self) -> None:
        self._shape: tuple[int, int] | None = None
        self.correct: np.ndarray | None = None
        self.counts = np.zeros(len(TYPES), dtype=np.int64)
        self.baselines = np.zeros((len(TYPES), len(BASELINES)), dtype=np.int64)
        self.out_of_reach = np.zeros(len(TYPES), dtype=np.int64)
        self.skipped = np.zeros(len(TYPES), dtype=np.int64)
        self.documents = 0
        self.windows = 0
        self.answers: list[MentionAnswer] = []
        #: Mentions in the documents read (scored or not).
        self.mentions = 0
        #: Items of a run's batches added (:func:`coref_batches`; the count a distributed run's progress
        #: and checkpoints go by).
        self.items = 0

    def _grid(self, shape: tuple[int, int]) -> np.ndarray:
        check_same_shape(self._shape, shape, "This accumulator")
        self._shape = shape
        if self.correct is None:
            self.correct = np.zeros((len(TYPES), *shape), dtype=np.int64)
        return self.correct

    def add_document(self, skipped: np.ndarray | None = None) -> None:
        """Count one document read, with its mentions skipped as too long (``[types]``)."""
        self.documents += 1
        if skipped is not None:
            self.skipped += skipped

    def add_read(self, read: DocumentsRead) -> None:
        """Count documents read (:attr:`CorefItem.read`)."""
        self.documents += read.documents
        self.mentions += read.mentions
        self.skipped += read.skipped
        self.out_of_reach += read.out_of_reach

    def update(self, window: CorefWindow, rows: np.ndarray, missing: Sequence[bool] | None = None) -> None:
        """Score every head on one window.

        rows: [layers, heads, len(window.mentions), window words] word attention from each scored
            mention's head word (in ``window.mentions`` order) to every word of the window.
        missing: per scored mention, whether its head word had no tokens (then it is skipped).
        """
        if rows.shape[2:] != (len(window.mentions), window.end - window.start):
            raise BertologyError(
                f"Attention rows of shape {rows.shape} do not fit a window of {window.end - window.start} "
                f"words and {len(window.mentions)} mentions."
            )
        correct = self._grid(rows.shape[:2])
        self.windows += 1
        self.out_of_reach += window.out_of_reach
        for index, mention in enumerate(window.mentions):
            if missing is not None and missing[index]:
                self.skipped[mention.kind] += 1
                continue
            scores = rows[:, :, index, mention.candidates]  # [L, H, k]
            choice = scores.argmax(-1).astype(np.int32)
            correct[mention.kind] += mention.antecedents[choice]
            self.counts[mention.kind] += 1
            self.baselines[mention.kind] += mention.baselines
            self.answers.append(
                MentionAnswer(
                    window.document,
                    mention.span,
                    mention.text,
                    mention.kind,
                    mention.candidates + window.start,
                    mention.candidate_texts,
                    mention.antecedents,
                    choice,
                    mention.baselines,
                )
            )

    def merge(self, other: CorefAccumulator) -> CorefAccumulator:
        """Fold ``other``'s counts into this one and return ``self``."""
        if other.correct is not None:
            grid = self._grid(other.correct.shape[1:])
            grid += other.correct
        for name in ("counts", "baselines", "out_of_reach", "skipped"):
            getattr(self, name)[...] += getattr(other, name)
        self.documents += other.documents
        self.windows += other.windows
        self.mentions += other.mentions
        self.items += other.items
        self.answers += other.answers
        return self

    def result(self) -> CorefProbe:
        """The probe over everything seen so far.

        Raises:
            BertologyError: no mention has been scored yet.
        """
        if self.correct is None or self.counts.sum() == 0:
            raise BertologyError("The coreference probe has scored no mentions yet; update it first.")
        return CorefProbe(
            correct=self.correct.copy(),
            counts=self.counts.copy(),
            baselines=self.baselines.copy(),
            out_of_reach=self.out_of_reach.copy(),
            skipped=self.skipped.copy(),
            documents=self.documents,
            windows=self.windows,
            answers=list(self.answers),
        )
