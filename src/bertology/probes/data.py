"""Stream treebank sentences through a model as word-level attention, a batch at a time.

Each sentence's words are given to the model as a pre-split word list, so the word attention has one
unit per treebank word (plus the special tokens). A sentence the probes cannot score is skipped and
counted, not warned about: one cut to fit the model's token limit, or one with a word the tokenizer
drops entirely (e.g. a lone control character), since neither has attention for all of its words.

Sentences are batched by their token counts within windows
(:func:`~bertology.corpus.batching.length_sorted_batches`, the helper corpus analysis uses), each batch padded
to its longest sentence only, so batches pad little (3.8% more tokens than the sentences have on GUM, against
42% for a character-count order padded to a multiple of 8) and memory holds one window of sentences; they come
out in that order, not in the treebank's.

:func:`predict_heads` is the dependency probe's lean path: the word attention of each layer is computed
for the whole batch while the model runs (:class:`~bertology.attention.words.UnitMaps`) and only each head's
predicted head words are kept (plus the word attention of the few sentences kept as examples).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.attention.capturing import capture_batch, encode_for_model, stream_batch
from bertology.attention.words import (
    UnitMaps,
    Units,
    WordAttention,
    WordMode,
    check_word_mode,
    padded_units,
    word_attention,
)
from bertology.corpus.batching import length_sorted_batches
from bertology.corpus.encoding import EncodedBatch
from bertology.corpus.readers.treebank import Sentence
from bertology.corpus.segments import counting_tokenizer
from bertology.errors import TruncationWarning
from bertology.models.loading import LoadedModel
from bertology.probes.dependency import predictions


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

    def counts(self, truncated: int, word_positions: np.ndarray) -> bool:
        """Count a captured sentence if it is to be left out (``truncated`` tokens cut, or a word without
        tokens: a -1 in ``word_positions``); True when it is."""
        if truncated:
            self.truncated += 1
        elif (word_positions < 0).any():
            self.untokenized += 1
        else:
            return False
        return True


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
        count = token_counter(model)
        for batch in length_sorted_batches(sentences, lambda s: count(s.words), batch_size=batch_size):
            self.seen += len(batch)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # counted in ``skipped`` instead
                captured = capture_batch([s.words for s in batch], model=model, max_length=max_length)
            for sentence, attention in zip(batch, captured, strict=True):
                words = word_attention(attention, mode)
                if not self.skipped.counts(attention.truncated, words.word_positions):
                    yield sentence, words


def token_counter(model: LoadedModel) -> Callable[[Sequence[str]], int]:
    """``words -> tokens``: how many tokens ``model``'s tokenizer gives a pre-split word list, special
    tokens included, untruncated (the batching length of a sentence). Counted by a copy of the model's Rust
    tokenizer, so a reader thread may count while the model's own tokenizer encodes
    (:func:`~bertology.corpus.batching.prefetched`)."""
    counter = counting_tokenizer(model.tokenizer)
    return lambda words: len(counter.encode(list(words), is_pretokenized=True, add_special_tokens=True).ids)


@dataclass(frozen=True)
class PredictedHeads:
    """What a dependency probe keeps of one sentence.

    predicted: [2, layers, heads, n_words] int64 the head word each head predicts for each word in both
        directions (:func:`~bertology.probes.dependency.predictions`).
    words: the sentence's word attention where it was asked for (examples), else ``None``.
    """

    sentence: Sentence
    predicted: np.ndarray
    words: WordAttention | None


class _HeadPredictor:
    """Receives a batch's layers; keeps each head's predicted head words and the examples' word attention."""

    def __init__(self, mode: WordMode, keep: Sequence[bool], device: torch.device) -> None:
        self.mode, self.device = mode, device
        self.kept_rows = torch.tensor([row for row, kept in enumerate(keep) if kept], dtype=torch.int64)

    def __call__(self, encoded: EncodedBatch) -> Callable[[torch.Tensor], None]:
        """Prepare the batch's maps from tokens to words (and to units, for the examples)."""
        width = int(encoded.model_inputs["input_ids"].shape[1])
        word_ids = [np.asarray(ids) for ids in encoded.word_ids]
        self.units = [Units.of(ids) for ids in word_ids]
        unit, most = padded_units(self.units, width)
        self.positions = [
            units.word_positions(ids, len(words))
            for units, ids, words in zip(self.units, word_ids, encoded.words, strict=True)
        ]
        select = np.zeros((len(word_ids), max(len(words) for words in encoded.words)), dtype=np.int64)
        for row, positions in enumerate(self.positions):
            select[row, : len(positions)] = np.maximum(positions, 0)
        # float32 products: each word's row and column sums differ from float64 ones by rounding only
        self.between = UnitMaps(
            unit, most, self.mode, select=torch.from_numpy(select), dtype=torch.float32, device=self.device
        )
        kept = unit[self.kept_rows]
        self.examples = UnitMaps(kept, most, self.mode, device=self.device) if len(kept) else None
        self.lengths = torch.tensor([len(words) for words in encoded.words])
        self.layers: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []
        return self.add

    def add(self, probs: torch.Tensor) -> None:
        """One layer's probs [batch, heads, n, n]: each head's predictions, the examples' word attention."""
        self.layers.append(predictions(self.between(probs), self.lengths))  # [2, batch, heads, w]
        if self.examples is not None:
            self.kept.append(self.examples(probs[self.kept_rows.to(probs.device)]).float().cpu())


def predict_heads(
    sentences: Sequence[Sentence],
    model: LoadedModel,
    *,
    mode: WordMode = "mean",
    keep: Sequence[bool] | None = None,
    max_length: int | None = None,
) -> tuple[list[PredictedHeads], SkippedSentences]:
    """One forward pass over ``sentences`` (padded to the longest): each sentence's predicted head words
    from every head, the sentences left out counted as in :class:`WordAttentionStream`.

    keep: per sentence, whether to keep its word attention too (the report's examples).
    mode, max_length: as :func:`iter_word_attention`.
    """
    check_word_mode(mode)
    predictor = _HeadPredictor(mode, [False] * len(sentences) if keep is None else keep, model.device)
    texts = [sentence.words for sentence in sentences]  # cuts are counted in ``skipped``: no warnings
    encoded = encode_for_model(model, texts, max_length=max_length, warn=False)
    stream_batch(encoded, predictor, model=model)
    predicted = torch.stack(predictor.layers, dim=2).cpu().numpy()  # [2, batch, layers, heads, w]
    examples = torch.stack(predictor.kept, dim=1).numpy() if predictor.kept else None  # [kept, layers, ...]
    example_of = {row: index for index, row in enumerate(predictor.kept_rows.tolist())}
    scored, skipped = [], SkippedSentences()
    for row, sentence in enumerate(sentences):
        if skipped.counts(int(encoded.truncated[row]), predictor.positions[row]):
            continue
        words = None
        if examples is not None and row in example_of:
            units, ids = predictor.units[row], np.asarray(encoded.word_ids[row])
            words = WordAttention(
                probs=examples[example_of[row], :, :, : len(units), : len(units)],
                labels=units.labels(ids, encoded.words[row], encoded.tokens[row]),
                word_positions=predictor.positions[row],
            )
        scored.append(PredictedHeads(sentence, predicted[:, row, :, :, : len(sentence.words)], words))
    return scored, skipped


def iter_word_attention(
    sentences: Iterable[Sentence],
    model: LoadedModel,
    *,
    mode: WordMode = "mean",
    batch_size: int = 16,
    max_length: int | None = None,
) -> WordAttentionStream:
    """Each sentence with its :class:`~bertology.attention.words.WordAttention`, skipped ones left out, in the
    batching order of the module docstring.

    Sentences run through ``model`` ``batch_size`` at a time (one forward pass per batch).
    mode: how a split word's rows are combined (see :mod:`bertology.attention.words`).
    max_length: token limit per sentence (default and upper bound: the model's own limit).
    The returned stream's ``skipped`` counts the sentences left out (see the module docstring).
    """
    return WordAttentionStream(sentences, model, mode=mode, batch_size=batch_size, max_length=max_length)
