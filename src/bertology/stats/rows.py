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
from bertology.models.devices import float64_home

if TYPE_CHECKING:
    from bertology.attention.capturing import AttentionBatch
    from bertology.corpus.encoding import EncodedBatch
    from bertology.models.loading import LoadedModel

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
    """The token strings of a model's [CLS] and [SEP] (RoBERTa and XLM-R: ``<s>`` and ``</s>``), and
    whether its attention is causal.

    A decoder (``causal``: each query attends to itself and earlier keys only) has neither: its
    beginning-of-text token is no [CLS] and nothing separates texts, so ``cls_token`` and ``sep_token``
    are ``None`` and no token takes those roles.
    """

    cls_token: str | None = "[CLS]"
    sep_token: str | None = "[SEP]"
    causal: bool = False

    @classmethod
    def of(cls, model: LoadedModel) -> SpecialTokens:
        """The loaded model's own tokenizer strings (none for a decoder)."""
        if model.kind == "decoder":
            return cls(None, None, causal=True)
        tokenizer = model.tokenizer
        if tokenizer.cls_token is None or tokenizer.sep_token is None:
            raise BertologyError(f"The tokenizer of '{model.name}' has no [CLS] or [SEP] token.")
        return cls(tokenizer.cls_token, tokenizer.sep_token)

    def roles(self, encoded: EncodedBatch, width: int, device: torch.device | None = None) -> TokenRoles:
        """:meth:`TokenRoles.of` ``encoded`` with these strings."""
        return TokenRoles.of(
            encoded,
            width,
            cls_token=self.cls_token,
            sep_token=self.sep_token,
            causal=self.causal,
            device=device,
        )


@dataclass(frozen=True)
class TokenRoles:
    """What each token of a padded batch is; every tensor is ``[B, N]`` and False / -1 past a length.

    valid: a real (not padding) token. is_cls / is_sep: a special token whose text is the model's
    [CLS] / [SEP] string. is_punct: a non-special token whose :func:`surface_form` is "." or ",".
    segment: 0 for text A, 1 for text B (``EncodedBatch.segment_ids``). word: index of the token's word,
    -1 for special tokens (``EncodedBatch.word_ids``). text: equal ids for tokens of a segment with
    equal lowercased :func:`surface_form`, -1 for special tokens and padding.
    causal: the attention is a decoder's (each query sees itself and earlier keys only); statistics then
    leave out the keys after the query (:attr:`attendable`).
    """

    valid: torch.Tensor
    is_cls: torch.Tensor
    is_sep: torch.Tensor
    is_punct: torch.Tensor
    segment: torch.Tensor
    word: torch.Tensor
    text: torch.Tensor
    causal: bool = False

    @classmethod
    def of(
        cls,
        encoded: EncodedBatch,
        width: int,
        *,
        cls_token: str | None = "[CLS]",
        sep_token: str | None = "[SEP]",
        causal: bool = False,
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

        def named(token: str | None) -> np.ndarray:
            """Per token end to end: a special token whose text is ``token`` (none for ``None``)."""
            return special & np.array([name == token for name in names], dtype=bool)[index]

        return cls(
            valid=torch.from_numpy(filled).to(device),
            is_cls=padded(named(cls_token), False),
            is_sep=padded(named(sep_token), False),
            is_punct=padded(~special & punct[index], False),
            segment=padded(np.concatenate(encoded.segment_ids).astype(np.int64), -1),
            word=padded(np.concatenate(encoded.word_ids).astype(np.int64), -1),
            text=padded(np.where(special, -1, form_ids[index]), -1),
            causal=causal,
        )

    @property
    def is_delimiter(self) -> torch.Tensor:
        """[B, N] bool: [CLS] or [SEP]."""
        return self.is_cls | self.is_sep

    def attendable_rows(self, start: int, stop: int) -> torch.Tensor:
        """[B, stop - start, K] bool: the keys queries ``start..stop - 1`` may attend to: the real tokens,
        and for causal attention only those up to the query."""
        keys = self.valid[:, None, :].expand(-1, stop - start, -1)
        if not self.causal:
            return keys
        rows = torch.arange(start, stop, device=keys.device)[:, None]
        return keys & (torch.arange(keys.shape[-1], device=keys.device)[None, :] <= rows)

    def attendable_counts(self, same_segment: bool = False) -> torch.Tensor:
        """[B, Q] int64: how many keys query ``q`` may attend to (:meth:`attendable_rows`), with
        ``same_segment`` only those of its own segment (0 for padding); counted without a [B, Q, K] map."""

        def counts(keys: torch.Tensor) -> torch.Tensor:
            keys = keys.long()
            return keys.cumsum(-1) if self.causal else keys.sum(-1, keepdim=True).expand_as(keys)

        if not same_segment:
            return counts(self.valid)
        result = torch.zeros_like(self.segment)
        for segment in self.segment[self.valid].unique().tolist():
            mine = self.valid & (self.segment == segment)
            result = torch.where(mine, counts(mine), result)
        return result


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

    Returns ``(values [B, S, L, H] float64, defined [B, S] bool)`` for ``S`` statistics; a segment where a
    statistic has no query gets 0 and ``defined`` False. Sums over queries are taken in float32 where the
    rows are (at most a segment's tokens per sum), the means in float64 (whatever the model's precision)
    on the same device, or on the CPU for an Apple GPU, which has no float64
    (:func:`~bertology.models.devices.float64_home`): nothing reaches the host per batch on CUDA.
    """
    sums, counts, divisors = [], [], []
    for statistic in statistics:
        sums.append(torch.where(statistic.queries[:, None, None, :], statistic.values, 0.0).sum(-1))
        count = statistic.queries.sum(-1)
        counts.append(count)
        divisors.append(
            (count.clamp_min(1) if statistic.denominator is None else statistic.denominator).float()
        )
    kept = torch.stack(sums, dim=1)  # [B, S, L, H]
    home = float64_home(kept.device)
    kept = kept.to(home, torch.float64)
    divisor = torch.stack(divisors, dim=1).to(home, torch.float64)  # [B, S]
    return kept / divisor[:, :, None, None], torch.stack(counts, dim=1).to(home) > 0


#: Probabilities are raised to at least this before taking logs; ``x ln x`` there is ~1e-28, i.e. 0.
_TINY = 1e-30


@dataclass(frozen=True)
class RowSummary:
    """Per-row quantities of every attention row of a batch, which every statistic is made of.

    Each quantity is ``[B, L, H, Q]`` float32 for row ``q`` of ``A = probs[b, l, h]`` (meaningless past
    the segment's length; statistics pick their queries with ``roles`` and the ``*_queries`` masks):
    previous ``A[q, q-1]``, next ``A[q, q+1]``, current ``A[q, q]`` (0 where the key does not exist);
    first ``A[q, 0]``, the mass on the segment's first token; cls / sep / punct: ``sum_k A[q, k]`` over
    the [CLS] / [SEP] / punctuation keys; entropy ``-sum_k A[q, k] ln A[q, k]`` in nats; maximum
    ``max_k A[q, k]``; non_sep_maximum, the maximum over keys that are not [SEP]; non_delimiter_maximum,
    over keys that are neither [CLS] nor [SEP];
    smoothed_entropy (only when summarised with ``smoothing`` ε > 0, else ``None``): the entropy of the
    smoothed row ``(1 - ε) A[q, k] + ε / n`` over the ``n`` keys the query may attend to (the segment's,
    or for causal attention those up to ``q``); same_word: the mass on keys
    with ``q``'s token text or word (``q`` included); other_sentence: on keys with ``q``'s token text in
    the other segment; word_pieces: on the other pieces of ``q``'s word.
    same_word_queries / other_sentence_queries / word_piece_queries: [B, Q] bool, the queries that
    have at least one such key.
    """

    roles: TokenRoles
    previous: torch.Tensor
    next: torch.Tensor
    current: torch.Tensor
    first: torch.Tensor
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
        """[B, Q] bool: real queries with a real token after them (``q <= n - 2``) that they may attend
        to: none for causal attention, where the next token is a future key."""
        following = pad(self.roles.valid[:, 1:], (0, 1), value=False)
        return torch.zeros_like(following) if self.roles.causal else following

    @cached_property
    def log_length(self) -> torch.Tensor:
        """[B, L, H, Q] ``ln`` of the number of keys the row may attend to (the entropy of uniform attention
        over them), broadcast: ``ln n``, or ``ln (q + 1)`` for causal attention."""
        keys = self.roles.attendable_counts().clamp_min(1).to(self.entropy.dtype)  # [B, Q]
        return torch.log(keys)[:, None, None, :].expand(self.entropy.shape)


#: The per-query key sets whose masses :class:`RowSummary` holds, in this order.
KEY_SETS = ("same_word", "other_sentence", "word_pieces")


@dataclass(frozen=True)
class KeySetPairs:
    """The ``(query, key)`` pairs of the per-query key sets of a batch (:data:`KEY_SETS`): same word
    (equal token text or word), other sentence (equal token text, other segment), word pieces (same
    word, another token); listed without a ``[B, Q, K]`` map, ordered by query position (then set,
    segment, key), so the pairs of a block of query rows are one slice.

    sets, batch, query, key: [M] int64 each. queries: [S, B, Q] bool, the queries with at least one key
    in each set. query_starts: [Q + 1] where each query position's pairs start (a host list, found once
    per batch, so a block of rows is sliced without a device-to-host transfer, layer after layer).
    """

    sets: torch.Tensor
    batch: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    queries: torch.Tensor
    query_starts: list[int]

    @classmethod
    def of(cls, roles: TokenRoles) -> KeySetPairs:
        batch, width = roles.valid.shape
        text, word = _equal_id_pairs(roles.text), _equal_id_pairs(roles.word)
        codes, is_text, is_word = _union(text, word, width)
        b, rest = codes.div(width * width, rounding_mode="floor"), codes % (width * width)
        q, k = rest.div(width, rounding_mode="floor"), rest % width
        members = [
            torch.ones_like(is_text),
            is_text & (roles.segment[b, q] != roles.segment[b, k]),
            is_word & (q != k),
        ]
        sets = torch.cat([torch.full_like(b[kept], index) for index, kept in enumerate(members)])
        b, q, k = (torch.cat([values[kept] for kept in members]) for values in (b, q, k))
        order = torch.argsort(((q * len(KEY_SETS) + sets) * batch + b) * width + k)
        sets, b, q, k = sets[order], b[order], q[order], k[order]
        queries = torch.zeros(len(KEY_SETS), batch, width, dtype=torch.bool, device=roles.valid.device)
        queries[sets, b, q] = True
        starts = torch.searchsorted(q, torch.arange(width + 1, device=q.device)).tolist()
        return cls(sets, b, q, k, queries, starts)

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pairs of queries ``start..stop - 1``: ``(b, q - start, k, row)``, each [m] int64, with
        ``row = (set * B + b) * (stop - start) + q - start`` the pair's row among the block's
        ``S * B * (stop - start)`` query rows."""
        first, last = self.query_starts[start], self.query_starts[stop]
        b, q, k = self.batch[first:last], self.query[first:last] - start, self.key[first:last]
        return b, q, k, (self.sets[first:last] * self.queries.shape[1] + b) * (stop - start) + q


def _equal_id_pairs(ids: torch.Tensor) -> torch.Tensor:
    """``[M]`` int64 codes ``(b * N + q) * N + k`` of the pairs of tokens of one segment with the same
    id, not -1 (``ids``: [B, N]); the work and memory grow with the pairs, not with ``N²``."""
    width = ids.shape[1]
    b, position = (ids >= 0).nonzero(as_tuple=True)
    group_key = b * (int(ids.max()) + 1 if ids.numel() else 1) + ids[b, position]
    order = torch.argsort(group_key, stable=True)
    b, position = b[order], position[order]
    _, sizes = torch.unique_consecutive(group_key[order], return_counts=True)
    starts = sizes.cumsum(0) - sizes
    group = torch.repeat_interleave(torch.arange(len(sizes), device=ids.device), sizes)
    partners = sizes[group]  # each token pairs with every token of its group, itself included
    first = torch.repeat_interleave(torch.arange(len(b), device=ids.device), partners)
    offset = torch.arange(len(first), device=ids.device) - torch.repeat_interleave(
        partners.cumsum(0) - partners, partners
    )
    second = torch.repeat_interleave(starts[group], partners) + offset
    return (b[first] * width + position[first]) * width + position[second]


def _union(
    first: torch.Tensor, second: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sorted union of two sets of pair codes, and for each code whether it is in ``first`` and in
    ``second``."""
    codes = torch.unique(torch.cat([first, second]))
    return codes, torch.isin(codes, first), torch.isin(codes, second)


def _diagonal(probs: torch.Tensor, offset: int) -> torch.Tensor:
    """``[..., R]``: ``probs[..., i, i + offset]`` of a ``[..., R, N]`` block, 0 where that key is outside
    the block's columns (the previous token of row 0, the next of the last)."""
    values = torch.diagonal(probs, offset, -2, -1)
    before = min(max(0, -offset), probs.shape[-2])
    return pad(values, (before, probs.shape[-2] - before - values.shape[-1]))


class RowSummarizer:
    """Builds a :class:`RowSummary` from one batch's attention, one layer at a time.

    Feed it each layer's probs ``[B, H, N, N]`` in layer order with :meth:`add_layer` (e.g. straight from
    the attention function while streaming, so no layer is kept), or each layer's rows in consecutive
    blocks ``[B, H, R, N]`` with :meth:`add_rows` (long inputs, whose rows are computed chunk by chunk
    from queries and keys: the memory is then one block's, never ``N²``); every pass over a block happens
    while it is in cache, into one reused scratch buffer. The masses on per-query key sets (same word,
    other sentence, word pieces) are gathered from their few ``(q, k)`` pairs (:class:`KeySetPairs`)
    instead of a pass over the rows.

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
        #: The summaries of the current layer's blocks of rows so far (:meth:`add_rows`).
        self.blocks: list[dict[str, torch.Tensor]] = []
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
        #: [B, 1, Q, 1] float: ε / (the number of keys the query may attend to).
        counts = roles.attendable_counts()
        self.uniform_share = (self.smoothing / counts.clamp_min(1).float())[:, None, :, None]
        self.pairs = KeySetPairs.of(roles)

    def add_layer(self, probs: torch.Tensor) -> None:
        """Summarise one layer: ``probs`` [B, H, N, N], rows summing to 1 over the real keys."""
        self.add_rows(probs, 0)

    def add_rows(self, probs: torch.Tensor, start: int) -> None:
        """Summarise query rows ``start..start + R - 1`` of the next layer: ``probs`` [B, H, R, N]. A
        layer's blocks come in order, from row 0; the layer is complete with its last row."""
        probs = probs.float()
        batch, heads, size, width = probs.shape
        if not self.layers and not self.blocks:
            self._prepare(width, probs.device)
        elements = probs.numel()
        if self.scratch is None or self.scratch.numel() < elements or self.scratch.device != probs.device:
            self.scratch = torch.empty(elements, device=probs.device)
        scratch = self.scratch[:elements].view(probs.shape)
        rows = probs.reshape(batch, heads * size, width)
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
            "previous": _diagonal(probs, start - 1),
            "next": _diagonal(probs, start + 1),
            "current": _diagonal(probs, start),
            "first": probs[..., 0],
            "cls": masses[..., 0],
            "sep": masses[..., 1],
            "punct": masses[..., 2],
            "entropy": entropy,
            "maximum": probs.amax(-1),
            "non_sep_maximum": torch.maximum(non_delimiter_maximum, cls_maximum),
            "non_delimiter_maximum": non_delimiter_maximum,
        }
        stop = start + size
        if self.smoothing:
            smoothed = torch.mul(probs, 1.0 - self.smoothing, out=scratch)
            smoothed.add_(self.uniform_share[:, :, start:stop])
            # keys the query may not see (padding; causal: later ones) get 0, and 0 ln 0 = 0
            smoothed.mul_(self.roles.attendable_rows(start, stop)[:, None])
            quantities["smoothed_entropy"] = -smoothed.xlogy_(smoothed).sum(-1)
        b, q, k, row = self.pairs.rows(start, stop)
        masses_by_set = probs.new_zeros(len(KEY_SETS) * batch * size, heads).index_add_(
            0, row, probs[b, :, q, k]
        )
        for name, mass in zip(KEY_SETS, masses_by_set.view(-1, batch, size, heads), strict=True):
            quantities[name] = mass.transpose(1, 2)
        self.blocks.append(quantities)
        if stop == width:
            blocks, self.blocks = self.blocks, []
            if len(blocks) > 1:
                quantities = {name: torch.cat([block[name] for block in blocks], -1) for name in quantities}
            self.layers.append(quantities)

    def result(self) -> RowSummary:
        """The summary of the layers added so far (each quantity stacked to [B, L, H, Q])."""
        if not self.layers:
            raise BertologyError("No attention layer was summarised; run the model on the batch first.")
        stacked = {name: torch.stack([layer[name] for layer in self.layers], 1) for name in self.layers[0]}
        return RowSummary(
            roles=self.roles,
            **stacked,
            same_word_queries=self.pairs.queries[0],
            other_sentence_queries=self.pairs.queries[1],
            word_piece_queries=self.pairs.queries[2],
        )
