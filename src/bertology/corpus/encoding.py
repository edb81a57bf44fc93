"""Encode texts and sentence pairs: padded model inputs, tokens, segment ids, token-to-word alignment.

A *text* is either a string (its words are its whitespace-separated pieces) or a sequence of words
(e.g. a treebank sentence; they are joined with single spaces). Tokens are aligned to words through
the fast tokenizer's character offsets, so the alignment is right for WordPiece, BPE and SentencePiece.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from bertology.errors import BertologyError, TruncationWarning

Text = str | Sequence[str]

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class WordSpans:
    """A text as the tokenizer sees it and the character span ``[start, end)`` of each word."""

    text: str
    words: list[str]
    spans: list[tuple[int, int]]

    @classmethod
    def of(cls, text: Text, where: str) -> WordSpans:
        if isinstance(text, str):
            matches = list(_WORD.finditer(text))
            words, spans = [m.group() for m in matches], [m.span() for m in matches]
            joined = text
        else:
            words = [str(word) for word in text]
            joined = " ".join(words)
            starts = np.cumsum([0] + [len(word) + 1 for word in words[:-1]]).tolist()
            spans = [(start, start + len(word)) for start, word in zip(starts, words, strict=True)]
        if not any(word.strip() for word in words):
            raise BertologyError(f"{where} is empty or only whitespace; give some text to encode.")
        return cls(joined, words, spans)

    def word_of_char(self) -> np.ndarray:
        """``[len(text) + 1]`` int: for each character the index of the word that covers it, or of the
        next word when it is whitespace (``len(words)`` past the last word)."""
        owner = np.full(len(self.text) + 1, len(self.words), dtype=np.int64)
        previous_end = 0
        for index, (_, end) in enumerate(self.spans):
            owner[previous_end:end] = index
            previous_end = end
        return owner


@dataclass
class EncodedBatch:
    """A padded batch of encoded inputs (right padding).

    model_inputs: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the tokenizer makes
        them), each [batch, max_tokens].
    lengths: [batch] real (unpadded) token count of each input.
    tokens: per input, its n token strings.
    segment_ids: per input, [n] int: 0 for text A, 1 for text B; a special token takes the segment of
        the token before it ([CLS] and a leading <s> take 0), as BERT's token type ids do.
    special: per input, [n] bool, True for the tokenizer's special tokens.
    word_ids: per input, [n] int index into ``words`` (text A's words first, then text B's), -1 for
        special tokens.
    words: per input, the words of text A followed by those of text B.
    word_segments: per input, [len(words)] int segment of each word.
    truncated: per input, how many tokens were cut to fit the model's limit.
    """

    model_inputs: dict[str, torch.Tensor]
    lengths: np.ndarray
    tokens: list[list[str]]
    segment_ids: list[np.ndarray]
    special: list[np.ndarray]
    word_ids: list[np.ndarray]
    words: list[list[str]]
    word_segments: list[np.ndarray]
    truncated: list[int]

    def __len__(self) -> int:
        return len(self.tokens)

    def input_fields(self, index: int) -> dict[str, Any]:
        """Input ``index``'s token roles and ``truncated`` (the fields of an :class:`InputDescription` or an
        :class:`EncodedRow` that come from the batch), by name."""
        return {
            "tokens": self.tokens[index],
            "segment_ids": self.segment_ids[index],
            "special": self.special[index],
            "word_ids": self.word_ids[index],
            "words": self.words[index],
            "word_segments": self.word_segments[index],
            "truncated": self.truncated[index],
        }

    def rows(self) -> list[EncodedRow]:
        """Each input unpadded (the inverse of :func:`stack_rows`)."""
        return [
            EncodedRow(
                features={
                    name: values[index, : self.lengths[index]].numpy()
                    for name, values in self.model_inputs.items()
                },
                **self.input_fields(index),
            )
            for index in range(len(self))
        ]


@dataclass(frozen=True)
class TokenRoles:
    """One input's tokens and their roles, padding removed, as a view shows them.

    tokens: the n token strings. segment_ids: [n] 0 = text A, 1 = text B. special: [n] bool.
    word_ids: [n] index into ``words`` or -1 for special tokens. word_segments: [len(words)].
    """

    tokens: list[str]
    segment_ids: np.ndarray
    special: np.ndarray
    word_ids: np.ndarray
    words: list[str]
    word_segments: np.ndarray

    @property
    def is_pair(self) -> bool:
        return bool(self.segment_ids.max(initial=0) > 0)

    def roles(self) -> dict[str, Any]:
        """These fields by name (to describe the same input in another :class:`TokenRoles` subclass)."""
        return {field.name: getattr(self, field.name) for field in fields(TokenRoles)}


@dataclass(frozen=True)
class EncodedRow(TokenRoles):
    """One input of an :class:`EncodedBatch`, unpadded: its :class:`TokenRoles`, the tokens cut
    (``truncated``) and its features: ``input_ids``, ``attention_mask`` (and ``token_type_ids``), [n] int64
    each."""

    truncated: int
    features: dict[str, np.ndarray]


@dataclass(frozen=True)
class InputDescription(TokenRoles):
    """One encoded input as the views and statistics read it: its :class:`TokenRoles`, the tokens cut to
    fit the model (``truncated``) and the model's label (``model_name``); what a capture of its attention
    (:class:`~bertology.attention.capturing.Attention`,
    :class:`~bertology.attention.long_capture.LongAttention`) extends."""

    truncated: int
    model_name: str

    @classmethod
    def of_input(cls, encoded: EncodedBatch, index: int, model_name: str, **own: Any) -> Self:
        """Input ``index`` of ``encoded`` described, with the subclass's ``own`` fields."""
        return cls(**encoded.input_fields(index), model_name=model_name, **own)


def _sequence_array(sequence_ids: list[int | None]) -> np.ndarray:
    """[n] int: each token's sequence (0 = text A, 1 = text B), -1 for special tokens."""
    return np.array([-1 if sequence is None else sequence for sequence in sequence_ids], dtype=np.int64)


def _segments(sequences: np.ndarray) -> np.ndarray:
    """[n] int segment of each token: its sequence, or for a special token (-1) the sequence of the last
    text token before it (0 before any)."""
    positions = np.arange(len(sequences))
    last_text = np.maximum.accumulate(np.where(sequences >= 0, positions, -1))
    return np.where(last_text >= 0, sequences[last_text], 0)


def _word_ids(sequences: np.ndarray, offsets: list[tuple[int, int]], texts: list[WordSpans]) -> np.ndarray:
    """[n] int index of each token's word among all the texts' words, -1 for special tokens.

    A token belongs to the first word it overlaps: since :meth:`WordSpans.word_of_char` never decreases
    along the text, that is the word of its first character; a token made only of whitespace (e.g.
    SentencePiece's lone "▁") belongs to the word that follows it.
    """
    starts = np.array([start for start, _ in offsets], dtype=np.int64)
    result = np.full(len(sequences), -1, dtype=np.int64)
    first_word = 0
    for sequence, text in enumerate(texts):
        members = sequences == sequence
        local = text.word_of_char()[starts[members]]
        result[members] = first_word + np.minimum(local, len(text.words) - 1)
        first_word += len(text.words)
    return result


def _pad_rows(
    rows: Sequence[Sequence[int] | np.ndarray],
    width: int,
    fill: int | bool,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Stack per-input ``[n_b]`` rows into a ``[B, width]`` tensor (int64, or bool for a bool ``fill``),
    ``fill`` past each row's length."""
    dtype = np.bool_ if isinstance(fill, bool) else np.int64
    padded = np.full((len(rows), width), fill, dtype=dtype)
    for index, row in enumerate(rows):
        padded[index, : len(row)] = row
    return torch.from_numpy(padded).to(device)


@dataclass
class _Tokenized:
    """One input as the tokenizer returned it, before padding."""

    features: dict[str, list[int]]  # input_ids, attention_mask (and token_type_ids)
    tokens: list[str]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]
    full_length: int  # tokens before truncation


def _tokenize(
    tokenizer: PreTrainedTokenizerFast, first: list[str], second: list[str] | None, max_length: int
) -> list[_Tokenized]:
    """Tokenize inputs of one kind (all single texts, or all pairs), truncated but not padded."""
    encoded = tokenizer(
        first, second, truncation="longest_first", max_length=max_length, return_offsets_mapping=True
    )
    kept = [len(ids) for ids in encoded["input_ids"]]
    # Only an input that filled the limit may have been cut: count its tokens again, untruncated.
    filled = [index for index, length in enumerate(kept) if length >= max_length]
    full: dict[int, int] = {}
    if filled:
        again = tokenizer(
            [first[index] for index in filled],
            None if second is None else [second[index] for index in filled],
            verbose=False,
        )
        full = {index: len(ids) for index, ids in zip(filled, again["input_ids"], strict=True)}
    names = [name for name in ("input_ids", "token_type_ids", "attention_mask") if name in encoded]
    return [
        _Tokenized(
            features={name: encoded[name][index] for name in names},
            tokens=encoded.tokens(index),
            offsets=encoded["offset_mapping"][index],
            sequence_ids=encoded.sequence_ids(index),
            full_length=full.get(index, kept[index]),
        )
        for index in range(len(first))
    ]


def encode(
    tokenizer: PreTrainedTokenizerFast,
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None = None,
    *,
    max_length: int,
    pad_to_multiple_of: int | None = None,
    warn: bool = True,
) -> EncodedBatch:
    """Tokenize ``texts`` (and, for pairs, ``texts_b``) into a right-padded batch.

    A batch may mix pairs and single texts (``None`` in ``texts_b``). Inputs longer than
    ``max_length`` tokens are truncated (the longer text of a pair first) with a
    :class:`~bertology.errors.TruncationWarning` that says how many tokens were cut.
    pad_to_multiple_of: pad the batch to a multiple of this many tokens (equal shapes batch after
    batch let a long stream reuse the same memory). warn: the warnings (``False``: none; the cuts are in
    :attr:`EncodedBatch.truncated` either way, for a caller that reports them itself).

    Raises:
        BertologyError: no texts, an empty or whitespace-only text, or mismatched pair lengths.
    """
    if len(texts) == 0:
        raise BertologyError("There is no text to encode.")
    if texts_b is not None and len(texts_b) != len(texts):
        raise BertologyError(f"Got {len(texts)} first texts but {len(texts_b)} second texts.")
    pairs = texts_b if texts_b is not None else [None] * len(texts)
    spans = [
        [WordSpans.of(a, f"Text {i}")] + ([] if b is None else [WordSpans.of(b, f"Second text {i}")])
        for i, (a, b) in enumerate(zip(texts, pairs, strict=True))
    ]
    rows: list[_Tokenized | None] = [None] * len(spans)
    for with_pair in (False, True):
        members = [index for index, entry in enumerate(spans) if (len(entry) == 2) == with_pair]
        if members:
            first = [spans[index][0].text for index in members]
            second = [spans[index][1].text for index in members] if with_pair else None
            for index, row in zip(members, _tokenize(tokenizer, first, second, max_length), strict=True):
                rows[index] = row
    tokenized = [row for row in rows if row is not None]
    for index, row in enumerate(tokenized):
        cut = row.full_length - len(row.sequence_ids)
        if cut > 0 and warn:
            warnings.warn(
                f"Input {index} has {row.full_length} tokens but the model takes at most "
                f"{max_length}; {cut} {'token was' if cut == 1 else 'tokens were'} cut from the end"
                f"{' of the longer text' if len(spans[index]) == 2 else ''}.",
                TruncationWarning,
                stacklevel=2,
            )
    encoded = [_row(entry, row) for entry, row in zip(spans, tokenized, strict=True)]
    return stack_rows(encoded, tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def _row(spans: list[WordSpans], row: _Tokenized) -> EncodedRow:
    """One tokenized input with its roles, unpadded."""
    sequences = _sequence_array(row.sequence_ids)
    return EncodedRow(
        features={name: np.asarray(values, dtype=np.int64) for name, values in row.features.items()},
        tokens=row.tokens,
        segment_ids=_segments(sequences),
        special=sequences < 0,
        word_ids=_word_ids(sequences, row.offsets, spans),
        words=[word for text in spans for word in text.words],
        word_segments=np.concatenate(
            [np.full(len(text.words), s, dtype=np.int64) for s, text in enumerate(spans)]
        ),
        truncated=row.full_length - len(row.sequence_ids),
    )


def stack_rows(
    rows: Sequence[EncodedRow], tokenizer: PreTrainedTokenizerFast, *, pad_to_multiple_of: int | None = None
) -> EncodedBatch:
    """Encoded inputs (e.g. :meth:`EncodedBatch.rows` of earlier batches, or a cache's) as one right-padded
    batch, padded as :func:`encode` pads: to the longest row (rounded up to a multiple of
    ``pad_to_multiple_of``), with the tokenizer's pad token and pad token type."""
    width = max(len(row.tokens) for row in rows)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    fills = {"input_ids": tokenizer.pad_token_id or 0, "token_type_ids": tokenizer.pad_token_type_id}
    padded = {
        name: _pad_rows([row.features[name] for row in rows], width, fills.get(name, 0))
        for name in rows[0].features
    }
    return EncodedBatch(
        padded,
        np.array([len(row.tokens) for row in rows]),
        [row.tokens for row in rows],
        [row.segment_ids for row in rows],
        [row.special for row in rows],
        [row.word_ids for row in rows],
        [row.words for row in rows],
        [row.word_segments for row in rows],
        [row.truncated for row in rows],
    )


def encode_token_ids(tokenizer: PreTrainedTokenizerFast, ids: np.ndarray) -> EncodedBatch:
    """A batch of token-id sequences of one length, as they are (no special tokens added, nothing cut):
    the input of constructed sequences such as repeated random tokens.

    ids: [batch, n] int. Each token is its own word (its decoded text); the tokenizer's special tokens
    (``all_special_ids``) are marked special, with word id -1.

    Raises:
        BertologyError: an empty batch or ids outside the tokenizer's vocabulary.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2 or ids.size == 0:
        raise BertologyError(
            f"Token ids must be a non-empty [batch, tokens] array, not of shape {ids.shape}."
        )
    if ids.min() < 0 or ids.max() >= len(tokenizer):
        raise BertologyError(f"Token ids must lie in [0, {len(tokenizer)}), the tokenizer's vocabulary.")
    batch, n = ids.shape
    special_ids = np.array(sorted(tokenizer.all_special_ids), dtype=np.int64)
    encoded = EncodedBatch(
        {
            "input_ids": torch.from_numpy(ids.copy()),
            "attention_mask": torch.ones(batch, n, dtype=torch.int64),
        },
        np.full(batch, n),
        [],
        [],
        [],
        [],
        [],
        [],
        [0] * batch,
    )
    for row in ids:
        special = np.isin(row, special_ids)
        encoded.tokens.append(tokenizer.convert_ids_to_tokens(row.tolist()))
        encoded.segment_ids.append(np.zeros(n, dtype=np.int64))
        encoded.special.append(special)
        encoded.word_ids.append(np.where(special, -1, np.cumsum(~special) - 1))
        words = [
            tokenizer.decode([token])
            for token, is_special in zip(row, special, strict=True)
            if not is_special
        ]
        encoded.words.append(words)
        encoded.word_segments.append(np.zeros(len(words), dtype=np.int64))
    return encoded
