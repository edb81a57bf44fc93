"""GAP pronoun resolution by single heads (Webster et al. 2018; the probe of Clark et al. 2019, 4.3).

An example is scored when exactly one of its names A and B is coreferent with the pronoun. Its Text is
split into words at whitespace; the pronoun is the word covering ``pronoun_offset``, and a name is every
word overlapping its character span (the pronoun's word left out). With ``W`` the word-level attention of
the Text (mean mode, :mod:`bertology.words`), head ``(layer, head)`` is correct on the example when
``sum_{w in correct name} W[p, w] > sum_{w in other name} W[p, w]`` (a tie is wrong). Examples cut to fit
the model are skipped and counted.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from bertology.capture import capture_batch
from bertology.errors import BertologyError, TruncationWarning
from bertology.probes.coreference import BestCorefHead, query_rows
from bertology.readers.gap import GapExample
from bertology.stats.base import check_same_shape

if TYPE_CHECKING:
    from bertology.models import LoadedModel

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class GapWords:
    """One scorable example as words: the pronoun's word, and the words of the right and wrong names."""

    words: list[str]
    pronoun: int
    correct: list[int]
    wrong: list[int]


def gap_words(example: GapExample) -> GapWords | None:
    """The example's words (see the module docstring), or None unless exactly one name is coreferent."""
    if example.a_coref == example.b_coref:
        return None
    spans = [match.span() for match in _WORD.finditer(example.text)]

    def covering(start: int, length: int) -> list[int]:
        end = start + max(length, 1)
        return [index for index, (s, e) in enumerate(spans) if s < end and start < e]

    pronoun = covering(example.pronoun_offset, len(example.pronoun))[0]
    a = [w for w in covering(example.a_offset, len(example.a)) if w != pronoun]
    b = [w for w in covering(example.b_offset, len(example.b)) if w != pronoun]
    words = [example.text[s:e] for s, e in spans]
    return GapWords(words, pronoun, *((a, b) if example.a_coref else (b, a)))


@dataclass
class GapProbe:
    """correct: [layers, heads] int64 examples each head gets right; count: examples scored;
    skipped: examples cut to fit the model; not_scored: examples with neither or both names coreferent."""

    correct: np.ndarray
    count: int
    skipped: int
    not_scored: int

    def heatmap(self) -> np.ndarray:
        """[layers, heads] float64 fraction of examples each head gets right."""
        return self.correct / self.count

    def best(self) -> BestCorefHead:
        grid = self.heatmap()
        layer, head = np.unravel_index(grid.argmax(), grid.shape)
        return BestCorefHead(int(layer), int(head), float(grid[layer, head]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "skipped": self.skipped,
            "not_scored": self.not_scored,
            "correct": self.correct.tolist(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class GapAccumulator:
    """Streams examples and their pronoun rows into a :class:`GapProbe`; mergeable."""

    def __init__(self) -> None:
        self.correct: np.ndarray | None = None
        self.count = self.skipped = self.not_scored = 0

    def update(self, words: GapWords, row: np.ndarray) -> None:
        """row: [layers, heads, n_words] word attention from the pronoun to every word of the Text."""
        check_same_shape(None if self.correct is None else self.correct.shape, row.shape[:2], "GAP probe")
        if self.correct is None:
            self.correct = np.zeros(row.shape[:2], dtype=np.int64)
        self.correct += row[..., words.correct].sum(-1) > row[..., words.wrong].sum(-1)
        self.count += 1

    def merge(self, other: GapAccumulator) -> GapAccumulator:
        if other.correct is not None:
            if self.correct is None:
                self.correct = np.zeros_like(other.correct)
            check_same_shape(self.correct.shape, other.correct.shape, "GAP probe")
            self.correct += other.correct
        self.count += other.count
        self.skipped += other.skipped
        self.not_scored += other.not_scored
        return self

    def result(self) -> GapProbe:
        if self.correct is None or self.count == 0:
            raise BertologyError("The GAP probe has scored no examples yet; update it first.")
        return GapProbe(self.correct.copy(), self.count, self.skipped, self.not_scored)


def probe_gap(
    examples: Iterable[GapExample], model: LoadedModel, *, limit: int | None = None, batch_size: int = 16
) -> GapProbe:
    """Score every head of ``model`` on GAP ``examples`` (at most ``limit``), ``batch_size`` per pass.

    Raises:
        BertologyError: no example could be scored (saying how many had neither or both names
            coreferent, and how many were too long).
    """
    accumulator = GapAccumulator()
    pending: list[GapWords] = []

    def flush() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncationWarning)
            captured = capture_batch([item.words for item in pending], model=model)
        for item, attention in zip(pending, captured, strict=True):
            if attention.truncated:
                accumulator.skipped += 1
            else:
                accumulator.update(item, query_rows(attention, [item.pronoun])[:, :, 0])
        pending.clear()

    for example in islice(examples, limit):
        item = gap_words(example)
        if item is None:
            accumulator.not_scored += 1
            continue
        pending.append(item)
        if len(pending) == batch_size:
            flush()
    if pending:
        flush()
    if accumulator.count == 0:
        raise BertologyError(
            f"None of the {accumulator.not_scored + accumulator.skipped} GAP examples read could be scored: "
            f"{accumulator.not_scored} have neither or both names coreferent with the pronoun and "
            f"{accumulator.skipped} are longer than the model takes."
        )
    return accumulator.result()
