"""Windows of whole sentences that fit the model, with the mentions scored in each (rules: the package
docstring, :mod:`bertology.probes.coreference`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from bertology.corpus.readers.coref_documents import CorefDocument
from bertology.errors import BertologyError
from bertology.probes.coreference.mentions import TYPES, MentionInfo, baselines_right, head_word, mention_type


@dataclass(frozen=True)
class ScoredMention:
    """One mention to score in a window; word indices are 0-based within the window.

    head: the mention's head word. kind: its type (index into :data:`TYPES`).
    candidates: [k] sorted distinct head words of its in-reach candidates.
    antecedents: [k] bool, whether each candidate word is the head word of an antecedent.
    baselines: whether nearest, same head and sieve (:data:`BASELINES`) are right.
    span: the mention's words ``[start, end)`` in its document; text: those words.
    candidate_texts: [k] the words of the nearest candidate with each head word.
    """

    head: int
    kind: int
    candidates: np.ndarray
    antecedents: np.ndarray
    baselines: tuple[bool, bool, bool]
    span: tuple[int, int] = (0, 0)
    text: str = ""
    candidate_texts: tuple[str, ...] = ()


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
            MentionInfo(
                mention,
                head,
                mention_type(mention, head, document),
                " ".join(words).lower(),
                document.words[head].lower(),
            )
        )
    by_sentence: dict[int, list[tuple[MentionInfo, list[MentionInfo]]]] = {}
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
            nearest = {c.head: c.mention for c in reach}  # in document order: the last one wins
            scored.append(
                ScoredMention(
                    head=info.head - start,
                    kind=info.kind,
                    candidates=words - start,
                    antecedents=np.isin(words, list(gold)),
                    baselines=baselines_right(info, reach),
                    span=(info.mention.start, info.mention.end),
                    text=" ".join(document.words[info.mention.start : info.mention.end]),
                    candidate_texts=tuple(
                        " ".join(document.words[nearest[word].start : nearest[word].end]) for word in words
                    ),
                )
            )
        tokens = count_tokens(first, sentence)
        windows.append(CorefWindow(document.name, first, sentence, start, end, scored, out, tokens))
    return DocumentWindows(windows, skipped)
