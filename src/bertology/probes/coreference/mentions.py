"""Mentions of a coreference document: head words, types and the baselines' choices (rules: the
package docstring, :mod:`bertology.probes.coreference`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from bertology.corpus.readers.coref import with_sentences
from bertology.corpus.readers.coref_documents import CorefDocument, Mention
from bertology.corpus.readers.treebank import Sentence

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
    """:func:`~bertology.corpus.readers.coref.with_sentences`, each document paired with its document-level
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
class MentionInfo:
    """What the baselines need of one mention."""

    mention: Mention
    head: int
    kind: int
    text: str  # lowercased words
    head_form: str  # lowercased head word

    @property
    def features(self) -> tuple[int, str | None, str | None]:
        return PRONOUN_FEATURES[self.text] if self.kind == PRONOUN else _NON_PRONOUN


def baselines_right(target: MentionInfo, candidates: Sequence[MentionInfo]) -> tuple[bool, bool, bool]:
    """Whether nearest, same head and sieve pick a candidate of the target's entity; ``candidates`` in
    document order (the nearest last)."""
    entity = target.mention.entity

    def nearest(keep: Callable[[MentionInfo], bool]) -> MentionInfo | None:
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
