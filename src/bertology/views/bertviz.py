"""The BertViz-compatible entry point: head and model views of the attention tensors any model returns.

BertViz draws ``head_view(attention=outputs.attentions, tokens=tokens)``: one ``[batch, heads, q, k]``
tensor per layer, as every transformers model returns them with ``output_attentions=True``, and the
token strings. This module checks such tensors (torch or numpy, per layer or stacked) and turns them
into the :class:`~bertology.attention.capturing.Attention` a capture gives (so every view draws them as it
draws a capture, causal attention included), or, for an encoder-decoder's ``encoder_attention``,
``decoder_attention`` and ``cross_attention``, into the page data of the attention-set views.
Nothing here depends on which model produced the tensors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch

from bertology.attention.capturing import Attention
from bertology.corpus.encoding import InputDescription
from bertology.errors import BertologyError
from bertology.options import AttentionSetName, Theme, ViewKind
from bertology.views.build import (
    attention_set_entry,
    attention_sets_data,
    check_index,
    check_set_view,
    is_causal,
    view_data,
)

Described = TypeVar("Described", bound=InputDescription)

#: The keywords that carry attention tensors (BertViz's names).
ATTENTION_KEYWORDS = ("attention", "encoder_attention", "decoder_attention", "cross_attention")
#: How far a row of attention weights may sum from 1 (half-precision outputs round each weight).
ROW_SUM_TOLERANCE = 1e-2
#: Special tokens, recognised from their strings: BERT's [CLS] ..., RoBERTa's and Llama's <s> </s>, <pad>,
#: Gemma's <bos>, XLNet's <cls>, GPT-2's and Llama 3's <|endoftext|> <|begin_of_text|> ..., T5's sentinels.
_SPECIAL_TOKEN = re.compile(
    r"\[(?:CLS|SEP|PAD|MASK|UNK)\]|</?s>|<(?:pad|mask|unk|cls|sep|bos|eos)>|<\|[^|]*\|>|<extra_id_\d+>"
)
#: The token lists of each attention set of an encoder-decoder: (queries, keys; None: the same).
_SET_TOKENS: dict[AttentionSetName, tuple[str, str | None]] = {
    "encoder": ("encoder_tokens", None),
    "decoder": ("decoder_tokens", None),
    "cross": ("decoder_tokens", "encoder_tokens"),
}
#: Byte-level BPE (Ġ) and SentencePiece (▁) mark a token that follows a space.
_WORD_START = ("Ġ", "▁")
#: WordPiece marks a token that continues a word.
_CONTINUATION = "##"


def is_attention_arrays(value: Any) -> bool:
    """True for what BertViz takes as attention: an array or tensor, or a sequence (a model's
    ``outputs.attentions`` tuple) whose items are not strings (a text given as words is a sequence of
    strings)."""
    if hasattr(value, "shape"):
        return True
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and (len(value) == 0 or not isinstance(value[0], str))
    )


def is_special_token(token: str) -> bool:
    """True for a special token's string ([CLS], [SEP], <s>, </s>, <pad>, <|endoftext|>, ...)."""
    return _SPECIAL_TOKEN.fullmatch(token) is not None


def prettify(token: str) -> str:
    """A token as BertViz's ``prettify_tokens`` shows it: the word-start marks Ġ and ▁ as spaces, no </w>."""
    return token.replace("Ġ", " ").replace("▁", " ").replace("</w>", "")


def words_from_tokens(tokens: Sequence[str], special: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Each token's word ([n] int, -1 for special tokens) and the words, rebuilt from the token strings.

    Byte-level BPE and SentencePiece tokens (some token starts with Ġ or ▁): a token starts a word when
    it carries the mark or follows a special token, which gives the whitespace-separated words a
    capture gives. WordPiece tokens: a token continues the word before it when it starts with ##; the
    token strings do not say whether a space came before punctuation, so punctuation is a word of its
    own here (a capture knows the text and joins "store." into one word).
    """
    marked = any(token.startswith(_WORD_START) for token in tokens)
    word_ids = np.full(len(tokens), -1, dtype=np.int64)
    words: list[str] = []
    after_special = True
    for position, token in enumerate(tokens):
        if special[position]:
            after_special = True
            continue
        if marked:
            starts = token.startswith(_WORD_START)
            piece = token[1:] if starts else token
        else:
            starts = not token.startswith(_CONTINUATION)
            piece = token.removeprefix(_CONTINUATION)
        if starts or after_special:
            words.append(piece)
        else:
            words[-1] += piece
        word_ids[position] = len(words) - 1
        after_special = False
    return word_ids, words


def _as_array(values: Any, what: str) -> np.ndarray:
    """``values`` (a torch tensor on any device and dtype, a numpy array, nested lists) as float32 numpy."""
    if isinstance(values, torch.Tensor):
        return values.detach().to(device="cpu", dtype=torch.float32).numpy()
    try:
        return np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as error:
        raise BertologyError(f"{what} is not an array of numbers but {type(values).__name__}.") from error


def _layer(values: Any, what: str, batched: bool, index: int | None) -> np.ndarray:
    """One layer's ``[heads, q, k]`` from ``values`` ([batch, heads, q, k] when ``batched``)."""
    array = values if hasattr(values, "shape") else _as_array(values, what)
    expected = 4 if batched else 3
    if len(array.shape) != expected:
        form = "[batch, heads, q, k]" if batched else "[heads, q, k]"
        raise BertologyError(
            f"{what} has shape {tuple(array.shape)}, not {form}: pass the attention tensors a model returns "
            "with output_attentions=True."
        )
    if not batched:
        return _as_array(array, what)
    batch = array.shape[0]
    if index is None and batch != 1:
        raise BertologyError(
            f"{what} holds a batch of {batch} inputs; pick one with index= (0 to {batch - 1})."
        )
    check_index("index", 0 if index is None else index, batch, "inputs in the batch")
    return _as_array(array[0 if index is None else index], what)


def stack_layers(attention: Any, name: str = "attention", index: int | None = None) -> np.ndarray:
    """The ``[layers, heads, q, k]`` float32 array of ``attention``: a sequence with one
    ``[batch, heads, q, k]`` tensor or array per layer (``outputs.attentions``), one stacked
    ``[layers, batch, heads, q, k]`` array, or one stacked ``[layers, heads, q, k]`` array.

    index: the input of the batch to show; may be left out for a batch of one.
    Every row must hold weights that sum to 1 (within :data:`ROW_SUM_TOLERANCE`), or be all zero (a query
    a model masks out entirely).

    Raises:
        BertologyError: anything else, in one sentence that says what is wrong.
    """
    if hasattr(attention, "shape"):
        stacked = len(attention.shape)
        if stacked not in (4, 5):
            raise BertologyError(
                f"{name} has shape {tuple(attention.shape)}; pass one [batch, heads, q, k] tensor per layer "
                "(outputs.attentions), or one stacked [layers, heads, q, k] array."
            )
        if stacked == 4 and index is not None:
            raise BertologyError(
                f"index= picks an input of a batch, but {name} is one [layers, heads, q, k] array, "
                "with no batch axis."
            )
        items, batched = [attention[number] for number in range(attention.shape[0])], stacked == 5
    elif is_attention_arrays(attention):
        items, batched = list(attention), True
    else:
        raise BertologyError(
            f"{name} must be the per-layer attention tensors a model returns (outputs.attentions), "
            f"not {type(attention).__name__}."
        )
    if not items:
        raise BertologyError(
            f"{name} holds no layers: if it is BertViz's outputs[-1], with transformers 5 that is the "
            "cross-attentions (empty for a model without them), not the attention; pass outputs.attentions "
            "(the model called with output_attentions=True)."
        )
    layers = [_layer(item, f"{name}[{number}]", batched, index) for number, item in enumerate(items)]
    for number, layer in enumerate(layers):
        if layer.shape != layers[0].shape:
            raise BertologyError(
                f"{name}[{number}] has shape {layer.shape} (heads, q, k) but {name}[0] has {layers[0].shape}."
            )
    probs = np.stack(layers)
    _check_rows(probs, name)
    return probs


def _check_rows(probs: np.ndarray, name: str) -> None:
    """Refuse anything but attention weights: finite, not negative, each row summing to 1 (or all zero)."""
    if not np.isfinite(probs).all() or (probs < 0).any():
        raise BertologyError(
            f"{name} holds negative, infinite or NaN values; pass attention weights (output_attentions=True)."
        )
    sums = probs.sum(axis=-1, dtype=np.float64)
    wrong = np.argwhere((np.abs(sums - 1) > ROW_SUM_TOLERANCE) & (sums != 0))
    if len(wrong):
        layer, head, query = wrong[0]
        raise BertologyError(
            f"The weights of {name} layer {layer}, head {head}, query {query} sum to "
            f"{sums[layer, head, query]:.4g}, not 1: pass attention probabilities (outputs.attentions), "
            "not scores."
        )


def _token_list(tokens: Any, name: str, count: int) -> list[str]:
    """``tokens`` as a list of ``count`` strings, one per position of the attention's axis."""
    if tokens is None:
        raise BertologyError(f"Give {name}=, the token strings, with the attention.")
    if isinstance(tokens, str) or not all(isinstance(token, str) for token in tokens):
        raise BertologyError(
            f"{name} must be a list of token strings, as tokenizer.convert_ids_to_tokens(ids) gives."
        )
    if len(tokens) != count:
        raise BertologyError(f"The attention has {count} positions but {name} has {len(tokens)} tokens.")
    return list(tokens)


def _check_square(probs: np.ndarray, name: str) -> None:
    if probs.shape[-2] != probs.shape[-1]:
        raise BertologyError(
            f"{name} maps {probs.shape[-2]} queries to {probs.shape[-1]} keys; self-attention is square "
            "(cross-attention goes in cross_attention=)."
        )


def attention_from_outputs(
    attention: Any,
    tokens: Sequence[str],
    *,
    sentence_b_start: int | None = None,
    index: int | None = None,
    prettify_tokens: bool = True,
    model_name: str = "model",
) -> Attention:
    """The :class:`Attention` of one input from a model's self-attention tensors and its token strings.

    attention: see :func:`stack_layers` (``outputs.attentions``; torch or numpy). tokens: the n token
        strings. sentence_b_start: the index of text B's first token for a pair (segment ids: 0 before,
        1 from there; None: one text). prettify_tokens: show Ġ and ▁ as spaces (as BertViz does).
    Special tokens are recognised from their strings, words rebuilt from the tokens' marks
    (:func:`words_from_tokens`). There are no query or key vectors (``queries``, ``keys`` are None) and
    the scaling is unknown (NaN), so the neuron view needs a capture instead.
    """
    probs = stack_layers(attention, "attention", index)
    _check_square(probs, "attention")
    layers, _, n, _ = probs.shape
    raw = _token_list(tokens, "tokens", n)
    segment_ids = np.zeros(n, dtype=np.int64)
    if sentence_b_start is not None:
        if not 0 < sentence_b_start < n:
            raise BertologyError(
                f"sentence_b_start {sentence_b_start} is not inside the input: give the index of text B's "
                f"first token (1 to {n - 1})."
            )
        segment_ids[sentence_b_start:] = 1
    special = np.array([is_special_token(token) for token in raw], dtype=bool)
    word_ids, words = words_from_tokens(raw, special)
    first_tokens = [int(np.flatnonzero(word_ids == word)[0]) for word in range(len(words))]
    return Attention(
        probs=probs,
        tokens=[prettify(token) for token in raw] if prettify_tokens else raw,
        segment_ids=segment_ids,
        special=special,
        word_ids=word_ids,
        words=words,
        word_segments=segment_ids[first_tokens],
        queries=None,
        keys=None,
        scaling=np.full(layers, np.nan),
        truncated=0,
        model_name=model_name,
    )


def _selection(chosen: Sequence[int] | None, count: int, name: str) -> list[int] | None:
    """``include_layers`` / ``include_heads`` checked against ``count`` (None: all, in order)."""
    if chosen is None:
        return None
    numbers = list(chosen)
    if not numbers or len(set(numbers)) != len(numbers):
        raise BertologyError(f"{name} must list distinct indices, at least one.")
    for number in numbers:
        if isinstance(number, bool) or not isinstance(number, int | np.integer) or not 0 <= number < count:
            raise BertologyError(f"{name} holds {number!r}; the indices go from 0 to {count - 1}.")
    return [int(number) for number in numbers]


def _position(value: int | None, shown: list[int], name: str) -> int:
    """Where ``value`` (an original layer or head number) is among the ``shown`` ones (0 for None)."""
    if value is None:
        return 0
    if value not in shown:
        raise BertologyError(f"{name} {value!r} is not among those shown: {shown}.")
    return shown.index(value)


@dataclass(frozen=True)
class Shown:
    """The layers and heads a page shows (original numbers, in the page's order) and the positions of the
    layer (and head) shown first among them."""

    layers: list[int]
    heads: list[int]
    layer: int
    head: int
    fields: dict[str, Any]


def _shown(
    layer_count: int,
    head_count: int,
    *,
    layer: int | None = None,
    head: int | None = None,
    heads: Sequence[int] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
) -> Shown:
    """What of ``layer_count`` x ``head_count`` heads a page shows: ``include_layers`` x ``include_heads``
    (None: all), and the page fields that name it: ``layerNames`` and ``headNames`` (the original numbers,
    when some are left out) and ``selectedHeads`` (the positions of ``heads``, the head view's first
    selection). ``layer`` and ``head`` are original numbers among those kept (None: the first)."""
    kept_layers = _selection(include_layers, layer_count, "include_layers")
    kept_heads = _selection(include_heads, head_count, "include_heads")
    shown_layers = kept_layers or list(range(layer_count))
    shown_heads = kept_heads or list(range(head_count))
    fields: dict[str, Any] = {}
    if kept_layers is not None:
        fields["layerNames"] = [str(number) for number in kept_layers]
    if kept_heads is not None:
        fields["headNames"] = [str(number) for number in kept_heads]
    if heads is not None:
        fields["selectedHeads"] = sorted({_position(number, shown_heads, "Head") for number in heads})
    return Shown(
        shown_layers,
        shown_heads,
        _position(layer, shown_layers, "Layer"),
        _position(head, shown_heads, "Head"),
        fields,
    )


def _cut(values: np.ndarray, shown: Shown) -> np.ndarray:
    """``values [layers, heads, ...]`` cut to the layers and heads shown (the array itself when all are)."""
    if shown.layers == list(range(values.shape[0])) and shown.heads == list(range(values.shape[1])):
        return values
    return values[np.ix_(shown.layers, shown.heads)]


def select_heads(
    attention: Attention,
    *,
    layer: int | None = None,
    head: int | None = None,
    heads: Sequence[int] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
) -> tuple[Attention, Shown]:
    """``attention`` cut to ``include_layers`` x ``include_heads`` (its probabilities, queries, keys, value
    norms ``[layers, heads, ...]`` and ``scaling [layers]``) and what :func:`_shown` says is shown."""
    layer_count, head_count = attention.probs.shape[:2]
    shown = _shown(
        layer_count,
        head_count,
        layer=layer,
        head=head,
        heads=heads,
        include_layers=include_layers,
        include_heads=include_heads,
    )
    cut = replace(
        attention,
        probs=_cut(attention.probs, shown),
        queries=None if attention.queries is None else _cut(attention.queries, shown),
        keys=None if attention.keys is None else _cut(attention.keys, shown),
        value_norms=None if attention.value_norms is None else _cut(attention.value_norms, shown),
        scaling=attention.scaling[shown.layers],
    )
    return cut, shown


def pretty_tokens(attention: Described) -> Described:
    """``attention`` (an :class:`Attention` or another input's description) with its tokens as BertViz's
    ``prettify_tokens`` shows them (:func:`prettify`)."""
    return replace(attention, tokens=[prettify(token) for token in attention.tokens])


def theme_of(display_mode: str) -> Theme:
    """BertViz's ``display_mode`` ("light" or "dark") as a page theme."""
    if display_mode not in ("light", "dark"):
        raise BertologyError(f"display_mode must be 'light' or 'dark', not {display_mode!r}.")
    return "dark" if display_mode == "dark" else "light"


def bertviz_view_data(
    kind: ViewKind,
    attention: Any = None,
    tokens: Sequence[str] | None = None,
    sentence_b_start: int | None = None,
    prettify_tokens: bool = True,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    encoder_attention: Any = None,
    decoder_attention: Any = None,
    cross_attention: Any = None,
    encoder_tokens: Sequence[str] | None = None,
    decoder_tokens: Sequence[str] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    display_mode: str = "light",
    index: int | None = None,
    model_name: str = "model",
    faint_lines: bool = False,
) -> dict[str, Any]:
    """The page data (as :func:`~bertology.views.build.view_data` gives) of BertViz's ``head_view`` /
    ``model_view`` arguments.

    Either ``attention`` and ``tokens`` (a self-attention model; ``sentence_b_start`` for a pair), or any
    of ``encoder_attention`` (with ``encoder_tokens``), ``decoder_attention`` (with ``decoder_tokens``)
    and ``cross_attention`` (``[batch, heads, decoder tokens, encoder tokens]`` per layer, with both) of
    an encoder-decoder: a selector over the sets given, the first shown first.
    layer: the layer shown first (an original number, among ``include_layers``).
    heads: the heads the head view shows first (default: all).
    include_layers, include_heads: show only these layers and heads, labelled with their own numbers.
    display_mode: ``"light"`` or ``"dark"``. index: the input of a batch to show.
    model_name: the label the page shows for the model. faint_lines: draw every line at an opacity of at
    least 0.1 (default: at its weight divided by the heads shown, as BertViz does).
    """
    if kind == "neuron":
        raise BertologyError(
            "The neuron view needs query and key vectors, which attention tensors do not carry; "
            "use bertology.neuron_view(text, model=...)."
        )
    if heads is not None and kind != "head":
        raise BertologyError("heads= picks the heads the head view shows first; use include_heads= here.")
    theme = theme_of(display_mode)
    sets: dict[AttentionSetName, Any] = {
        "encoder": encoder_attention,
        "decoder": decoder_attention,
        "cross": cross_attention,
    }
    given = {name: values for name, values in sets.items() if values is not None}
    if attention is not None:
        if given or encoder_tokens is not None or decoder_tokens is not None:
            raise BertologyError(
                "Give attention= (a self-attention model) or the encoder_, decoder_ and cross_ arguments "
                "(an encoder-decoder), not both."
            )
        if tokens is None:
            raise BertologyError("Give tokens=, the token strings, with the attention.")
        full = attention_from_outputs(
            attention,
            tokens,
            sentence_b_start=sentence_b_start,
            index=index,
            prettify_tokens=prettify_tokens,
            model_name=model_name,
        )
        cut, shown = select_heads(
            full, layer=layer, heads=heads, include_layers=include_layers, include_heads=include_heads
        )
        data = view_data(cut, kind, layer=shown.layer, theme=theme, faint_lines=faint_lines)
        return {**data, **shown.fields}
    if not given:
        raise BertologyError(
            "Give the attention: attention=outputs.attentions with tokens=, or for an encoder-decoder "
            "encoder_attention=, decoder_attention= or cross_attention= with their tokens."
        )
    if sentence_b_start is not None:
        raise BertologyError("sentence_b_start is for a pair of texts read by a self-attention model.")
    check_set_view(kind)
    token_lists = {"encoder_tokens": encoder_tokens, "decoder_tokens": decoder_tokens}
    shown = (lambda chosen: [prettify(token) for token in chosen]) if prettify_tokens else list
    entries, first = [], 0
    for name, values in given.items():
        probs = stack_layers(values, f"{name}_attention", index)
        query_name, key_name = _SET_TOKENS[name]
        queries = _token_list(token_lists[query_name], query_name, probs.shape[2])
        keys = None if key_name is None else _token_list(token_lists[key_name], key_name, probs.shape[3])
        if keys is None:
            _check_square(probs, f"{name}_attention")
        kept = _shown(
            *probs.shape[:2],
            layer=layer,
            heads=heads,
            include_layers=include_layers,
            include_heads=include_heads,
        )
        probs = _cut(probs, kept)
        first = kept.layer if not entries else first
        causal = keys is None and is_causal(probs)
        key_tokens = None if keys is None else shown(keys)
        entry = attention_set_entry(name, probs, shown(queries), key_tokens, causal=causal)
        entries.append({**entry, **kept.fields})
    data = attention_sets_data(kind, model_name, entries, first=entries[0]["name"], layer=first, theme=theme)
    return {**data, "faintLines": True} if faint_lines else data
