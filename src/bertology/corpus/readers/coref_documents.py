"""Coreference documents, as both coreference readers give them: :mod:`bertology.corpus.readers.coref`
(GUM's and CoNLL-2012's columns) and :mod:`bertology.corpus.readers.corefud` (CorefUD)."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True)
class Mention:
    """A mention: the words ``[start, end)`` of its document, referring to entity ``entity``.

    sentence: index of the sentence the mention starts in.
    """

    start: int
    end: int
    entity: str
    sentence: int


@dataclass(frozen=True)
class CorefDocument:
    """One document with its gold coreference.

    name: the document's name from its header.
    words: the tokens of the whole document.
    sentence_starts: the index in ``words`` of each sentence's first word.
    mentions: every mention, sorted by ``(start, -end, entity)`` (outer mentions before inner ones).
    origin: ``"<file name>:<line of the document header>"``.
    """

    name: str
    words: list[str]
    sentence_starts: list[int]
    mentions: list[Mention]
    origin: str


def finished_document(
    name: str, words: list[str], sentence_starts: list[int], spans: list[tuple[int, int, str]], origin: str
) -> CorefDocument:
    """The document of ``words`` with a mention for each ``(start, end, entity)`` of ``spans``, each given
    the sentence it starts in, sorted as :attr:`CorefDocument.mentions` says."""
    mentions = [
        Mention(start, end, entity, bisect_right(sentence_starts, start) - 1) for start, end, entity in spans
    ]
    mentions.sort(key=lambda mention: (mention.start, -mention.end, mention.entity))
    return CorefDocument(name, words, sentence_starts, mentions, origin)
