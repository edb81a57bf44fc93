"""Synthetic view data for the browser tests: the dicts ``render_page`` takes, built with numpy alone.

The attention heads follow simple, recognisable patterns (previous token, next token, self, first
token, last token, local window, broad) plus seeded noise, so each layer looks different and a test can
tell one picture from another without loading a model. One token is hostile markup, to prove that the
page shows token text as text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertology.views.payload import pack_attention, pack_float16

HOSTILE_TOKEN = "</script><img src=x onerror=alert(1)>"
WORDS = ("the", "cat", "sat", "on", "a", "warm", "mat", "while", "dogs", "bark", "at", "night", ".")
PATTERNS = ("previous", "next", "self", "first", "last", "local", "broad")


def synthetic_tokens(n: int, *, pair: bool = False, hostile: bool = True) -> tuple[list[str], list[int]]:
    """``n`` BERT-style tokens ``[CLS] ... [SEP] (... [SEP])`` and their segment ids (0 = A, 1 = B).

    With ``hostile`` the third token is :data:`HOSTILE_TOKEN` (needs ``n >= 4``)."""
    if n < 4:
        raise ValueError("need at least 4 tokens")
    tokens = ["[CLS]"] + [WORDS[i % len(WORDS)] for i in range(n - 2)] + ["[SEP]"]
    segments = [0] * n
    if pair:
        middle = n // 2
        tokens[middle] = "[SEP]"
        segments[middle + 1 :] = [1] * (n - middle - 1)
    if hostile:
        tokens[2] = HOSTILE_TOKEN
    return tokens, segments


def _pattern_logits(pattern: str, n: int, strength: float = 6.0) -> np.ndarray:
    query = np.arange(n)[:, None]
    key = np.arange(n)[None, :]
    targets = {
        "previous": key == np.maximum(query - 1, 0),
        "next": key == np.minimum(query + 1, n - 1),
        "self": key == query,
        "first": np.broadcast_to(key == 0, (n, n)),
        "last": np.broadcast_to(key == n - 1, (n, n)),
    }
    if pattern in targets:
        return strength * targets[pattern].astype(np.float32)
    if pattern == "local":
        return (-np.abs(query - key) / 1.5).astype(np.float32)
    return np.zeros((n, n), dtype=np.float32)


def synthetic_attention(layers: int, heads: int, n: int, *, seed: int = 0) -> np.ndarray:
    """Attention probabilities ``[layers, heads, n, n]`` (float32, rows sum to 1)."""
    rng = np.random.default_rng(seed)
    probs = np.empty((layers, heads, n, n), dtype=np.float32)
    for layer in range(layers):
        for head in range(heads):
            pattern = PATTERNS[int(rng.integers(len(PATTERNS)))]
            logits = _pattern_logits(pattern, n) + rng.standard_normal((n, n), dtype=np.float32)
            logits -= logits.max(axis=1, keepdims=True)
            weights = np.exp(logits)
            probs[layer, head] = weights / weights.sum(axis=1, keepdims=True)
    return probs


def synthetic_view(
    view: str,
    *,
    n: int = 24,
    layers: int = 3,
    heads: int = 4,
    pair: bool = False,
    theme: str = "light",
    head_dim: int = 16,
    seed: int = 0,
    hostile: bool = True,
) -> dict[str, Any]:
    """A complete view dict for ``view`` in {"head", "model", "neuron"} (see ``static/views.js``)."""
    tokens, segments = synthetic_tokens(n, pair=pair, hostile=hostile)
    data: dict[str, Any] = {
        "view": view,
        "model": "synthetic-bert",
        "tokens": tokens,
        "segments": segments,
        "pair": pair,
        "layers": layers,
        "heads": heads,
        "n": n,
        "layer": 0,
        "head": 0,
        "query": min(3, n - 1),
        "theme": theme,
    }
    if view in ("head", "model"):
        data["attention"] = pack_attention(synthetic_attention(layers, heads, n, seed=seed))
    elif view == "neuron":
        rng = np.random.default_rng(seed)
        shape = (layers, heads, n, head_dim)
        data["queries"] = pack_float16(rng.standard_normal(shape, dtype=np.float32))
        data["keys"] = pack_float16(rng.standard_normal(shape, dtype=np.float32))
        data["scaling"] = [1.0 / float(np.sqrt(head_dim))] * layers
    else:
        raise ValueError(f"unknown view {view!r}")
    return data
