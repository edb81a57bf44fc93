"""What the server computes for one input, by the library's own functions (as the CLI uses them).

Each function takes a loaded model and a request and returns the answer; each first checks the
input's token count against the server's limit, so no input is ever silently truncated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bertology.analysis.patterns import PATTERN_DESCRIPTIONS, PatternAccumulator
from bertology.attention.capturing import capture, capture_batch
from bertology.attention.long_capture import LongAttention
from bertology.models.loading import LoadedModel
from bertology.server.errors import RequestError
from bertology.server.schemas import AttentionRequest, InputRequest, ViewRequest
from bertology.stats.rows import SpecialTokens
from bertology.stats.surface import CAUSAL_ONLY, SURFACE_DESCRIPTIONS, SurfaceAccumulator
from bertology.views import render_view
from bertology.views.bertviz import prettify

#: Decimal places of the probabilities in ``/api/attention`` answers (absolute error <= 5e-7).
ATTENTION_DECIMALS = 6


def check_length(loaded: LoadedModel, request: InputRequest, max_tokens: int) -> int:
    """The input's token count (special tokens included); 422 when it exceeds ``max_tokens`` or the
    model's own limit."""
    count = len(loaded.tokenizer(request.text, request.text_b, verbose=False)["input_ids"])
    limit = min(max_tokens, loaded.max_length)
    if count > limit:
        raise RequestError(
            422, f"The input has {count} tokens; at most {limit} are accepted per input with '{loaded.name}'."
        )
    return count


def _check_index(name: str, value: int | None, count: int) -> None:
    if value is not None and value >= count:
        raise RequestError(422, f"{name} {value} does not exist; there are {count} (0 to {count - 1}).")


def _span(name: str, span: list[int] | None, n: int) -> slice:
    """Tokens ``start .. stop - 1`` of ``n`` (default: all); 422 for a span outside the input or empty."""
    if span is None:
        return slice(0, n)
    start, stop = span
    if not 0 <= start < stop <= n:
        raise RequestError(422, f"{name} [{start}, {stop}] is not a span of the input's {n} tokens.")
    return slice(start, stop)


def attention_answer(
    loaded: LoadedModel, request: AttentionRequest, *, max_tokens: int, max_values: int
) -> dict[str, Any]:
    """Tokens, segments and ``attention[layer][head][query][key]`` for the asked layers, heads, rows and
    keys; a long input's (:class:`~bertology.attention.long_capture.LongAttention`) block computed from its
    queries and keys."""
    n = check_length(loaded, request, max_tokens)
    _check_index("Layer", request.layer, loaded.num_layers)
    _check_index("Head", request.head, loaded.num_heads)
    layers = list(range(loaded.num_layers)) if request.layer is None else [request.layer]
    heads = list(range(loaded.num_heads)) if request.head is None else [request.head]
    rows, keys = _span("rows", request.rows, n), _span("keys", request.keys, n)
    height, width = rows.stop - rows.start, keys.stop - keys.start
    values = len(layers) * len(heads) * height * width
    if values > max_values:
        raise RequestError(
            422,
            f"That is {values} attention values ({len(layers)} layers x {len(heads)} heads x {height} x "
            f"{width} tokens); one answer carries at most {max_values}: ask for one layer or one head, or "
            "a block of rows and keys.",
        )
    attention = capture(request.text, request.text_b, model=loaded, weights=request.weights)
    if isinstance(attention, LongAttention):
        chosen = np.stack([attention.block(layer, rows, keys, heads) for layer in layers])
    else:
        chosen = attention.probs[np.ix_(layers, heads)][:, :, rows, keys]
    return {
        "model": loaded.name,
        "tokens": attention.tokens,
        "segments": attention.segment_ids.tolist(),
        "layers": layers,
        "heads": heads,
        "rows": [rows.start, rows.stop],
        "keys": [keys.start, keys.stop],
        "attention": np.round(chosen.astype(np.float64), ATTENTION_DECIMALS).tolist(),
    }


def statistics_answer(loaded: LoadedModel, request: InputRequest, *, max_tokens: int) -> dict[str, Any]:
    """The corpus statistics of :mod:`bertology.stats.surface` and the pattern scores and labels of
    :mod:`bertology.analysis.patterns`, over this one input (a corpus of one segment)."""
    check_length(loaded, request, max_tokens)
    batch = capture_batch(
        [request.text],
        None if request.text_b is None else [request.text_b],
        model=loaded,
        weights=request.weights,
    )
    special = SpecialTokens.of(loaded)
    surface, patterns = SurfaceAccumulator(special), PatternAccumulator(special)
    surface.update(batch)
    patterns.update(batch)
    scores = patterns.result()
    return {
        "model": loaded.name,
        "tokens": [prettify(token) for token in batch.encoded.tokens[0]],
        "segments": batch.encoded.segment_ids[0].tolist(),
        "layers": loaded.num_layers,
        "heads": loaded.num_heads,
        "surface": {  # only the statistics this model defines (no attention sink for an encoder)
            name: values
            for name, values in surface.result().to_dict()["columns"].items()
            if loaded.kind == "decoder" or name not in CAUSAL_ONLY
        },
        "patterns": scores.scores.to_dict()["columns"],
        "labels": scores.labels.tolist(),
        "descriptions": {
            "surface": {
                name: text
                for name, text in SURFACE_DESCRIPTIONS.items()
                if loaded.kind == "decoder" or name not in CAUSAL_ONLY
            },
            "patterns": {
                name: f"score of the label {name} ({text})" for name, text in PATTERN_DESCRIPTIONS.items()
            },
            "labels": {"label": "each head's primary pattern label, or none"},
        },
    }


def view_page(loaded: LoadedModel, request: ViewRequest, *, max_tokens: int) -> str:
    """The head, model or neuron view page, exactly as ``bertology view`` writes it."""
    check_length(loaded, request, max_tokens)
    view = render_view(
        request.text,
        request.text_b,
        kind=request.view,
        model=loaded,
        layer=request.layer,
        head=request.head,
        query=request.query,
        theme=request.theme,
        weights=request.weights,
    )
    return view.html
