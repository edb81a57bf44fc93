"""Attention of long inputs from queries and keys: captured in memory linear in the tokens, its rows
computed exactly, in bounded chunks, where a view or a statistic needs them.

A head's attention is ``softmax(q·k * scaling + mask)`` over the keys each query may see. For ``n``
tokens the probabilities of ``L`` layers x ``H`` heads take ``L * H * n²`` floats (71 GB in float32 for
a ModernBERT-base of 22 x 12 heads at 8,192 tokens); its queries and keys take ``2 * L * H * n * d``
(1.1 GB at ``d = 64``, half that in float16). So a long input is captured by queries and keys: the
forward pass runs PyTorch's fused attention (transformers' ``sdpa`` function, which never forms the
``n x n`` probabilities), and :class:`QueryKeyRecording`, the recording's
:class:`~bertology.models.hook.AttentionOverride`, keeps per layer what the attention function received: the
queries and keys after any rotary embedding (grouped-query attention: each key/value head once), the
scaling, and the rule of the layer's mask (:class:`MaskRule`: the index function and padding that
transformers builds every mask from, full, causal or sliding-window alike).
:class:`LayerQueriesKeys` then computes any block of rows exactly, for any head, in float32.

Only models whose attention is exactly ``softmax(q·k * scaling + mask)`` in transformers'
``AttentionInterface`` take this path (:func:`long_input_refusal`): not those that compute attention in
their own code (DeBERTa and MPNet add relative-position terms, and their own limit is 512 tokens
anyway), nor those that cap their scores (Gemma 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import and_masks, padding_mask_function, sdpa_mask

from bertology.corpus.encoding import EncodedBatch, InputDescription
from bertology.errors import BertologyError
from bertology.models.model_types import ModelType

#: ``capture(mode="auto")`` and ``analyze_corpus`` use queries and keys for inputs longer than this many
#: tokens (the probabilities of BERT-base at 1,024 tokens take 600 MB, ModernBERT-base's 1.1 GB).
LONG_INPUT_TOKENS = 1024

#: Default memory bound of one chunk of computed rows: the float32 probabilities ``[batch, heads, rows,
#: keys]`` of one chunk (64 MiB: 170 rows of 12 heads at 8,192 tokens).
CHUNK_BYTES = 64 * 2**20


def long_input_refusal(entry: ModelType, config: PretrainedConfig, label: str) -> str | None:
    """Why this model's attention cannot be recomputed from its queries and keys (a sentence), or ``None``
    where ``softmax(q·k * scaling + mask)`` in the ``AttentionInterface`` is all of it."""
    if entry.kind == "encoder-decoder":
        return f"Long inputs are captured for encoder and decoder models; '{label}' is an encoder-decoder."
    if entry.route == "module":
        reason = entry.no_neuron_view or "computes its attention in its own code, not through transformers'"
        limit = getattr(config, "max_position_embeddings", None)
        return f"'{label}' cannot be captured by queries and keys for long inputs: {entry.name} {reason}" + (
            f" (its own limit is {limit} tokens)." if limit else "."
        )
    if entry.no_neuron_view or getattr(config, "attn_logit_softcapping", None):
        reason = entry.no_neuron_view or "caps its attention scores with tanh"
        return f"'{label}' cannot be captured by queries and keys for long inputs: {entry.name} {reason}."
    return None


@dataclass(frozen=True)
class MaskRule:
    """Which keys each query of one kind of layer sees, as transformers describes its mask: an index
    function ``mask_function(batch, head, query, key) -> bool`` (bidirectional, causal, sliding window,
    ...) and the padding of the batch.

    padding: [B, K] bool, True for real tokens, or ``None``. q_offset, kv_offset: positions of the first
    query and key (0 without a cache).
    """

    mask_function: Callable[..., torch.Tensor]
    padding: torch.Tensor | None
    q_offset: int = 0
    kv_offset: int = 0

    def visible(self, batch: torch.Tensor, rows: torch.Tensor, keys: int) -> torch.Tensor:
        """``[len(batch), 1, len(rows), keys]`` bool: whether query ``rows[i]`` of input ``batch[b]`` (its
        index in the captured batch) sees key ``k``; computed for these rows only, by broadcasting the
        index function as transformers' own masks are built."""
        function = self.mask_function
        if self.padding is not None:
            function = and_masks(function, padding_mask_function(self.padding))
        else:
            function = and_masks(function)
        device = rows.device
        allowed = function(
            batch.to(device)[:, None, None, None],
            torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device),
            (rows + self.q_offset)[None, None, :, None],
            (torch.arange(keys, device=device) + self.kv_offset)[None, None, None, :],
        )
        return allowed.expand(len(batch), 1, len(rows), keys)


def _probabilities(
    query: torch.Tensor, key: torch.Tensor, scaling: float, visible: torch.Tensor | None
) -> torch.Tensor:
    """``softmax(q·k * scaling + mask)`` in float32: query [B, H, R, D], key [B, G, K, D] (query head ``h``
    uses key/value head ``h // (H / G)``, as transformers' ``repeat_kv``), visible [B, 1, R, K] bool or
    ``None`` (every key). Returns [B, H, R, K]; a hidden key gets exactly 0."""
    groups, heads = key.shape[1], query.shape[1]
    grouped = query.float().unflatten(1, (groups, heads // groups))  # [B, G, H/G, R, D]
    scores = torch.matmul(grouped, key.float().unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
    scores.mul_(scaling)
    if visible is not None:
        scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1, out=scores)


@dataclass(frozen=True)
class LayerQueriesKeys:
    """One layer's queries and keys of a padded batch (or of one input of it), and its mask rule.

    query: [B, H, N, D]; key: [B, G, N, D] (``G`` key/value heads; query head ``h`` uses
    ``h // (H / G)``); both in the dtype they were kept in. scaling: the factor on q·k. rule: the layer's
    :class:`MaskRule`, or ``None`` where every key is visible (no padding, no window). batch: [B] int64,
    each input's index in the rule's batch (its place in the captured batch).
    """

    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    rule: MaskRule | None
    batch: torch.Tensor

    @property
    def num_heads(self) -> int:
        return self.query.shape[1]

    @property
    def width(self) -> int:
        """N, the keys (= queries) per input."""
        return self.key.shape[2]

    def visible(self, rows: torch.Tensor) -> torch.Tensor | None:
        """[B, 1, len(rows), N] bool: the keys each of these query rows sees (``None``: all of them)."""
        return None if self.rule is None else self.rule.visible(self.batch, rows, self.width)

    def rows_of(self, start: int, stop: int, heads: slice | list[int] | None = None) -> torch.Tensor:
        """[B, h, stop - start, N] float32: the probabilities of query rows ``start..stop - 1`` of
        ``heads`` (default: all), each row over all N keys (summing to 1 over the visible ones)."""
        rows = torch.arange(start, stop, device=self.query.device)
        query = self.query[:, :, start:stop]
        key = self.key
        if heads is not None:
            chosen = torch.arange(self.num_heads)[heads]
            query = query[:, chosen]
            groups = chosen // (self.num_heads // self.key.shape[1])
            key = self.key[:, groups]
        return _probabilities(query, key, self.scaling, self.visible(rows))

    def rows_per_chunk(self, chunk_bytes: int, heads: int | None = None) -> int:
        """How many query rows of every input and ``heads`` heads (default: all) fit in ``chunk_bytes``
        of float32 probabilities (at least 1)."""
        row_bytes = 4 * self.query.shape[0] * (heads or self.num_heads) * self.width
        return max(1, chunk_bytes // row_bytes)

    def row_blocks(
        self, chunk_bytes: int = CHUNK_BYTES, heads: slice | list[int] | None = None
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, [B, h, R, N])`` blocks of consecutive query rows, in order, covering all N rows; each
        block's probabilities take at most ``chunk_bytes`` (or one row)."""
        count = None if heads is None else len(torch.arange(self.num_heads)[heads])
        step = self.rows_per_chunk(chunk_bytes, count)
        for start in range(0, self.width, step):
            yield start, self.rows_of(start, min(start + step, self.width), heads)

    def rows_at(
        self, batch: torch.Tensor, positions: torch.Tensor, chunk_bytes: int = CHUNK_BYTES
    ) -> torch.Tensor:
        """[M, H, N] float32: query row ``positions[i]`` of input ``batch[i]`` (indices into this object's
        B inputs), for every head; computed input by input, in chunks of at most ``chunk_bytes``."""
        out = torch.empty(len(positions), self.num_heads, self.width, device=self.query.device)
        step = self.rows_per_chunk(chunk_bytes) * self.query.shape[0]
        for index in range(self.query.shape[0]):
            (picked,) = (batch == index).nonzero(as_tuple=True)  # ``batch`` lives where the caller made it
            if len(picked) == 0:
                continue
            one = self.input(index)
            for part in picked.split(step):
                rows = positions[part].to(self.query.device)
                visible = one.visible(rows)
                query = one.query[:, :, rows]
                out[part.to(out.device)] = _probabilities(query, one.key, self.scaling, visible)[0].transpose(
                    0, 1
                )
        return out

    def input(self, index: int, length: int | None = None) -> LayerQueriesKeys:
        """Input ``index`` alone (B = 1), its first ``length`` tokens (default: all N)."""
        return LayerQueriesKeys(
            self.query[index : index + 1, :, :length],
            self.key[index : index + 1, :, :length],
            self.scaling,
            self.rule,
            self.batch[index : index + 1],
        )


class QueryKeyRecording:
    """The :class:`~bertology.models.hook.AttentionOverride` of a long-input capture: each attention call runs
    transformers' ``sdpa`` attention (PyTorch's fused kernel: no ``n x n`` probabilities) and hands
    ``consume`` the layer's :class:`LayerQueriesKeys`; each mask is sdpa's boolean mask, remembered with
    the :class:`MaskRule` it was built from.

    dtype: keep queries and keys in this dtype (default: the model's, as the attention function gets them;
    ``torch.float16`` halves their memory).

    Raises (from :meth:`mask`):
        BertologyError: a mask with custom parts (``use_vmap``, e.g. image tokens), which rows cannot be
            recomputed from.
    """

    def __init__(self, consume: Callable[[LayerQueriesKeys], None], dtype: torch.dtype | None = None) -> None:
        self.consume = consume
        self.dtype = dtype
        self.masks: list[tuple[torch.Tensor | None, MaskRule | None]] = []

    def mask(self, **kwargs: Any) -> torch.Tensor | None:
        """sdpa's boolean mask (``None`` where every key is visible); causal masks are always built, so
        ``None`` never stands for "causal"."""
        if kwargs.get("use_vmap"):
            raise BertologyError(
                "This model's attention mask has custom parts, so long inputs cannot be captured by queries "
                "and keys; use a shorter input."
            )
        mask = sdpa_mask(**{**kwargs, "allow_is_causal_skip": False})
        rule = None
        if mask is not None:
            padding = kwargs.get("attention_mask")
            rule = MaskRule(
                kwargs["mask_function"],
                None if padding is None else padding.bool(),
                int(kwargs.get("q_offset", 0)),
                int(kwargs.get("kv_offset", 0)),
            )
        self.masks.append((mask, rule))
        return mask

    def _rule(self, attention_mask: torch.Tensor | None) -> MaskRule | None:
        for mask, rule in self.masks:
            if mask is attention_mask:
                return rule
        raise BertologyError(
            "A layer of this model was given an attention mask not built through transformers' mask "
            "functions, so long inputs cannot be captured by queries and keys."
        )

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        scaling: float,
        dropout: float,
        last: bool,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """sdpa attention for the forward pass (none for the ``last`` call, whose output nothing reads);
        the layer's queries and keys to ``consume``."""
        rule = self._rule(attention_mask)
        if last:
            output = query.transpose(1, 2)  # [batch, tokens, heads, head_dim], never read
        else:
            output, _ = sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        dtype = self.dtype or query.dtype
        batch = torch.arange(query.shape[0], device=query.device)
        self.consume(
            LayerQueriesKeys(
                query.detach().to(dtype).contiguous(),
                key.detach().to(dtype).contiguous(),
                scaling,
                rule,
                batch,
            )
        )
        return output, None


def pool_bins(n: int, size: int) -> torch.Tensor:
    """[n] int64: the cell of each of ``n`` tokens among ``size`` cells, cell ``p`` covering tokens
    ``floor(p n / size) ..`` (as the model view's ``poolBins``)."""
    starts = torch.div(torch.arange(size) * n, size, rounding_mode="floor")
    return torch.searchsorted(starts, torch.arange(n), right=True) - 1


def pool_rows(into: torch.Tensor, start: int, block: torch.Tensor, bins: torch.Tensor) -> None:
    """Max-pool ``block`` ([h, R, n], query rows ``start..start + R - 1``) into ``into`` ([h, s, s], cells of
    :func:`pool_bins` ``bins``), in place, where the block is (``into`` and ``bins`` on its device: only the
    pooled cells need travel to the host)."""
    cells = into.shape[-1]
    keys = torch.zeros(*block.shape[:2], cells, dtype=block.dtype, device=block.device).scatter_reduce_(
        -1, bins.expand(*block.shape[:2], len(bins)), block, "amax"
    )  # [h, R, s]: each row's largest weight per cell of keys
    row_bins = bins[start : start + block.shape[1]]
    into.scatter_reduce_(1, row_bins[None, :, None].expand_as(keys), keys, "amax")


@dataclass(frozen=True)
class LongAttention(InputDescription):
    """The attention of one long input, kept as its queries and keys (padding removed); the same
    description of the input as :class:`~bertology.attention.capturing.Attention` (its
    :class:`~bertology.corpus.encoding.InputDescription`: tokens, segment ids, words, ...), with probabilities
    computed on demand.

    layers: per layer, its :class:`LayerQueriesKeys` for this input (B = 1, n tokens).
    chunk_bytes: the memory bound of one chunk of computed rows (float32 ``[heads, rows, n]``).
    """

    layers: list[LayerQueriesKeys]
    chunk_bytes: int = CHUNK_BYTES
    weights: str = field(default="attention", init=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_heads(self) -> int:
        return self.layers[0].num_heads

    @property
    def head_dim(self) -> int:
        return self.layers[0].query.shape[-1]

    @property
    def scaling(self) -> np.ndarray:
        """[layers] the factor applied to q·k before the mask and softmax."""
        return np.array([layer.scaling for layer in self.layers])

    def row_chunks(
        self, layer: int, heads: slice | list[int] | None = None
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, [h, R, n])`` float32 torch blocks of consecutive query rows of ``layer``, in order,
        each at most :attr:`chunk_bytes`."""
        for start, block in self.layers[layer].row_blocks(self.chunk_bytes, heads):
            yield start, block[0]

    def block(
        self,
        layer: int,
        rows: slice = slice(None),
        keys: slice = slice(None),
        heads: slice | list[int] | None = None,
    ) -> np.ndarray:
        """[h, R, K] float32: the attention of query ``rows`` to ``keys`` in ``heads`` of ``layer``
        (row = attending token), each row's softmax taken over all n keys; computed in chunks of at most
        :attr:`chunk_bytes`, so the memory is the result's plus one chunk."""
        qk = self.layers[layer]
        start, stop, _ = rows.indices(len(self.tokens))
        count = len(torch.arange(self.num_heads)[heads]) if heads is not None else self.num_heads
        step = qk.rows_per_chunk(self.chunk_bytes, count)
        parts = [
            qk.rows_of(first, min(first + step, stop), heads)[0, :, :, keys].cpu().numpy()
            for first in range(start, stop, step)
        ]
        width = len(range(*keys.indices(len(self.tokens))))
        return np.concatenate(parts, axis=1) if parts else np.zeros((count, 0, width), dtype=np.float32)

    def thumbnails(self, size: int, layers: list[int] | None = None) -> np.ndarray:
        """[layers, heads, s, s] float32, ``s = min(size, n)``: each head's attention max-pooled into
        ``s x s`` cells (cell ``p`` covers tokens ``floor(p n / s) .. floor((p + 1) n / s) - 1``, as the
        model view pools), computed chunk by chunk; ``layers``: only these (default: all)."""
        n = len(self.tokens)
        cells = min(size, n)
        device = self.layers[0].query.device  # pooled where the rows are computed, brought over once
        bins = pool_bins(n, cells).to(device)
        chosen = list(range(self.num_layers)) if layers is None else layers
        pooled = torch.zeros(len(chosen), self.num_heads, cells, cells, device=device)
        for into, layer in zip(pooled, chosen, strict=True):
            for start, block in self.row_chunks(layer):
                pool_rows(into, start, block, bins)
        return pooled.cpu().numpy()

    def query_vectors(self, layer: int, head: int) -> np.ndarray:
        """[n, head_dim] float32: the head's queries (after any rotary embedding, before scaling)."""
        return self.layers[layer].query[0, head].float().cpu().numpy()

    def key_vectors(self, layer: int, head: int) -> np.ndarray:
        """[n, head_dim] float32: the keys the head attends with (its key/value group's)."""
        qk = self.layers[layer]
        return qk.key[0, head // (qk.num_heads // qk.key.shape[1])].float().cpu().numpy()

    def visible(self, layer: int, rows: slice = slice(None)) -> np.ndarray:
        """[R, n] bool: the keys each query row of ``layer`` sees (causal attention, a sliding window)."""
        qk = self.layers[layer]
        positions = torch.arange(len(self.tokens), device=qk.query.device)[rows]
        visible = qk.visible(positions)
        return (
            np.ones((len(positions), qk.width), dtype=bool)
            if visible is None
            else visible[0, 0].cpu().numpy()
        )


@dataclass
class LongAttentionBatch:
    """The queries and keys of a padded batch of long inputs (see :class:`LongAttention`).

    layers: per layer, its :class:`LayerQueriesKeys` ([B, H, N, D] queries, [B, G, N, D] keys).
    encoded: tokens, segments and word alignment of every input. chunk_bytes: see :class:`LongAttention`.
    """

    layers: list[LayerQueriesKeys]
    encoded: EncodedBatch
    model_name: str
    chunk_bytes: int = CHUNK_BYTES

    @property
    def lengths(self) -> np.ndarray:
        return self.encoded.lengths

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> LongAttention:
        n = int(self.lengths[index])
        return LongAttention.of_input(
            self.encoded,
            index,
            self.model_name,
            layers=[layer.input(index, n) for layer in self.layers],
            chunk_bytes=self.chunk_bytes,
        )

    def __iter__(self) -> Iterator[LongAttention]:
        return (self[index] for index in range(len(self)))
