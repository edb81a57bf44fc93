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
import torch

from bertology.attention.capturing import Attention, HeadGrid
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
class Units:
    """How the n tokens of an input group into m units (words and special tokens, in text order).

    unit: [n] unit of each token. first_token: [m] first token of each unit (ascending).
    """

    unit: np.ndarray
    first_token: np.ndarray

    @classmethod
    def of(cls, word_ids: np.ndarray) -> Units:
        """Units from ``Attention.word_ids`` ([n], -1 for special tokens, each its own unit)."""
        keys = np.where(word_ids >= 0, word_ids, -1 - np.arange(len(word_ids)))
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        order = np.argsort(first)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return cls(unit=rank[inverse.reshape(-1)], first_token=first[order])

    def __len__(self) -> int:
        return len(self.first_token)

    def word_positions(self, word_ids: np.ndarray, num_words: int) -> np.ndarray:
        """[num_words] int: each word's unit, -1 for a word without tokens (see :class:`WordAttention`)."""
        unit_words = word_ids[self.first_token]
        positions = np.full(num_words, -1, dtype=np.int64)
        is_word = unit_words >= 0
        positions[unit_words[is_word]] = np.flatnonzero(is_word)
        return positions

    def labels(self, word_ids: np.ndarray, words: list[str], tokens: list[str]) -> list[str]:
        """The m unit labels: the word, or the special token's string."""
        firsts = self.first_token.tolist()
        return [
            words[word] if word >= 0 else tokens[token]
            for word, token in zip(word_ids[self.first_token].tolist(), firsts, strict=True)
        ]


def padded_units(units: list[Units], width: int) -> tuple[torch.Tensor, int]:
    """The units of a right-padded batch of ``width`` tokens: ([batch, width] int64 unit of each token, m)
    with m the most units of an input; padding tokens get unit m, which :class:`UnitMaps` drops."""
    most = max(len(each) for each in units)
    padded = np.full((len(units), width), most, dtype=np.int64)
    for row, each in enumerate(units):
        padded[row, : len(each.unit)] = each.unit
    return torch.from_numpy(padded), most


class UnitMaps:
    """Turns a batch's token attention into unit attention, a layer at a time (see the module docstring).

    Built once per batch: the ``[batch, n, k]`` matrix that sums the columns of each unit's tokens and the
    ``[batch, k, n]`` one that combines the rows (mean or first token), for the ``k`` units kept.
    unit: [batch, n] int64 unit of each token, ``units`` for a padding token (:func:`padded_units`; for
    the layers of one input, its ``Units.unit`` per layer). select: [batch, k] the units to keep, in
    order (default: all ``units``). dtype: the precision of the products.
    """

    def __init__(
        self,
        unit: torch.Tensor,
        units: int,
        mode: WordMode,
        *,
        select: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        batch, tokens = unit.shape
        self.mode, self.dtype, self.units = mode, dtype, units
        self.unit = unit.to(device)
        self.select = None if select is None else select.to(device)
        assignment = torch.zeros(batch, tokens, units + 1, dtype=dtype, device=device)
        assignment.scatter_(2, self.unit[..., None], 1.0)
        assignment = assignment[..., :units]  # [batch, n, m]: padding belongs to no unit
        if mode == "mean":
            rows = (assignment / assignment.sum(1, keepdim=True).clamp(min=1.0)).transpose(1, 2)
        elif mode == "first":
            positions = torch.arange(tokens, device=device).expand(batch, tokens)
            first = torch.full((batch, units + 1), tokens, device=device)
            # each unit's first token
            first = first.scatter_reduce(1, self.unit, positions, "amin")[:, :units]
            rows = torch.zeros(batch, units, tokens + 1, dtype=dtype, device=device)
            rows.scatter_(2, first[..., None], 1.0)
            rows = rows[..., :tokens]
        if mode != "max" and self.select is not None:  # keep only the selected units' rows and columns
            assignment = assignment.gather(2, self.select[:, None, :].expand(batch, tokens, -1))
            rows = rows.gather(1, self.select[:, :, None].expand(-1, -1, tokens))
        self.columns = assignment.contiguous()  # [batch, n, k]
        self.rows = None if mode == "max" else rows.contiguous()  # [batch, k, n]

    def __call__(self, probs: torch.Tensor) -> torch.Tensor:
        """probs: [batch, heads, n, n] token attention -> [batch, heads, k, k] unit attention (``dtype``);
        rows and columns past an input's own units are zero (``"max"``: NaN rows)."""
        batch, heads, tokens, _ = probs.shape
        summed = torch.bmm(probs.to(self.dtype).reshape(batch, heads * tokens, tokens), self.columns)
        to_units = summed.reshape(batch, heads, tokens, -1)  # [batch, heads, n, k]: the columns summed
        if self.rows is not None:
            return self.rows[:, None] @ to_units
        index = self.unit[:, None, :, None].expand_as(to_units)
        shape = (batch, heads, self.units + 1, self.units)
        empty = torch.full(shape, float("-inf"), dtype=self.dtype, device=probs.device)
        maxima = empty.scatter_reduce(2, index, to_units, "amax")[:, :, : self.units]
        combined = maxima / maxima.sum(-1, keepdim=True)
        if self.select is None:
            return combined
        rows = combined.gather(2, self.select[:, None, :, None].expand(-1, heads, -1, self.units))
        return rows.gather(3, self.select[:, None, None, :].expand(-1, heads, self.select.shape[1], -1))


def check_word_mode(mode: str) -> None:
    """Raises:
    BertologyError: an unknown ``mode``."""
    if mode not in WORD_MODES:
        raise BertologyError(f"Unknown word mode '{mode}'; use one of: {', '.join(WORD_MODES)}.")


def word_attention(attention: Attention, mode: WordMode = "mean") -> WordAttention:
    """Word-to-word attention of ``attention`` (Clark et al. 2019; ``mode``: see the module docstring).

    Raises:
        BertologyError: an unknown ``mode``.
    """
    check_word_mode(mode)
    word_ids = np.asarray(attention.word_ids)
    units = Units.of(word_ids)
    probs = torch.from_numpy(np.asarray(attention.probs))  # the layers are the batch of UnitMaps
    unit = torch.from_numpy(units.unit).expand(probs.shape[0], -1)
    return WordAttention(
        probs=UnitMaps(unit, len(units), mode)(probs).float().numpy(),
        labels=units.labels(word_ids, attention.words, attention.tokens),
        word_positions=units.word_positions(word_ids, len(attention.words)),
    )
