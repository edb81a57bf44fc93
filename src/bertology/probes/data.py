"""Stream treebank sentences through a model as word-level attention, a batch at a time.

Each sentence's words are given to the model as a pre-split word list, so the word attention has one
unit per treebank word (plus the special tokens). A sentence the probes cannot score is skipped and
counted, not warned about: one cut to fit the model's token limit, or one with a word the tokenizer
drops entirely (e.g. a lone control character), since neither has attention for all of its words.

Sentences are batched by length within windows (:func:`~bertology.batching.length_sorted_batches`, the
helper corpus analysis uses; length = characters of the words plus one per word, a close proxy for
tokens), padded to a multiple of :data:`~bertology.batching.PAD_MULTIPLE` tokens, so batches pad little
and memory holds one window of sentences; they come out in that order, not in the treebank's.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bertology.batching import PAD_MULTIPLE, length_sorted_batches
from bertology.capture import capture_batch
from bertology.errors import TruncationWarning
from bertology.models import LoadedModel
from bertology.readers.treebank import Sentence
from bertology.words import WordAttention, WordMode, word_attention


@dataclass
class SkippedSentences:
    """Sentences left out of a stream.

    truncated: longer than the model's token limit (or ``max_length``).
    untokenized: with a word that gives no token at all.
    """

    truncated: int = 0
    untokenized: int = 0

    @property
    def total(self) -> int:
        return self.truncated + self.untokenized


class WordAttentionStream(Iterator[tuple[Sentence, WordAttention]]):
    """An iterator of ``(sentence, word attention)`` that counts the sentences it skips.

    seen: sentences read so far. skipped: :class:`SkippedSentences` so far (final once exhausted).
    """

    def __init__(
        self,
        sentences: Iterable[Sentence],
        model: LoadedModel,
        *,
        mode: WordMode,
        batch_size: int,
        max_length: int | None,
    ) -> None:
        self.seen = 0
        self.skipped = SkippedSentences()
        self._pairs = self._generate(iter(sentences), model, mode, batch_size, max_length)

    def __next__(self) -> tuple[Sentence, WordAttention]:
        return next(self._pairs)

    def _generate(
        self,
        sentences: Iterator[Sentence],
        model: LoadedModel,
        mode: WordMode,
        batch_size: int,
        max_length: int | None,
    ) -> Iterator[tuple[Sentence, WordAttention]]:
        for batch in length_sorted_batches(sentences, sentence_length, batch_size=batch_size):
            self.seen += len(batch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # counted in ``skipped`` instead
                captured = capture_batch(
                    [s.words for s in batch],
                    model=model,
                    max_length=max_length,
                    pad_to_multiple_of=PAD_MULTIPLE,
                )
            for sentence, attention in zip(batch, captured, strict=True):
                if attention.truncated:
                    self.skipped.truncated += 1
                    continue
                words = word_attention(attention, mode)
                if not words.covers_all_words:
                    self.skipped.untokenized += 1
                    continue
                yield sentence, words


def sentence_length(sentence: Sentence) -> int:
    """The batching length of a sentence: its characters plus one per word (a proxy for its tokens)."""
    return sum(len(word) for word in sentence.words) + len(sentence.words)


def iter_word_attention(
    sentences: Iterable[Sentence],
    model: LoadedModel,
    *,
    mode: WordMode = "mean",
    batch_size: int = 16,
    max_length: int | None = None,
) -> WordAttentionStream:
    """Each sentence with its :class:`~bertology.words.WordAttention`, skipped ones left out, in the
    batching order of the module docstring.

    Sentences run through ``model`` ``batch_size`` at a time (one forward pass per batch).
    mode: how a split word's rows are combined (see :mod:`bertology.words`).
    max_length: token limit per sentence (default and upper bound: the model's own limit).
    The returned stream's ``skipped`` counts the sentences left out (see the module docstring).
    """
    return WordAttentionStream(sentences, model, mode=mode, batch_size=batch_size, max_length=max_length)
