"""Attention rows of a padded batch, the roles of their tokens, and the per-row quantities statistics
are made of.

Shapes: ``B`` segments, ``L`` layers, ``H`` heads, ``N`` = the batch's padded length; ``Q`` (query)
and ``K`` (key) index the same ``N`` tokens. Row ``q`` of ``probs[b, l, h]`` is how token ``q``
distributes its attention over the keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn.functional import pad

from bertology.errors import BertologyError

if TYPE_CHECKING:
    from bertology.capture import AttentionBatch
    from bertology.inputs import EncodedBatch
    from bertology.models import LoadedModel

#: Word-start and continuation markers of WordPiece (``##``), byte-level BPE (``Ġ``) and
#: SentencePiece (``▁``), removed before comparing token text.
SUBWORD_MARKERS = ("##", "Ġ", "▁")

#: Token text that counts as punctuation (Clark et al. 2019 use "." and ",").
PUNCTUATION = frozenset({".", ","})


def surface_form(token: str) -> str:
    """A token's text without its leading subword marker (``"##ing"`` -> ``"ing"``, ``"Ġa"`` -> ``"a"``)."""
    for marker in SUBWORD_MARKERS:
        if token.startswith(marker) and len(token) > len(marker):
            return token[len(marker) :]
    return token


@dataclass(frozen=True)
class SpecialTokens:
    """The token strings of a model's [CLS] and [SEP] (RoBERTa and XLM-R: ``<s>`` and ``</s>``)."""

    cls_token: str = "[CLS]"
    sep_token: str = "[SEP]"

    @classmethod
    def of(cls, model: LoadedModel) -> SpecialTokens:
        """The loaded model's own tokenizer strings."""
        tokenizer = model.tokenizer
        if tokenizer.cls_token is None or tokenizer.sep_token is None:
            raise BertologyError(f"The tokenizer of '{model.name}' has no [CLS] or [SEP] token.")
        return cls(tokenizer.cls_token, tokenizer.sep_token)

    def roles(self, encoded: EncodedBatch, width: int, device: torch.device | None = None) -> TokenRoles:
        """:meth:`TokenRoles.of` ``encoded`` with these strings."""
        return TokenRoles.of(
            encoded, width, cls_token=self.cls_token, sep_token=self.sep_token, device=device
        )


@dataclass(frozen=True)
class TokenRoles:
    """What each token of a padded batch is; every tensor is ``[B, N]`` and False / -1 past a length.

    valid: a real (not padding) token. is_cls / is_sep: a special token whose text is the model's
    [CLS] / [SEP] string. is_punct: a non-special token whose :func:`surface_form` is "." or ",".
    segment: 0 for text A, 1 for text B (``EncodedBatch.segment_ids``). word: index of the token's word,
    -1 for special tokens (``EncodedBatch.word_ids``). text: equal ids for tokens of a segment with
    equal lowercased :func:`surface_form`, -1 for special tokens and padding.
    """

    valid: torch.Tensor
    is_cls: torch.Tensor
    is_sep: torch.Tensor
    is_punct: torch.Tensor
    segment: torch.Tensor
    word: torch.Tensor
    text: torch.Tensor

    @classmethod
    def of(
        cls,
        encoded: EncodedBatch,
        width: int,
        *,
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        device: torch.device | None = None,
    ) -> TokenRoles:
        """Roles of the tokens of ``encoded``, padded to ``width`` tokens, on ``device`` (default: CPU).

        Each distinct token string of the batch is looked at once; the batch's tokens, laid end to end,
        then take their roles by index.
        """
        lengths = np.asarray(encoded.lengths)
        filled = np.arange(width)[None, :] < lengths[:, None]  # [B, N]: where the tokens, end to end, go

        def padded(values: np.ndarray, fill: int | bool) -> torch.Tensor:
            """[B, N] from the batch's per-token ``values`` laid end to end, ``fill`` past each length."""
            grid = np.full(filled.shape, fill, dtype=values.dtype)
            grid[filled] = values
            return torch.from_numpy(grid).to(device)

        distinct: dict[str, int] = {}
        index = np.array(
            [distinct.setdefault(token, len(distinct)) for tokens in encoded.tokens for token in tokens],
            dtype=np.int64,
        )
        forms: dict[str, int] = {}
        form_ids = np.array([forms.setdefault(surface_form(token).lower(), len(forms)) for token in distinct])
        punct = np.array([surface_form(token) in PUNCTUATION for token in distinct], dtype=bool)
        names = np.array(list(distinct), dtype=object)
        special = np.concatenate(encoded.special).astype(bool)
        return cls(
            valid=torch.from_numpy(filled).to(device),
            is_cls=padded(special & (names == cls_token)[index], False),
            is_sep=padded(special & (names == sep_token)[index], False),
            is_punct=padded(~special & punct[index], False),
            segment=padded(np.concatenate(encoded.segment_ids).astype(np.int64), -1),
            word=padded(np.concatenate(encoded.word_ids).astype(np.int64), -1),
            text=padded(np.where(special, -1, form_ids[index]), -1),
        )

    @property
    def is_delimiter(self) -> torch.Tensor:
        """[B, N] bool: [CLS] or [SEP]."""
        return self.is_cls | self.is_sep


@dataclass(frozen=True)
class QueryValues:
    """A per-query quantity and the query tokens it is defined for.

    values: [B, L, H, Q] float. queries: [B, Q] bool; values outside it are ignored (they may be NaN).
    denominator: [B] float or ``None``: what each segment's sum over its queries is divided by; ``None``
        (the default) divides by the number of queries, i.e. takes their mean. A statistic defined by
        another normaliser (e.g. Clark et al.'s released code, :mod:`bertology.stats.surface`) sets it.
    """

    values: torch.Tensor
    queries: torch.Tensor
    denominator: torch.Tensor | None = None


def stack_segment_means(statistics: Iterable[QueryValues]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each statistic averaged over each segment's queries (or its sum divided by its ``denominator``).

    Returns ``(values [B, S, L, H] float64, defined [B, S] bool)`` for ``S`` statistics; a segment where
    a statistic has no query gets 0 and ``defined`` False. Sums over queries are taken in float32 (at
    most a segment's tokens per sum), the means in float64.
    """
    means, defined = [], []
    for statistic in statistics:
        kept = torch.where(statistic.queries[:, None, None, :], statistic.values, 0.0).sum(-1)
        count = statistic.queries.sum(-1)
        divisor = count.clamp_min(1) if statistic.denominator is None else statistic.denominator
        means.append(kept.double() / divisor.double()[:, None, None])
        defined.append(count > 0)
    return torch.stack(means, dim=1), torch.stack(defined, dim=1)


#: Probabilities are raised to at least this before taking logs; ``x ln x`` there is ~1e-28, i.e. 0.
_TINY = 1e-30


def _pairs(masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The True entries of ``[S, B, Q, K]`` masks as ``(b, q, k, row)``, each ``[M]`` int64, with
    ``row = (s * B + b) * Q + q`` the entry's query row among all ``S * B * Q``."""
    s, b, q, k = masks.nonzero(as_tuple=True)
    return b, q, k, (s * masks.shape[1] + b) * masks.shape[2] + q


@dataclass(frozen=True)
class RowSummary:
    """Per-row quantities of every attention row of a batch, which every statistic is made of.

    Each quantity is ``[B, L, H, Q]`` float32 for row ``q`` of ``A = probs[b, l, h]`` (meaningless past
    the segment's length; statistics pick their queries with ``roles`` and the ``*_queries`` masks):
    previous ``A[q, q-1]``, next ``A[q, q+1]``, current ``A[q, q]`` (0 where the key does not exist);
    cls / sep / punct: ``sum_k A[q, k]`` over the [CLS] / [SEP] / punctuation keys; entropy
    ``-sum_k A[q, k] ln A[q, k]`` in nats; maximum ``max_k A[q, k]``; non_sep_maximum, the maximum over
    keys that are not [SEP]; non_delimiter_maximum, over keys that are neither [CLS] nor [SEP];
    smoothed_entropy (only when summarised with ``smoothing`` ε > 0, else ``None``): the entropy of the
    smoothed row ``(1 - ε) A[q, k] + ε / n`` over the segment's ``n`` keys; same_word: the mass on keys
    with ``q``'s token text or word (``q`` included); other_sentence: on keys with ``q``'s token text in
    the other segment; word_pieces: on the other pieces of ``q``'s word.
    same_word_queries / other_sentence_queries / word_piece_queries: [B, Q] bool, the queries that
    have at least one such key.
    """

    roles: TokenRoles
    previous: torch.Tensor
    next: torch.Tensor
    current: torch.Tensor
    cls: torch.Tensor
    sep: torch.Tensor
    punct: torch.Tensor
    entropy: torch.Tensor
    maximum: torch.Tensor
    non_sep_maximum: torch.Tensor
    non_delimiter_maximum: torch.Tensor
    same_word: torch.Tensor
    other_sentence: torch.Tensor
    word_pieces: torch.Tensor
    same_word_queries: torch.Tensor
    other_sentence_queries: torch.Tensor
    word_piece_queries: torch.Tensor
    smoothed_entropy: torch.Tensor | None = None

    @classmethod
    def of(cls, batch: AttentionBatch, special: SpecialTokens, *, smoothing: float = 0.0) -> RowSummary:
        """Summarise a captured batch (``batch.probs``: [B, L, H, N, N]) layer by layer; ``smoothing`` as
        in :class:`RowSummarizer`."""
        summarizer = RowSummarizer(batch.encoded, special, smoothing=smoothing)
        for layer in range(batch.probs.shape[1]):
            summarizer.add_layer(batch.probs[:, layer])
        return summarizer.result()

    @property
    def previous_queries(self) -> torch.Tensor:
        """[B, Q] bool: real queries with a real token before them (``q >= 1``)."""
        return pad(self.roles.valid[:, 1:], (1, 0), value=False)

    @property
    def next_queries(self) -> torch.Tensor:
        """[B, Q] bool: real queries with a real token after them (``q <= n - 2``)."""
        return pad(self.roles.valid[:, 1:], (0, 1), value=False)

    @cached_property
    def log_length(self) -> torch.Tensor:
        """[B, L, H, Q] ``ln n`` of the row's segment (the entropy of uniform attention), broadcast."""
        lengths = self.roles.valid.sum(-1).to(self.entropy.dtype)
        return torch.log(lengths)[:, None, None, None].expand(self.entropy.shape)


class RowSummarizer:
    """Builds a :class:`RowSummary` from one batch's attention, one layer at a time.

    Feed it each layer's probs ``[B, H, N, N]`` in layer order with :meth:`add_layer` (e.g. straight from
    the attention function while streaming, so no layer is kept); every pass over a layer happens while
    it is in cache, into one reused scratch buffer. The masses on per-query key sets (same word, other
    sentence, word pieces) are gathered from their few ``(q, k)`` pairs instead of a pass over the rows.

    scratch: a flat buffer to reuse, e.g. the previous batch's :attr:`scratch`: a stream of batches then
    writes into memory already mapped instead of faulting a fresh ``[B, H, N, N]`` buffer in every batch
    (benchmarks/RESULTS.md, "Fourth round"). One too small or on another device is replaced.
    smoothing: ε > 0 also gives :attr:`RowSummary.smoothed_entropy` (one more pass over each layer);
    0 (the default) leaves it out.
    """

    def __init__(
        self,
        encoded: EncodedBatch,
        special: SpecialTokens,
        scratch: torch.Tensor | None = None,
        *,
        smoothing: float = 0.0,
    ) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise BertologyError(f"Entropy smoothing must be in [0, 1), not {smoothing}.")
        self.encoded = encoded
        self.special = special
        self.layers: list[dict[str, torch.Tensor]] = []
        self.scratch = scratch
        self.smoothing = smoothing

    def _prepare(self, width: int, device: torch.device) -> None:
        """Token roles and key sets of the batch, once, at the first layer's width and device."""
        self.roles = roles = self.special.roles(self.encoded, width, device)
        delimiter = roles.is_delimiter
        #: [B, N, 3] float: which keys are [CLS], [SEP], punctuation.
        self.key_sets = torch.stack([roles.is_cls, roles.is_sep, roles.is_punct], dim=-1).float()
        #: [B, 1, 1, N] float: 1 for keys that are not [CLS] / [SEP].
        self.content = (~delimiter).float()[:, None, None, :]
        #: The (b, k) positions of the [CLS] keys, each [C] int64.
        self.cls_keys = roles.is_cls.nonzero(as_tuple=True)
        #: [B, 1, 1, N] float: 1 for real keys; [B, 1, 1, 1] float: ε / n of each segment.
        self.real_keys = roles.valid.float()[:, None, None, :]
        self.uniform_share = (self.smoothing / roles.valid.sum(-1).clamp_min(1).float())[:, None, None, None]
        same_text = _equal(roles.text)
        same_word = _equal(roles.word)
        itself = torch.eye(roles.valid.shape[1], dtype=torch.bool, device=roles.valid.device)
        other_segment = roles.segment[:, :, None] != roles.segment[:, None, :]
        self.masks = {
            "same_word": same_text | same_word,
            "other_sentence": same_text & other_segment,
            "word_pieces": same_word & ~itself,
        }
        #: The (b, q, k) pairs of all three key sets, and each pair's row among their [3 * B * N] query rows.
        self.pairs = _pairs(torch.stack(list(self.masks.values())))

    def add_layer(self, probs: torch.Tensor) -> None:
        """Summarise one layer: ``probs`` [B, H, N, N], rows summing to 1 over the real keys."""
        probs = probs.float()
        if not self.layers:
            self._prepare(probs.shape[-1], probs.device)
        elements = probs.numel()
        if self.scratch is None or self.scratch.numel() < elements or self.scratch.device != probs.device:
            self.scratch = torch.empty(elements, device=probs.device)
        scratch = self.scratch[:elements].view(probs.shape)
        batch, heads, size, _ = probs.shape
        rows = probs.reshape(batch, heads * size, size)
        masses = torch.bmm(rows, self.key_sets).view(batch, heads, size, 3)  # [CLS], [SEP], punctuation
        entropy = -torch.clamp(probs, min=_TINY, out=scratch).log_().mul_(probs).sum(-1)
        non_delimiter_maximum = torch.mul(probs, self.content, out=scratch).amax(-1)
        cls_batch, cls_key = self.cls_keys  # the largest weight on a [CLS] key, 0 where there is none
        on_cls = probs[cls_batch, :, :, cls_key].reshape(len(cls_batch), heads * size)
        cls_maximum = (
            probs.new_zeros(batch, heads * size)
            .scatter_reduce_(0, cls_batch[:, None].expand_as(on_cls), on_cls, "amax")
            .view(batch, heads, size)
        )
        quantities = {
            "previous": pad(torch.diagonal(probs, -1, -2, -1), (1, 0)),
            "next": pad(torch.diagonal(probs, 1, -2, -1), (0, 1)),
            "current": torch.diagonal(probs, 0, -2, -1).clone(),
            "cls": masses[..., 0],
            "sep": masses[..., 1],
            "punct": masses[..., 2],
            "entropy": entropy,
            "maximum": probs.amax(-1),
            "non_sep_maximum": torch.maximum(non_delimiter_maximum, cls_maximum),
            "non_delimiter_maximum": non_delimiter_maximum,
        }
        if self.smoothing:
            smoothed = torch.mul(probs, 1.0 - self.smoothing, out=scratch).add_(self.uniform_share)
            smoothed.mul_(self.real_keys)  # padding keys are no keys: 0, and 0 ln 0 = 0
            quantities["smoothed_entropy"] = -smoothed.xlogy_(smoothed).sum(-1)
        b, q, k, row = self.pairs
        masses_by_set = probs.new_zeros(len(self.masks) * batch * size, heads).index_add_(
            0, row, probs[b, :, q, k]
        )
        for name, mass in zip(self.masks, masses_by_set.view(-1, batch, size, heads), strict=True):
            quantities[name] = mass.transpose(1, 2)
        self.layers.append(quantities)

    def result(self) -> RowSummary:
        """The summary of the layers added so far (each quantity stacked to [B, L, H, Q])."""
        if not self.layers:
            raise BertologyError("No attention layer was summarised; run the model on the batch first.")
        stacked = {name: torch.stack([layer[name] for layer in self.layers], 1) for name in self.layers[0]}
        return RowSummary(
            roles=self.roles,
            **stacked,
            same_word_queries=self.masks["same_word"].any(-1),
            other_sentence_queries=self.masks["other_sentence"].any(-1),
            word_piece_queries=self.masks["word_pieces"].any(-1),
        )


def _equal(ids: torch.Tensor) -> torch.Tensor:
    """[B, Q, K] bool: query and key have the same id and it is not -1."""
    return (ids[:, :, None] == ids[:, None, :]) & (ids >= 0)[:, :, None]
