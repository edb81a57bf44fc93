"""Constructed :class:`AttentionBatch` objects with known answers, built without a model.

A segment is laid out BERT-style from words (a word is a string or a list of word pieces):
``[CLS] text A [SEP]`` or ``[CLS] text A [SEP] text B [SEP]``; the special strings can be changed
(RoBERTa: ``<s>`` / ``</s>``, with ``</s></s>`` between the texts). A head's attention is given by
*targets*: for each query the keys it attends to, uniformly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.attention.capturing import AttentionBatch
from bertology.corpus.encoding import EncodedBatch

Word = str | Sequence[str]


@dataclass
class Layout:
    """Tokens of one segment: text, 0/1 sentence, special flag and word index (-1 for specials)."""

    tokens: list[str]
    segment_ids: np.ndarray
    special: np.ndarray
    word_ids: np.ndarray
    words: list[str]

    def __len__(self) -> int:
        return len(self.tokens)


def layout(
    text_a: Sequence[Word],
    text_b: Sequence[Word] | None = None,
    *,
    cls: str = "[CLS]",
    sep: str = "[SEP]",
    double_sep: bool = False,
) -> Layout:
    """Lay out one segment; ``double_sep`` puts two [SEP] between the texts, as RoBERTa does."""
    tokens, segments, special, word_ids, words = [cls], [0], [True], [-1], []
    texts = [text_a] if text_b is None else [text_a, text_b]
    for sentence, text in enumerate(texts):
        for word in text:
            pieces = [word] if isinstance(word, str) else list(word)
            words.append("".join(piece.removeprefix("##") for piece in pieces))
            tokens += pieces
            segments += [sentence] * len(pieces)
            special += [False] * len(pieces)
            word_ids += [len(words) - 1] * len(pieces)
        closing = 2 if double_sep and sentence == 0 and text_b is not None else 1
        tokens += [sep] * closing
        segments += [sentence] * closing
        special += [True] * closing
        word_ids += [-1] * closing
    return Layout(tokens, np.array(segments), np.array(special), np.array(word_ids), words)


def from_targets(targets: Sequence[Sequence[int]]) -> np.ndarray:
    """[n, n] attention where query ``q`` attends uniformly to the keys ``targets[q]``."""
    n = len(targets)
    probs = np.zeros((n, n))
    for query, keys in enumerate(targets):
        probs[query, list(keys)] = 1.0 / len(keys)
    return probs


Head = Callable[[Layout], np.ndarray]


def stack_heads(segment: Layout, heads: Sequence[Head], layers: int = 1) -> np.ndarray:
    """[layers, len(heads), n, n]: every layer has the same heads."""
    one_layer = np.stack([head(segment) for head in heads])
    return np.repeat(one_layer[None], layers, axis=0)


def attention_batch(segments: Sequence[Layout], probs: Sequence[np.ndarray]) -> AttentionBatch:
    """A right-padded batch of ``probs[b]: [layers, heads, n_b, n_b]``.

    As in real batches, padded keys of real rows are 0; padded query rows are NaN, so a statistic
    that reads them shows it."""
    width = max(len(segment) for segment in segments)
    layers, heads = probs[0].shape[:2]
    padded = np.full((len(segments), layers, heads, width, width), np.nan, dtype=np.float32)
    for index, (segment, values) in enumerate(zip(segments, probs, strict=True)):
        n = len(segment)
        padded[index, :, :, :n, :] = 0.0
        padded[index, :, :, :n, :n] = values
    encoded = EncodedBatch(
        model_inputs={},
        lengths=np.array([len(segment) for segment in segments]),
        tokens=[segment.tokens for segment in segments],
        segment_ids=[segment.segment_ids for segment in segments],
        special=[segment.special for segment in segments],
        word_ids=[segment.word_ids for segment in segments],
        words=[segment.words for segment in segments],
        word_segments=[np.zeros(len(segment.words), dtype=np.int64) for segment in segments],
        truncated=[0] * len(segments),
    )
    return AttentionBatch(
        probs=torch.from_numpy(padded),
        queries=None,
        keys=None,
        scaling=np.ones(layers),
        encoded=encoded,
        model_name="synthetic",
    )


VOCABULARY = ("the", "cat", "sat", "on", "a", "mat", ".", ",", "dog", "The", "un", "##bel", "##ie")


def random_segments(count: int, rng: np.random.Generator, *, pairs: bool) -> list[Layout]:
    """Segments of 1-8 random words per text (some split into pieces, some repeated, some punctuation)."""

    def text() -> list[Word]:
        words: list[Word] = []
        for _ in range(int(rng.integers(1, 9))):
            if rng.random() < 0.2:
                words.append(["un", "##bel", "##ie"][: int(rng.integers(2, 4))])
            else:
                words.append(str(rng.choice(VOCABULARY[:10])))
        return words

    return [layout(text(), text() if pairs else None) for _ in range(count)]


def random_attention(
    segments: Sequence[Layout], layers: int, heads: int, rng: np.random.Generator
) -> AttentionBatch:
    """Peaky random softmax attention (some weights underflow to almost 0) over ``segments``."""
    probs = []
    for segment in segments:
        n = len(segment)
        logits = rng.standard_normal((layers, heads, n, n)) * rng.uniform(0.5, 6.0, (layers, heads, 1, 1))
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        probs.append(weights / weights.sum(-1, keepdims=True))
    return attention_batch(segments, probs)


def split(batch: AttentionBatch, at: int) -> tuple[AttentionBatch, AttentionBatch]:
    """The first ``at`` segments and the rest, each re-padded to its own length."""

    def part(indices: range) -> AttentionBatch:
        examples = [batch[index] for index in indices]
        segments = [Layout(e.tokens, e.segment_ids, e.special, e.word_ids, e.words) for e in examples]
        return attention_batch(segments, [e.probs for e in examples])

    return part(range(at)), part(range(at, len(batch)))
