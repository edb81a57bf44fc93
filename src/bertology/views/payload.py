"""Compact, safe encoding of view data for a self-contained HTML page.

Arrays travel once, as base64 of zlib-deflated bytes; the page inflates them with the browser's
``DecompressionStream("deflate")``. Deflate level 1 is the default: at 512 tokens and 12 x 12 heads,
level 6 took 7x longer (3.4 s against 0.49 s) for a page about half the size (benchmarks/RESULTS.md).
Attention probabilities are quantised to 8 bits (``round(p * 255)``, an absolute error of at most
1/510); query and key vectors go as float16, token indices as uint16.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import numpy as np

ATTENTION_SCALE = 255


def _pack(raw: bytes, dtype: str, shape: tuple[int, ...], level: int) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "shape": list(shape),
        "codec": "deflate-base64",
        "data": base64.b64encode(zlib.compress(raw, level)).decode("ascii"),
    }


def quantise_attention(probs: np.ndarray) -> np.ndarray:
    """Map probabilities in [0, 1] to uint8 codes ``round(p * 255)``; same shape as ``probs``."""
    return np.rint(np.clip(probs, 0.0, 1.0) * ATTENTION_SCALE).astype(np.uint8)


def pack_attention(probs: np.ndarray, level: int = 1) -> dict[str, Any]:
    """Encode ``probs: [layers, heads, n, n]`` (or any shape) as 8-bit codes, deflated, base64."""
    codes = quantise_attention(np.asarray(probs, dtype=np.float32))
    packed = _pack(codes.tobytes(), "uint8", codes.shape, level)
    packed["scale"] = ATTENTION_SCALE
    return packed


def pack_float16(values: np.ndarray, level: int = 1) -> dict[str, Any]:
    """Encode a float array (e.g. ``queries: [layers, heads, n, head_dim]``) as little-endian float16."""
    half = np.ascontiguousarray(values, dtype="<f2")
    return _pack(half.tobytes(), "float16", half.shape, level)


def pack_indices(indices: np.ndarray, level: int = 1) -> dict[str, Any]:
    """Encode token indices below 65,536 (e.g. each row's top-k keys) as little-endian uint16."""
    small = np.ascontiguousarray(indices, dtype="<u2")
    return _pack(small.tobytes(), "uint16", small.shape, level)


def unpack(packed: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`pack_attention` / :func:`pack_float16` / :func:`pack_indices` (attention comes
    back as uint8 codes)."""
    raw = zlib.decompress(base64.b64decode(packed["data"]))
    dtype = {"uint8": np.uint8, "float16": np.dtype("<f2"), "uint16": np.dtype("<u2")}[packed["dtype"]]
    return np.frombuffer(raw, dtype=dtype).reshape(packed["shape"])


def script_json(data: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` or line
    separators survive literally, so no token text can close the script element or open markup."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text
