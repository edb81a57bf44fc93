"""Which attention heads find a mention's antecedent (Clark et al. 2019, Section 4.3, Table 2).

**Mentions and antecedents.** In a :class:`~bertology.readers.coref.CorefDocument`, a mention ``c`` is a
*candidate* for a mention ``m`` when it ends before ``m`` starts (``c.end <= m.start``; so a mention
containing ``m`` is not one) and its head word is not ``m``'s head word. A candidate of ``m``'s entity
is an *antecedent*; ``m`` is *coreferent* (and scored) when it has an antecedent in the document.

**Head words.** The head word of a mention is the first word of its span whose syntactic head lies
outside the span (preferring words with a letter or digit), given document-level dependency heads
(:func:`with_heads` takes them from the treebank GUM's coreference is annotated on); without heads it is
the span's last word.

**Mention types** (:data:`TYPES`): ``"pronoun"``: a one-word span in :data:`PRONOUNS` (lowercased);
``"proper"``: the head word starts with an upper-case letter and is not its sentence's first word, or
every word of the span that has a letter starts with an upper-case letter (so a sentence-initial
one-word "Obama" is a name, and so, wrongly, is a sentence-initial "Dogs"); ``"other"``: the rest.

**Windows.** The model takes at most ``max_length`` tokens, so documents are read in windows of whole
sentences: for each sentence ``s`` with scored mentions, the window is the longest run of sentences
ending at ``s`` whose joined words fit the model (counted with the tokenizer, special tokens included);
every mention starting in ``s`` is scored in that window, and each window is captured once. Candidates
that start in a sentence before the window, or whose head word is outside it, are out of reach; a
mention whose antecedents are ALL out of reach is counted in ``out_of_reach`` and not scored. A
sentence that alone does not fit has its mentions counted in ``skipped``.

**Heads.** With ``W`` the word-level attention of the window (mean mode, :mod:`bertology.words`), head
``(layer, head)`` predicts for ``m`` the candidate head word ``argmax_c W[h(m), h(c)]`` over the distinct
head words of ``m``'s in-reach candidates (a tie goes to the earliest word); it is correct when that word
is the head word of one of ``m``'s antecedents.

**Baselines** (same mentions, same in-reach candidates; correct when the chosen candidate is of ``m``'s
entity): ``nearest``: the candidate starting last (of two starting together, the inner one);
``same_head``: the nearest candidate whose head word equals ``m``'s (lowercased), none = wrong; ``sieve``:
the nearest candidate with the same words as ``m`` (lowercased), else with the same head word, else, for
a pronoun ``m``, the nearest candidate that agrees in person, number and gender (:data:`PRONOUN_FEATURES`;
a non-pronoun candidate is 3rd person with unknown number and gender; unknown agrees with anything),
else the nearest candidate.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from bertology.batching import length_sorted_batches
from bertology.errors import BertologyError
from bertology.probes.rows import query_word_rows
from bertology.readers.coref import CorefDocument, Mention, with_sentences
from bertology.readers.treebank import Sentence
from bertology.stats.base import check_same_shape

if TYPE_CHECKING:
    import pandas as pd

    from bertology.models import LoadedModel

#: Mention types, in row order; ``ALL`` is the row over every type.
TYPES = ("pronoun", "proper", "other")
ALL = "all"
PRONOUN, PROPER, OTHER = range(3)
#: Baselines, in column order.
BASELINES = ("nearest", "same_head", "sieve")

#: English personal, possessive and reflexive pronouns: (person, number, gender); None = unknown.
PRONOUN_FEATURES: dict[str, tuple[int, str | None, str | None]] = {
    **dict.fromkeys(["i", "me", "my", "mine", "myself"], (1, "sg", None)),
    **dict.fromkeys(["we", "us", "our", "ours", "ourselves"], (1, "pl", None)),
    **dict.fromkeys(["you", "your", "yours"], (2, None, None)),
    "yourself": (2, "sg", None),
    "yourselves": (2, "pl", None),
    **dict.fromkeys(["he", "him", "his", "himself"], (3, "sg", "m")),
    **dict.fromkeys(["she", "her", "hers", "herself"], (3, "sg", "f")),
    **dict.fromkeys(["it", "its", "itself"], (3, "sg", "n")),
    **dict.fromkeys(["they", "them", "their", "theirs", "themselves", "themself"], (3, "pl", None)),
}
PRONOUNS = frozenset(PRONOUN_FEATURES)
_NON_PRONOUN = (3, None, None)


# --- Mentions: head words, types, baselines -------------------------------------------------------


def document_heads(sentences: Sequence[Sentence]) -> list[int]:
    """Document-level heads of consecutive sentences: each word's head as an index into the document's
    words, -1 for a root."""
    heads: list[int] = []
    for sentence in sentences:
        offset = len(heads)
        heads.extend(offset + head if head >= 0 else -1 for head in sentence.heads)
    return heads


def with_heads(
    documents: Iterable[CorefDocument], sentences: Iterable[Sentence]
) -> Iterator[tuple[CorefDocument, list[int]]]:
    """:func:`~bertology.readers.coref.with_sentences`, each document paired with its document-level
    dependency heads (:func:`document_heads`). For GUM: ``with_heads(read_coref(coref_conll),
    read_treebank(dep_stanford))``. Streams: one document's sentences are held at a time."""
    consumed: list[Sentence] = []

    def recorded() -> Iterator[Sentence]:
        for sentence in sentences:
            consumed.append(sentence)
            yield sentence

    for document in with_sentences(documents, recorded()):
        heads = document_heads(consumed)
        consumed.clear()
        yield document, heads


def head_word(mention: Mention, heads: Sequence[int] | None, words: Sequence[str]) -> int:
    """The document index of the mention's head word (see the module docstring)."""
    if heads is None:
        return mention.end - 1
    inside = range(mention.start, mention.end)
    outside = [i for i in inside if not mention.start <= heads[i] < mention.end]
    wordy = [i for i in outside if any(ch.isalnum() for ch in words[i])]
    if wordy:
        return wordy[0]
    return outside[0] if outside else mention.end - 1


def mention_type(mention: Mention, head: int, document: CorefDocument) -> int:
    """The mention's type, an index into :data:`TYPES` (rule: see the module docstring)."""
    words = document.words[mention.start : mention.end]
    if len(words) == 1 and words[0].lower() in PRONOUNS:
        return PRONOUN
    head_form = document.words[head]
    sentence_initial = head == document.sentence_starts[mention.sentence]
    if head_form[:1].isupper() and not sentence_initial:
        return PROPER
    lettered = [word for word in words if any(ch.isalpha() for ch in word)]
    if lettered and all(word[:1].isupper() for word in lettered):
        return PROPER
    return OTHER


def _agrees(pronoun: str, candidate: tuple[int, str | None, str | None]) -> bool:
    return all(
        a is None or b is None or a == b for a, b in zip(PRONOUN_FEATURES[pronoun], candidate, strict=True)
    )


@dataclass(frozen=True)
class _Info:
    """What the baselines need of one mention."""

    mention: Mention
    head: int
    kind: int
    text: str  # lowercased words
    head_form: str  # lowercased head word

    @property
    def features(self) -> tuple[int, str | None, str | None]:
        return PRONOUN_FEATURES[self.text] if self.kind == PRONOUN else _NON_PRONOUN


def _baselines(target: _Info, candidates: Sequence[_Info]) -> tuple[bool, bool, bool]:
    """Whether nearest, same head and sieve pick a candidate of the target's entity; ``candidates`` in
    document order (the nearest last)."""
    entity = target.mention.entity

    def nearest(keep: Callable[[_Info], bool]) -> _Info | None:
        return next((c for c in reversed(candidates) if keep(c)), None)

    nearest_any = candidates[-1]
    same_head = nearest(lambda c: c.head_form == target.head_form)
    sieve = nearest(lambda c: c.text == target.text) or same_head
    if sieve is None and target.kind == PRONOUN:
        sieve = nearest(lambda c: _agrees(target.text, c.features))
    sieve = sieve or nearest_any
    return (
        nearest_any.mention.entity == entity,
        same_head is not None and same_head.mention.entity == entity,
        sieve.mention.entity == entity,
    )


# --- Windows --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoredMention:
    """One mention to score in a window; word indices are 0-based within the window.

    head: the mention's head word. kind: its type (index into :data:`TYPES`).
    candidates: [k] sorted distinct head words of its in-reach candidates.
    antecedents: [k] bool, whether each candidate word is the head word of an antecedent.
    baselines: whether nearest, same head and sieve (:data:`BASELINES`) are right.
    """

    head: int
    kind: int
    candidates: np.ndarray
    antecedents: np.ndarray
    baselines: tuple[bool, bool, bool]


@dataclass(frozen=True)
class CorefWindow:
    """Sentences ``first_sentence .. last_sentence`` of a document, the words ``[start, end)``.

    mentions: the scored mentions of the last sentence. out_of_reach: [types] int, its coreferent
    mentions whose antecedents all lie before the window. tokens: the window's token count (special
    tokens included), as counted to fit it.
    """

    document: str
    first_sentence: int
    last_sentence: int
    start: int
    end: int
    mentions: list[ScoredMention]
    out_of_reach: np.ndarray
    tokens: int

    def words(self, document: CorefDocument) -> list[str]:
        return document.words[self.start : self.end]


@dataclass
class DocumentWindows:
    """The windows of one document, and its mentions in sentences too long to fit alone."""

    windows: list[CorefWindow]
    skipped: np.ndarray  # [types] int


def _first_fitting(
    last: int,
    count_tokens: Callable[[int, int], int],
    max_length: int,
    estimate: Callable[[int, int], int] | None = None,
) -> int:
    """The first sentence of the longest window ending at sentence ``last`` that fits ``max_length`` tokens
    (``last`` alone fits). Adding a sentence never removes tokens, so a binary search finds it with few
    token counts; with an ``estimate`` of the counts (cheap: sums of per-sentence counts), the search runs
    on it and two exact counts confirm the answer (it fits, one more sentence does not), falling back to
    the exact search where they do not."""

    def search(count: Callable[[int, int], int]) -> int:
        low, high = 0, last
        while low < high:
            middle = (low + high) // 2
            if count(middle, last) <= max_length:
                high = middle
            else:
                low = middle + 1
        return low

    if estimate is not None:
        guess = search(estimate)
        fits = count_tokens(guess, last) <= max_length
        if fits and (guess == 0 or count_tokens(guess - 1, last) > max_length):
            return guess
    return search(count_tokens)


def coref_windows(
    document: CorefDocument,
    heads: Sequence[int] | None,
    count_tokens: Callable[[int, int], int],
    max_length: int,
    estimate: Callable[[int, int], int] | None = None,
) -> DocumentWindows:
    """The windows of a document (see the module docstring).

    heads: document-level dependency heads (-1 root), or None (head word = last word).
    count_tokens: ``(first_sentence, last_sentence) -> tokens`` of those sentences' words joined by
        spaces, special tokens included. max_length: the most tokens a window may have.
    estimate: a cheap guess of ``count_tokens`` that speeds up the search (the windows do not depend on it).
    """
    if heads is not None and len(heads) != len(document.words):
        raise BertologyError(
            f"Document {document.name} has {len(document.words)} words but {len(heads)} heads."
        )
    starts = [*document.sentence_starts, len(document.words)]
    infos = []
    for mention in document.mentions:
        head = head_word(mention, heads, document.words)
        words = document.words[mention.start : mention.end]
        infos.append(
            _Info(
                mention,
                head,
                mention_type(mention, head, document),
                " ".join(words).lower(),
                document.words[head].lower(),
            )
        )
    by_sentence: dict[int, list[tuple[_Info, list[_Info]]]] = {}
    for info in infos:
        m = info.mention
        candidates = [c for c in infos if c.mention.end <= m.start and c.head != info.head]
        if any(c.mention.entity == m.entity for c in candidates):
            by_sentence.setdefault(m.sentence, []).append((info, candidates))
    windows = []
    skipped = np.zeros(len(TYPES), dtype=np.int64)
    for sentence, targets in sorted(by_sentence.items()):
        if count_tokens(sentence, sentence) > max_length:
            for info, _ in targets:
                skipped[info.kind] += 1
            continue
        first = _first_fitting(sentence, count_tokens, max_length, estimate)
        start, end = starts[first], starts[sentence + 1]
        scored, out = [], np.zeros(len(TYPES), dtype=np.int64)
        for info, candidates in targets:
            reach = [c for c in candidates if c.mention.sentence >= first and start <= c.head < end]
            gold = {c.head for c in reach if c.mention.entity == info.mention.entity}
            if not gold:
                out[info.kind] += 1
                continue
            words = np.array(sorted({c.head for c in reach}), dtype=np.int64)
            scored.append(
                ScoredMention(
                    head=info.head - start,
                    kind=info.kind,
                    candidates=words - start,
                    antecedents=np.isin(words, list(gold)),
                    baselines=_baselines(info, reach),
                )
            )
        tokens = count_tokens(first, sentence)
        windows.append(CorefWindow(document.name, first, sentence, start, end, scored, out, tokens))
    return DocumentWindows(windows, skipped)


# --- Results --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestCorefHead:
    """The most accurate head: (layer, head) 0-based, and its accuracy."""

    layer: int
    head: int
    accuracy: float

    @property
    def label(self) -> str:
        """``"layer-head"``, 0-based."""
        return f"{self.layer}-{self.head}"


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
    head word has no tokens. documents, windows: how many were read and captured.

    Every method taking ``kind`` takes a type name or ``ALL`` ("all", the default).
    """

    correct: np.ndarray
    counts: np.ndarray
    baselines: np.ndarray
    out_of_reach: np.ndarray
    skipped: np.ndarray
    documents: int
    windows: int

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

    def best(self, kind: str = ALL) -> BestCorefHead:
        """The most accurate head (ties: the first in layer, head order); accuracy NaN without mentions."""
        grid = self.heatmap(kind)
        if np.isnan(grid).all():
            return BestCorefHead(0, 0, float("nan"))
        layer, head = np.unravel_index(np.nanargmax(grid), grid.shape)
        return BestCorefHead(int(layer), int(head), float(grid[layer, head]))

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
                    "accuracy": best.accuracy,
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
    """Streams windows and their attention rows into a :class:`CorefProbe`; mergeable."""

    def __init__(self) -> None:
        self._shape: tuple[int, int] | None = None
        self.correct: np.ndarray | None = None
        self.counts = np.zeros(len(TYPES), dtype=np.int64)
        self.baselines = np.zeros((len(TYPES), len(BASELINES)), dtype=np.int64)
        self.out_of_reach = np.zeros(len(TYPES), dtype=np.int64)
        self.skipped = np.zeros(len(TYPES), dtype=np.int64)
        self.documents = 0
        self.windows = 0
        #: Mentions in the documents read (scored or not).
        self.mentions = 0
        #: Items of a run's batches added (:func:`coref_batches`; the count a distributed run's progress
        #: and checkpoints go by).
        self.segments = 0

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
            correct[mention.kind] += mention.antecedents[scores.argmax(-1)]
            self.counts[mention.kind] += 1
            self.baselines[mention.kind] += mention.baselines

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
        self.segments += other.segments
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
        )


# --- Orchestration --------------------------------------------------------------------------------


class NoMentionScored(BertologyError):
    """:func:`probe_coreference` read its documents but could score no mention.

    documents: documents read; mentions: mentions in them; skipped: mentions in a sentence longer than
    the model takes; out_of_reach: mentions whose every antecedent lies before their window.
    """

    def __init__(self, documents: int, mentions: int, skipped: int, out_of_reach: int) -> None:
        self.documents, self.mentions = documents, mentions
        self.skipped, self.out_of_reach = skipped, out_of_reach
        if mentions == 0:
            message = f"The {documents} documents read have no coreference mentions."
        elif skipped + out_of_reach == 0:
            message = (
                f"None of the {mentions} mentions in {documents} documents has an antecedent (each entity is "
                "mentioned once), so there is nothing to score."
            )
        else:
            message = (
                f"No coreferent mention could be scored in {documents} documents: {skipped} mentions are in "
                f"sentences longer than the model takes and {out_of_reach} have every antecedent out of "
                "reach, and the others have no antecedent."
            )
        super().__init__(message)


def _token_counter(
    document: CorefDocument, model: LoadedModel
) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
    """``(count, estimate)`` for :func:`coref_windows`: the exact token count of a run of the document's
    sentences (its words joined by spaces, tokenized, cached), and the sum of its sentences' own counts
    plus the special tokens (exact for tokenizers that split at spaces, such as WordPiece)."""
    starts = [*document.sentence_starts, len(document.words)]
    cache: dict[tuple[int, int], int] = {}

    def text(first: int, last: int) -> str:
        return " ".join(document.words[starts[first] : starts[last + 1]])

    def count(first: int, last: int) -> int:
        if (first, last) not in cache:
            cache[first, last] = len(model.tokenizer(text(first, last), verbose=False)["input_ids"])
        return cache[first, last]

    sentences = [text(index, index) for index in range(len(starts) - 1)]
    encoded = model.tokenizer(sentences, add_special_tokens=False, verbose=False) if sentences else None
    lengths = [] if encoded is None else [len(ids) for ids in encoded["input_ids"]]
    before = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    special = model.tokenizer.num_special_tokens_to_add(pair=False)

    def estimate(first: int, last: int) -> int:
        return int(before[last + 1] - before[first]) + special

    return count, estimate


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
class CorefItem:
    """One item of a coreference run's batches (:func:`coref_batches`).

    window: a window with scored mentions, or ``None`` for the run's last item when only counts remain.
    words: the window's words. read: the documents read since the previous item, counted with this one
    (so each is counted once, whichever batch or worker the item lands in).
    """

    window: CorefWindow | None
    words: list[str]
    read: DocumentsRead

    @property
    def tokens(self) -> int:
        """The window's token count (0 without one)."""
        return 0 if self.window is None else self.window.tokens


def _window_limit(model: LoadedModel, max_length: int | None) -> int:
    """Tokens per window: ``max_length``, at most the model's own (its own without one)."""
    return model.max_length if max_length is None else min(max_length, model.max_length)


def _coref_items(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    model: LoadedModel,
    limit: int,
) -> Iterator[CorefItem]:
    read = DocumentsRead()
    for item in documents:
        document, heads = item if isinstance(item, tuple) else (item, None)
        count, estimate = _token_counter(document, model)
        built = coref_windows(document, heads, count, limit, estimate)
        read.documents += 1
        read.mentions += len(document.mentions)
        read.skipped += built.skipped
        for window in built.windows:
            if window.mentions:
                yield CorefItem(window, window.words(document), read)
                read = DocumentsRead()
            else:
                read.out_of_reach += window.out_of_reach
    if not read.empty:
        yield CorefItem(None, [], read)


def coref_batches(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    model: LoadedModel,
    *,
    limit_documents: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
) -> Iterator[list[CorefItem]]:
    """The batches of windows a coreference probe of ``documents`` captures, in order: the windows with
    scored mentions of consecutive documents, sorted by token count
    (:func:`~bertology.batching.length_sorted_batches`), each carrying the counts of the documents read
    before it. Arguments as in :func:`probe_coreference`; only one sort window of documents is held."""
    items = _coref_items(islice(documents, limit_documents), model, _window_limit(model, max_length))
    return length_sorted_batches(items, lambda item: item.tokens, batch_size=batch_size)


def score_coref_batch(
    accumulator: CorefAccumulator,
    batch: list[CorefItem],
    model: LoadedModel,
    *,
    max_length: int | None = None,
) -> None:
    """Capture one batch of :func:`coref_batches` (one forward pass) and score its windows into
    ``accumulator``; only the scored mentions' rows are kept (:func:`~bertology.probes.rows.query_word_rows`).
    max_length: as given to :func:`coref_batches`."""
    for item in batch:
        accumulator.add_read(item.read)
    accumulator.segments += len(batch)
    windows = [(item.window, item.words) for item in batch if item.window is not None]
    if not windows:
        return
    queries = [[mention.head for mention in window.mentions] for window, _ in windows]
    captured = query_word_rows(
        [words for _, words in windows], queries, model, max_length=_window_limit(model, max_length)
    )
    for (window, _), heads, rows in zip(windows, queries, captured, strict=True):
        accumulator.update(window, rows.rows, rows.tokens[heads] == 0)


def score_coref_batches(
    batches: Iterable[list[CorefItem]], model: LoadedModel, *, max_length: int | None = None
) -> CorefAccumulator:
    """A fresh accumulator with ``batches`` (of :func:`coref_batches`) scored into it, in this process."""
    accumulator = CorefAccumulator()
    for batch in batches:
        score_coref_batch(accumulator, batch, model, max_length=max_length)
    return accumulator


def check_scored(accumulator: CorefAccumulator) -> CorefProbe:
    """The probe of a run's accumulator.

    Raises:
        NoMentionScored: no mention could be scored (with the counts of why).
    """
    if accumulator.counts.sum() == 0:
        skipped, out_of_reach = int(accumulator.skipped.sum()), int(accumulator.out_of_reach.sum())
        raise NoMentionScored(accumulator.documents, accumulator.mentions, skipped, out_of_reach)
    return accumulator.result()


def probe_coreference(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    model: LoadedModel,
    *,
    limit_documents: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
) -> CorefProbe:
    """Score every head of ``model`` on the coreferent mentions of ``documents``.

    documents: documents, or ``(document, heads)`` pairs with document-level dependency heads (see
        :func:`with_heads`); without heads a mention's head word is its last word.
    batch_size: windows per forward pass (:func:`coref_batches`); memory does not grow with the corpus.
    max_length: token limit per window (default and upper bound: the model's own).

    Raises:
        NoMentionScored: no mention could be scored (with the counts of why).
    """
    batches = coref_batches(
        documents, model, limit_documents=limit_documents, batch_size=batch_size, max_length=max_length
    )
    return check_scored(score_coref_batches(batches, model, max_length=max_length))
