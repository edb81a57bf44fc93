"""View data of a long input (:class:`~bertology.attention.long_capture.LongAttention`, queries and keys kept,
rows computed on demand): a page carries only what it can show, so its size does not grow with ``n²``.

- Head view: every layer of the whole input (the layer selector works as on short pages), as each
  row's ``k`` largest weights (``long.topIndices`` uint16 and ``long.topWeights`` 8-bit codes,
  ``[layers, heads, n, k]``; the weights left out are each below the k-th of their row; ``k`` is
  :data:`TOP_K`, fewer where every layer's would pass :data:`TOP_K_BYTES`, :func:`top_k_for`), and
  ``long.minimap [layers, heads, s, s]``, the attention max-pooled into ``s = min(MINIMAP_CELLS, n)``
  cells a side; both from one pass over each layer's rows (:func:`layer_summaries`). The page draws a
  window of ``long.stop - long.start`` tokens (:data:`WINDOW_TOKENS`; ``window`` chooses it, by default
  centred on ``query``), scrolls it and jumps where the minimap is clicked, and shows the window's
  attention to the tokens outside it as summed (top-k) mass per minimap region. ``long.tokens`` /
  ``long.segments`` describe all ``n`` tokens; ``tokens``, ``n`` the first window. In the web app the
  page asks its parent for the window's full-resolution rows of the shown layer (``POST
  /api/attention`` with ``rows`` and ``keys``) and draws them in place of the top-k.
- Model view: thumbnails of the whole input, ``long.thumbnails [layers, heads, s, s]`` (max-pooled as
  the minimap), and the window at full resolution for every layer and head, drawn when a head is
  enlarged: ``attention [layers, heads, W, W]``, the window's rows to the window's keys (each row's
  softmax taken over all ``n`` keys), and ``long.outside [layers, heads, W, 2]``, each row's summed mass
  to the keys before and after it.
- Neuron view: the chosen layer and head only (``layers = heads = 1``), queries and keys of all ``n``
  tokens in float16 (``2 * n * head_dim * 2`` bytes: 2 MiB at 8,192 tokens and ``head_dim = 64``), so
  any query token's softmax is computed over all the keys it sees; ``long.window: [before, after]``
  for a sliding-window layer (query ``i`` sees keys ``i - before .. i + after``).

Sizes at 8,192 tokens, 22 layers x 12 heads: the head view's top-3 of every layer 19.5 MB before
deflate, its minimaps 4.3 MB; the model view's window, W = 256, 17 MB, its thumbnails 4.3 MB
(benchmarks/RESULTS.md, "Long inputs").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from bertology.attention.long_capture import LongAttention, pool_bins, pool_rows
from bertology.errors import BertologyError
from bertology.options import Theme, ViewKind
from bertology.views.build import model_caption, opening_query
from bertology.views.payload import pack_attention, pack_float16, pack_indices

#: Tokens of a long input's head and model view (its window), by default.
WINDOW_TOKENS = 256
#: Cells per side of the head view's minimap of the whole input.
MINIMAP_CELLS = 128
#: Weights per row the head view's page carries (each row's largest), at most.
TOP_K = 16
#: Bytes of every layer's top-k weights a head view's page carries at most (before deflate and base64):
#: ``3 * layers * heads * n * k`` (uint16 index, 8-bit code), so k shrinks for the longest inputs.
TOP_K_BYTES = 20 * 2**20


def _check(name: str, value: int, count: int, plural: str) -> None:
    if not 0 <= value < count:
        raise BertologyError(f"{name} {value} does not exist; there are {count} {plural} (0 to {count - 1}).")


def token_window(n: int, query: int, window: tuple[int, int] | None) -> tuple[int, int]:
    """``(start, stop)`` of the shown tokens: ``window`` (start, size) clipped to the input, or
    :data:`WINDOW_TOKENS` tokens centred on ``query``."""
    if window is None:
        size = min(WINDOW_TOKENS, n)
        start = min(max(query - size // 2, 0), n - size)
    else:
        start, size = window
        if size < 1:
            raise BertologyError(f"A window shows at least 1 token, not {size}.")
        _check("Window start", start, n, "tokens")
    return start, min(start + size, n)


def window_attention(attention: LongAttention, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """``([layers, heads, W, W], [layers, heads, W, 2])`` float32: rows ``start..stop - 1`` to the same
    keys, and each row's summed attention to the keys before ``start`` and from ``stop`` on."""
    inside, outside = [], []
    for layer in range(attention.num_layers):
        rows = attention.block(layer, slice(start, stop))  # [H, W, n]
        inside.append(rows[:, :, start:stop])
        outside.append(np.stack([rows[:, :, :start].sum(-1), rows[:, :, stop:].sum(-1)], axis=-1))
    return np.stack(inside), np.stack(outside)


def top_k_for(attention: LongAttention, k: int = TOP_K, budget: int = TOP_K_BYTES) -> int:
    """Weights per row the head view carries: ``k`` (at most ``n``), fewer where every layer's top-k
    (3 bytes a weight: a uint16 index and an 8-bit code) would exceed ``budget`` bytes; at least 1."""
    n = len(attention.tokens)
    fits = budget // (3 * attention.num_layers * attention.num_heads * n)
    return max(1, min(k, n, fits))


def layer_summaries(
    attention: LongAttention, k: int, cells: int = MINIMAP_CELLS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``([layers, heads, n, k] int64, [layers, heads, n, k] float32, [layers, heads, s, s] float32)``:
    each row's ``k`` largest weights (largest first) and their keys, and each head's attention
    max-pooled into ``s = min(cells, n)`` cells a side (as :meth:`LongAttention.thumbnails`); every
    layer's rows computed once, chunk by chunk, and reduced where they are (the model's device): a layer's
    top-k and every pooled cell travel to the host once, not the rows."""
    n, heads = len(attention.tokens), attention.num_heads
    shape = (attention.num_layers, heads, n, k)
    indices, weights = np.empty(shape, dtype=np.int64), np.empty(shape, dtype=np.float32)
    size = min(cells, n)
    device = attention.layers[0].query.device
    bins = pool_bins(n, size).to(device)
    pooled = torch.zeros(attention.num_layers, heads, size, size, device=device)
    for layer in range(attention.num_layers):
        top_weights = torch.empty(heads, n, k, device=device)
        top_keys = torch.empty(heads, n, k, dtype=torch.int64, device=device)
        for start, block in attention.row_chunks(layer):
            stop = start + block.shape[1]
            top = torch.topk(block, k, dim=-1)
            top_weights[:, start:stop], top_keys[:, start:stop] = top.values, top.indices
            pool_rows(pooled[layer], start, block, bins)
        weights[layer], indices[layer] = top_weights.cpu().numpy(), top_keys.cpu().numpy()
    return indices, weights, pooled.cpu().numpy()


def sliding_window(attention: LongAttention, layer: int) -> list[int] | None:
    """``[before, after]``: query ``i`` of ``layer`` sees keys ``i - before .. i + after`` (a sliding
    window, read from the middle row's mask), or ``None`` where every query sees every key."""
    n = len(attention.tokens)
    middle = n // 2
    (seen,) = np.nonzero(attention.visible(layer, slice(middle, middle + 1))[0])
    if len(seen) == n:
        return None
    if len(seen) != seen[-1] - seen[0] + 1:
        raise BertologyError(
            "The neuron view shows attention over all keys or a window of them, not this mask."
        )
    return [int(middle - seen[0]), int(seen[-1] - middle)]


def long_view_data(
    attention: LongAttention,
    kind: ViewKind,
    *,
    layer: int = 0,
    head: int = 0,
    query: int | None = None,
    theme: Theme = "light",
    head_names: Sequence[str] | None = None,
    window: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The page data of a long input's view (the module's description; the contract of
    the page's script, ``static/views/``, with a ``long`` entry ``{n, start, stop, tokens?}``)."""
    n = len(attention.tokens)
    layers, heads = attention.num_layers, attention.num_heads
    _check("Layer", layer, layers, "layers")
    _check("Head", head, heads, "heads")
    causal = bool(not attention.visible(layer, slice(0, 1))[0, 1:].any()) if n > 1 else False
    query = opening_query(query, n, causal and kind == "neuron")  # other views' windows start at the start
    _check("Query token", query, n, "tokens")
    if kind == "neuron":
        start, stop = 0, n
    else:
        start, stop = token_window(n, query, window)
    data: dict[str, Any] = {
        "view": kind,
        "model": attention.model_name,
        "tokens": attention.tokens[start:stop],
        "segments": attention.segment_ids[start:stop].tolist(),
        "pair": attention.is_pair,
        "layers": layers,
        "heads": heads,
        "n": stop - start,
        "layer": layer,
        "head": head,
        "query": min(max(query - start, 0), stop - start - 1),
        "theme": theme,
        "weights": attention.weights,
        "long": {"n": n, "start": start, "stop": stop},
        **model_caption(attention.model_name),
    }
    if head_names is not None:
        if isinstance(head_names, str) or len(head_names) != heads:
            raise BertologyError(f"Give one head name per head: {heads} names, not {len(head_names)}.")
        data["headNames"] = [str(name) for name in head_names]
    if causal:
        data["causal"] = True
    if kind == "neuron":
        qk = attention.layers[layer]
        data.update(
            layers=1,
            heads=1,
            layer=0,
            head=0,
            layerNames=[str(layer)],
            headNames=[data.get("headNames", [str(h) for h in range(heads)])[head]],
            queries=pack_float16(attention.query_vectors(layer, head)[None, None]),
            keys=pack_float16(attention.key_vectors(layer, head)[None, None]),
            scaling=[qk.scaling],
        )
        data["long"].update(layer=layer, head=head)
        if not causal:
            band = sliding_window(attention, layer)
            if band is not None:
                data["long"]["window"] = band
        return data
    if kind == "head":
        indices, weights, minimap = layer_summaries(attention, top_k_for(attention))
        data["long"].update(
            tokens=attention.tokens,
            segments=attention.segment_ids.tolist(),
            topIndices=pack_indices(indices),
            topWeights=pack_attention(weights),
            minimap=pack_attention(minimap),
        )
        return data
    inside, outside = window_attention(attention, start, stop)
    data["attention"] = pack_attention(inside)
    data["long"]["outside"] = pack_attention(outside)
    data["long"]["thumbnails"] = pack_attention(attention.thumbnails(MINIMAP_CELLS))
    return data
