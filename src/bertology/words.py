"""Word-level attention: token-to-token attention of one input turned into word-to-word attention.

Clark et al. (2019, "What Does BERT Look At?", Section 4.1) convert attention maps to words this way:

* attention TO a word split into several pieces is the SUM of the attention to its pieces;
* attention FROM such a word is the MEAN of its pieces' rows, so every row still sums to 1;
* special tokens ([CLS], [SEP], ``<s>`` ...) stay units of their own.

The *units* of an input are its words and its special tokens, in text order. With ``A`` the
``[n, m]`` token-to-unit assignment matrix (``A[t, u] = 1`` when token ``t`` belongs to unit ``u``) and
``c = A.sum(0)`` the number of tokens in each unit, the word attention of ``probs [.., n, n]`` is
``diag(1 / c) Aᵀ · probs · A``. How the rows of a split word are combined is the ``mode``:

* ``"mean"`` (Clark et al.): the mean of the pieces' rows;
* ``"first"``: the row of the word's first piece;
* ``"max"``: the elementwise maximum of the pieces' rows, divided by its sum so the row sums to 1.

In every mode the columns are summed first (``probs · A``), then the rows are combined.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bertology.capture import Attention, HeadGrid
from bertology.errors import BertologyError
from bertology.options import WordMode

WORD_MODES: tuple[WordMode, ...] = ("mean", "first", "max")


@dataclass
class WordAttention(HeadGrid):
    """Word-to-word attention of one input.

    probs: [layers, heads, m, m] float32 over the m units (words and special tokens, in text order);
        row = attending unit, column = attended-to unit; each row sums to 1.
    labels: the m unit labels: a word, or the special token's string.
    word_positions: [n_words] int, the position of each word (index into the input's words) on the m
        axis, or -1 for a word without tokens (cut by truncation, or dropped by the tokenizer).
    """

    probs: np.ndarray
    labels: list[str]
    word_positions: np.ndarray

    @property
    def covers_all_words(self) -> bool:
        """Whether every word of the input has a position (none was cut or dropped)."""
        return bool((self.word_positions >= 0).all())

    def between_words(self) -> np.ndarray:
        """[layers, heads, n_words, n_words] the attention among the words only, in word order.

        Special-token rows and columns are dropped, so rows no longer sum to 1.

        Raises:
            BertologyError: a word has no tokens (see ``word_positions``).
        """
        if not self.covers_all_words:
            missing = int((self.word_positions < 0).sum())
            raise BertologyError(
                f"{missing} of {len(self.word_positions)} words have no tokens (cut or dropped by the "
                "tokenizer), so there is no attention between all the words."
            )
        positions = self.word_positions
        return self.probs[:, :, positions[:, None], positions[None, :]]


@dataclass(frozen=True)
class _Units:
    """How the n tokens of an input group into m units.

    unit: [n] unit of each token. first_token: [m] first token of each unit (ascending).
    """

    unit: np.ndarray
    first_token: np.ndarray

    @classmethod
    def of(cls, word_ids: np.ndarray) -> _Units:
        """Units from ``Attention.word_ids`` ([n], -1 for special tokens, each its own unit)."""
        keys = np.where(word_ids >= 0, word_ids, -1 - np.arange(len(word_ids)))
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        order = np.argsort(first)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return cls(unit=rank[inverse.reshape(-1)], first_token=first[order])

    def assignment(self) -> np.ndarray:
        """[n, m] float64 token-to-unit assignment matrix."""
        matrix = np.zeros((len(self.unit), len(self.first_token)))
        matrix[np.arange(len(self.unit)), self.unit] = 1.0
        return matrix


def _combine_rows(to_units: np.ndarray, units: _Units, assignment: np.ndarray, mode: WordMode) -> np.ndarray:
    """[.., m, m] unit rows from the token rows ``to_units`` [.., n, m] (see the module docstring)."""
    if mode == "mean":
        return (assignment / assignment.sum(0)).T @ to_units
    if mode == "first":
        return to_units[..., units.first_token, :]
    order = np.argsort(units.unit, kind="stable")
    starts = np.searchsorted(units.unit[order], np.arange(len(units.first_token)))
    maxima = np.maximum.reduceat(to_units[..., order, :], starts, axis=-2)
    return maxima / maxima.sum(-1, keepdims=True)


def word_attention(attention: Attention, mode: WordMode = "mean") -> WordAttention:
    """Word-to-word attention of ``attention`` (Clark et al. 2019; ``mode``: see the module docstring).

    Raises:
        BertologyError: an unknown ``mode``.
    """
    if mode not in WORD_MODES:
        raise BertologyError(f"Unknown word mode '{mode}'; use one of: {', '.join(WORD_MODES)}.")
    word_ids = np.asarray(attention.word_ids)
    units = _Units.of(word_ids)
    assignment = units.assignment()
    to_units = attention.probs.astype(np.float64) @ assignment
    probs = _combine_rows(to_units, units, assignment, mode).astype(np.float32)
    unit_words = word_ids[units.first_token]
    labels = [
        attention.words[word] if word >= 0 else attention.tokens[token]
        for word, token in zip(unit_words.tolist(), units.first_token.tolist(), strict=True)
    ]
    word_positions = np.full(len(attention.words), -1, dtype=np.int64)
    is_word = unit_words >= 0
    word_positions[unit_words[is_word]] = np.flatnonzero(is_word)
    return WordAttention(probs=probs, labels=labels, word_positions=word_positions)
