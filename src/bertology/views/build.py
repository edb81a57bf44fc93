"""Turn a captured :class:`~bertology.attention.capturing.Attention` (or an encoder-decoder's
:class:`~bertology.attention.seq2seq.Seq2SeqAttention`) into the data a view page draws."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bertology.attention.capturing import Attention
from bertology.attention.seq2seq import AttentionSetName, Seq2SeqAttention
from bertology.errors import BertologyError
from bertology.models.model_store import model_note
from bertology.options import Theme, ViewKind
from bertology.views.payload import pack_attention, pack_float16

VIEW_KINDS: tuple[ViewKind, ...] = ("head", "model", "neuron")


def check_index(name: str, value: int, count: int, plural: str) -> None:
    if not 0 <= value < count:
        raise BertologyError(f"{name} {value} does not exist; there are {count} {plural} (0 to {count - 1}).")


def _head_names(names: Sequence[str], heads: int) -> list[str]:
    if isinstance(names, str) or len(names) != heads:
        raise BertologyError(f"Give one head name per head: {heads} names, not {len(names)}.")
    return [str(name) for name in names]


def is_causal(probs: np.ndarray) -> bool:
    """True when no query attends to a later key: ``probs [layers, heads, n, n]`` is 0 above the diagonal
    everywhere (a decoder's self-attention), so the page draws those cells as not attendable."""
    return probs.shape[-1] > 1 and not np.triu(probs, k=1).any()


def opening_query(query: int | None, n: int, causal: bool) -> int:
    """The query token a view opens on: ``query`` if given, else the last of the ``n`` tokens for causal
    attention (the only query that sees every key; the first sees only itself) and the first otherwise."""
    if query is not None:
        return query
    return n - 1 if causal else 0


def model_caption(model_name: str) -> dict[str, str]:
    """The page's ``caption`` entry: what a user should know about the model named, such as a quantised
    file's (:func:`~bertology.models.model_store.model_note`), or nothing."""
    note = model_note(model_name)
    return {"caption": f"Note: {note}."} if note else {}


def view_data(
    attention: Attention,
    kind: ViewKind,
    *,
    layer: int = 0,
    head: int = 0,
    query: int | None = None,
    theme: Theme = "light",
    head_names: Sequence[str] | None = None,
    faint_lines: bool = False,
) -> dict[str, Any]:
    """The JSON-ready description of one view (the contract read by the page's script, ``static/views/``).

    Head and model views carry ``attention: [layers, heads, n, n]`` as 8-bit codes; the neuron view
    carries ``queries`` and ``keys: [layers, heads, n, head_dim]`` as float16 and per-layer ``scaling``
    (and, for norm-based weights, ``valueNorms: [layers, heads, n]`` float16, each key's ``||f(x)||``).
    ``causal: true`` (a decoder's attention, see :func:`is_causal`) makes every view treat later keys as
    not attendable: hatched in the model view, left out of the neuron view's softmax.
    query: the query token shown first (:func:`opening_query`; default: the last for causal attention,
        else the first). A model with a note (a quantised file's) gets it as the page's ``caption``.
    head_names: one label per head (``headNames``), shown instead of the head numbers, e.g.
        ``["attention", "rollout", "flow"]`` for a page whose "heads" are three kinds of map.
    faint_lines: the head view draws each line at an opacity of at least 0.1 (``faintLines``), so that
        small weights stay visible; by default a line's opacity is its weight divided by the number of
        heads shown, as in BertViz, and small weights fade out.
    """
    if kind not in VIEW_KINDS:
        raise BertologyError(f"Unknown view '{kind}'; choose one of {', '.join(VIEW_KINDS)}.")
    layers, heads, n, _ = attention.probs.shape
    causal = is_causal(attention.probs)
    query = opening_query(query, n, causal)
    check_index("Layer", layer, layers, "layers")
    check_index("Head", head, heads, "heads")
    check_index("Query token", query, n, "tokens")
    data: dict[str, Any] = {
        "view": kind,
        "model": attention.model_name,
        "tokens": attention.tokens,
        "segments": attention.segment_ids.tolist(),
        "pair": attention.is_pair,
        "layers": layers,
        "heads": heads,
        "n": n,
        "layer": layer,
        "head": head,
        "query": query,
        "theme": theme,
        "weights": attention.weights,
        **model_caption(attention.model_name),
    }
    if head_names is not None:
        data["headNames"] = _head_names(head_names, heads)
    if faint_lines:
        data["faintLines"] = True
    if causal:
        data["causal"] = True
    if kind == "neuron":
        if attention.queries is None or attention.keys is None:
            raise BertologyError("The neuron view needs query and key vectors: capture with qk=True.")
        data["queries"] = pack_float16(attention.queries)
        data["keys"] = pack_float16(attention.keys)
        data["scaling"] = attention.scaling.tolist()
        if attention.weights == "norm":
            if attention.value_norms is None:
                raise BertologyError(
                    "The neuron view of norm-based weights needs each token's ||f(x)||: capture with qk=True."
                )
            data["valueNorms"] = pack_float16(attention.value_norms)
    else:
        data["attention"] = pack_attention(attention.probs)
    return data


#: Selector labels of an encoder-decoder page's attention sets.
ATTENTION_SET_LABELS: dict[AttentionSetName, str] = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention (causal)",
    "cross": "Cross-attention (target → source)",
}


def attention_set_entry(
    name: AttentionSetName,
    probs: np.ndarray,
    tokens: list[str],
    key_tokens: list[str] | None = None,
    *,
    causal: bool,
) -> dict[str, Any]:
    """One entry of a page's ``attentionSets``: ``{name, label, tokens, segments, layers, heads, n, causal,
    attention}`` and, when the keys are other tokens than the queries (cross-attention), ``keyTokens``.

    probs: [layers, heads, n, keys]; rows = the query ``tokens``, columns = ``key_tokens`` (default: the
        same tokens). causal: later keys are not attendable (decoder self-attention).
    """
    layers, heads, n, _ = probs.shape
    entry: dict[str, Any] = {
        "name": name,
        "label": ATTENTION_SET_LABELS[name],
        "tokens": tokens,
        "segments": [0] * n,
        "layers": layers,
        "heads": heads,
        "n": n,
        "causal": causal,
    }
    if key_tokens is not None:
        entry["keyTokens"] = key_tokens
    entry["attention"] = pack_attention(probs)
    return entry


def check_set_view(kind: ViewKind) -> None:
    """Refuse a view other than the head and model view for a page of attention sets."""
    if kind not in ("head", "model"):
        raise BertologyError(
            f"The {kind} view is not available for encoder-decoder models; choose the head or model view."
        )


def attention_sets_data(
    kind: ViewKind,
    model_name: str,
    entries: list[dict[str, Any]],
    *,
    first: AttentionSetName,
    layer: int = 0,
    theme: Theme = "light",
) -> dict[str, Any]:
    """The page data of a head or model view with a selector over ``entries`` (from
    :func:`attention_set_entry`); ``first`` names the one shown first, at ``layer``."""
    return {
        "view": kind,
        "model": model_name,
        "layer": layer,
        "head": 0,
        "query": 0,
        "theme": theme,
        "attentionSet": first,
        "attentionSets": entries,
    }


def seq2seq_view_data(
    attention: Seq2SeqAttention,
    kind: ViewKind,
    *,
    attention_set: AttentionSetName = "cross",
    layer: int = 0,
    theme: Theme = "light",
) -> dict[str, Any]:
    """The head or model view of an encoder-decoder model, with a selector over its attention sets.

    The page data has ``attentionSets``: for encoder self-attention, decoder self-attention and
    cross-attention each ``{name, label, tokens, segments, layers, heads, n, causal, attention}`` and,
    for cross-attention, ``keyTokens`` (its ``attention`` is ``[layers, heads, n, len(keyTokens)]``:
    rows = target tokens, columns = source tokens); ``attentionSet`` names the one shown first.
    """
    check_set_view(kind)
    layers = attention.probs(attention_set).shape[0]  # also refuses an unknown set
    check_index("Layer", layer, layers, f"{attention_set} layers")
    source, target = attention.source_tokens, attention.target_tokens
    entries = [
        attention_set_entry("encoder", attention.encoder, source, causal=False),
        attention_set_entry("decoder", attention.decoder, target, causal=True),
        attention_set_entry("cross", attention.cross, target, source, causal=False),
    ]
    return attention_sets_data(
        kind, attention.model_name, entries, first=attention_set, layer=layer, theme=theme
    )
