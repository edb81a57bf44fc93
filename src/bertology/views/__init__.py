"""Head, model and neuron views: one self-contained HTML page each, also shown inline in notebooks.

A renderer: it may import the computations (analysis, probes, interventions, stats), the captured attention
and what lies below them, never the server or the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertology.attention.capturing import Attention, capture
from bertology.attention.long_capture import LongAttention
from bertology.attention.norms import Weights
from bertology.attention.seq2seq import AttentionSetName, Seq2SeqAttention, capture_seq2seq
from bertology.corpus.encoding import Text
from bertology.errors import BertologyError
from bertology.files.outputs import write_text
from bertology.models.loading import KIND_PHRASES, LoadedModel, model_in_use
from bertology.views.bertviz import (
    ATTENTION_KEYWORDS,
    bertviz_view_data,
    is_attention_arrays,
    pretty_tokens,
    select_heads,
    theme_of,
)
from bertology.views.build import VIEW_KINDS, Theme, ViewKind, seq2seq_view_data, view_data
from bertology.views.long import long_view_data
from bertology.views.notebook import MAX_FRAME_HEIGHT, notebook_frame
from bertology.views.page import render_page

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "VIEW_KINDS",
    "PageHTML",
    "View",
    "head_view",
    "model_view",
    "neuron_view",
    "render_view",
    "seq2seq_view",
]

_TITLES = {"head": "Head view", "model": "Model view", "neuron": "Neuron view"}

_TOOLBAR_HEIGHT = 130  # px: toolbar, hint and status lines, about
_ROW_HEIGHT = 18  # px per token row (views.css --bt-row)
_THUMBNAIL_ROW = 70  # px per layer of the model view's grid at a notebook's width, about


@dataclass(repr=False)
class View:
    """A rendered view: ``.html`` is the whole page, ``.save(path)`` writes it, notebooks show it inline."""

    kind: ViewKind
    data: dict[str, Any]

    def __repr__(self) -> str:
        """One line: the kind and size, not the page's payload."""
        return f"{type(self).__name__}(kind={self.kind!r}, {self.token_count}, {self.title!r})"

    @property
    def heading(self) -> str:
        """What the page shows, e.g. "Head view"."""
        return _TITLES[self.kind]

    @property
    def title(self) -> str:
        weights = " · norm-based weights" if self.data.get("weights") == "norm" else ""
        return f"{self.heading} · {self.data['model']}{weights}"

    @property
    def token_count(self) -> str:
        """How many tokens the view shows, in words: "19 tokens", "9 source and 20 target tokens", or for a
        long input "8192 tokens (a window of 256 at a time)"."""
        counts: dict[str, int] = {}  # source and target tokens of an encoder-decoder's attention sets
        for entry in self.data.get("attentionSets", []):
            side = "source" if entry["name"] == "encoder" else "target"
            counts[side] = entry["n"]
            if entry["name"] == "cross":
                counts["source"] = len(entry["keyTokens"])
        if "long" in self.data:
            return f"{self.data['long']['n']} tokens (a window of {self.data['n']} at a time)"
        if not counts:
            return f"{self.data['n']} tokens"
        return (
            " and ".join(f"{counts[side]} {side}" for side in ("source", "target") if side in counts)
            + " tokens"
        )

    @cached_property
    def html(self) -> str:
        return render_page(self.data, self.title)

    def save(self, path: str | Path) -> Path:
        return write_text(path, self.html)

    @property
    def estimated_height(self) -> int:
        """The frame height (px) to start from before the page reports its own: toolbar plus a row per
        token (head and neuron view) or a thumbnail row per layer (model view), at most the cap."""
        sets = self.data.get("attentionSets") or [self.data]
        if self.kind == "model":
            body = max(entry["layers"] for entry in sets) * _THUMBNAIL_ROW + 30
        else:
            rows = max(max(entry["n"], len(entry.get("keyTokens") or ())) for entry in sets)
            body = rows * _ROW_HEIGHT + 40
        return min(_TOOLBAR_HEIGHT + body, MAX_FRAME_HEIGHT)

    def _repr_html_(self) -> str:
        # An iframe keeps the page's script, styles and strict CSP apart from the notebook's; the page
        # travels deflated (bertology.views.notebook).
        return notebook_frame(self.html, self.estimated_height)


def render_view(
    source: Attention | LongAttention | Text,
    text_b: Text | None = None,
    *,
    kind: ViewKind,
    model: LoadedModel | PreTrainedModel | str | Path | None = None,
    tokenizer: Any = None,
    layer: int | None = None,
    head: int | None = None,
    query: int | None = None,
    theme: Theme | None = None,
    weights: Weights = "attention",
    head_names: Sequence[str] | None = None,
    target: str | None = None,
    attention_set: AttentionSetName = "cross",
    window: tuple[int, int] | None = None,
    max_tokens: int | None = None,
    heads: Sequence[int] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    prettify_tokens: bool = True,
    faint_lines: bool = False,
) -> View:
    """Build a view from a captured :class:`Attention` or :class:`LongAttention`, or capture ``source``
    (and ``text_b``) first.

    model: a loaded model, a name or path, or a transformers model object with its ``tokenizer``
    (:func:`~bertology.models.loading.model_in_use`; the model is left as it was).
    weights: when capturing, show the softmax output (``"attention"``) or the norm-based weights
    (``"norm"``, :mod:`bertology.attention.norms`; the neuron view shows them beside the softmax).
    head_names: labels shown instead of the head numbers (one per head).
    layer, head: shown first (default: the first); with ``include_layers`` / ``include_heads`` (show only
    these, labelled with their own numbers) they are original numbers among those. heads: the heads the
    head view shows first (default: all). query: the neuron view's query token shown first (default: the
    last for a decoder's causal attention, whose first query sees only itself; else the first).
    theme: ``"light"`` or ``"dark"`` (default: :data:`DEFAULT_DISPLAY_MODES`, BertViz's: the model and
    neuron views dark, the head view light). prettify_tokens: show the word-start marks Ġ and ▁ as spaces
    (the default; ``False``: the tokens as the tokenizer writes them).
    faint_lines: draw every line at an opacity of at least 0.1 (see :func:`~bertology.views.build.view_data`).
    A decoder-only model's attention is drawn as causal. An encoder-decoder model takes ``source`` and
    ``target`` texts and shows ``attention_set`` first (see :func:`seq2seq_view`).
    A long input (a :class:`LongAttention`, which ``capture`` gives above
    :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS` tokens) is shown as
    :mod:`bertology.views.long`
    describes: a ``window`` of ``(start, size)`` tokens (default: 256 around ``query``) and a minimap.
    max_tokens: when capturing, read at most this many tokens (default: the model's own limit).
    """
    theme = theme or DEFAULT_DISPLAY_MODES[kind]
    selection = {"heads": heads, "include_layers": include_layers, "include_heads": include_heads}
    selected = [name for name, value in selection.items() if value is not None]
    if isinstance(source, Attention | LongAttention):
        attention = source
    else:
        with model_in_use(model, tokenizer) as loaded:
            if loaded.kind == "encoder-decoder":
                if text_b is not None:
                    raise BertologyError(
                        "An encoder-decoder model takes a source and a target, not a pair of texts."
                    )
                if selected:
                    raise BertologyError(
                        f"{selected[0]}= is not available for an encoder-decoder model's text; pass its "
                        "attention tensors (encoder_attention=, ...) to choose layers and heads."
                    )
                text = source if isinstance(source, str) else " ".join(source)
                return seq2seq_view(
                    text,
                    target,
                    kind=kind,
                    attention_set=attention_set,
                    model=loaded,
                    layer=layer or 0,
                    theme=theme,
                )
            if target is not None:
                raise BertologyError(
                    "A target text is for encoder-decoder models; "
                    f"'{loaded.name}' is {KIND_PHRASES[loaded.kind]} model."
                )
            attention = capture(
                source, text_b, model=loaded, qk=kind == "neuron", weights=weights, max_length=max_tokens
            )
    if prettify_tokens:
        attention = pretty_tokens(attention)
    options = {"query": query, "theme": theme, "head_names": head_names}
    if isinstance(attention, LongAttention):
        if selected:
            raise BertologyError(
                f"{selected[0]}= is not available for a long input; its view shows all heads."
            )
        data = long_view_data(attention, kind, window=window, layer=layer or 0, head=head or 0, **options)
        return View(kind, {**data, "faintLines": True} if faint_lines else data)
    if not selected:
        return View(
            kind,
            view_data(attention, kind, layer=layer or 0, head=head or 0, faint_lines=faint_lines, **options),
        )
    cut, shown = select_heads(attention, layer=layer, head=head, **selection)
    data = view_data(cut, kind, layer=shown.layer, head=shown.head, faint_lines=faint_lines, **options)
    return View(kind, {**shown.fields, **data})  # names given for the heads shown win over their numbers


def seq2seq_view(
    source: Seq2SeqAttention | str,
    target: str | None = None,
    *,
    kind: ViewKind = "head",
    attention_set: AttentionSetName = "cross",
    model: LoadedModel | str | Path | None = None,
    layer: int = 0,
    theme: Theme = "light",
) -> View:
    """The head or model view of an encoder-decoder model (BART, T5) for ``source`` and ``target`` (or an
    already captured :class:`Seq2SeqAttention`), with a selector over encoder self-attention, decoder
    self-attention and cross-attention; ``attention_set`` is the one shown first."""
    if isinstance(source, Seq2SeqAttention):
        attention = source
    elif target is None:
        raise BertologyError(
            "An encoder-decoder model needs a target text as well as the source text (view: --target)."
        )
    else:
        attention = capture_seq2seq(source, target, model=model)
    data = seq2seq_view_data(attention, kind, attention_set=attention_set, layer=layer, theme=theme)
    return View(kind, data)


@dataclass(frozen=True)
class PageHTML:
    """What ``html_action="return"`` gives, in the place of BertViz's IPython ``HTML`` object: ``.data`` is
    the whole self-contained page (``open("view.html", "w").write(page.data)``), and a notebook shows it
    as it shows the view."""

    view: View

    @property
    def data(self) -> str:
        return self.view.html

    def _repr_html_(self) -> str:
        return self.view._repr_html_()


def _deliver(view: View, html_action: str | None) -> View | PageHTML | None:
    """BertViz's ``html_action``: None (bertology's way) returns the view, which a notebook shows when
    it is a cell's value; ``"view"`` shows it at once and returns None; ``"return"`` gives a
    :class:`PageHTML`."""
    if html_action is None:
        return view
    if html_action == "return":
        return PageHTML(view)
    if html_action != "view":
        raise BertologyError(f"html_action must be 'view' or 'return', not {html_action!r}.")
    try:
        from IPython.display import display
    except ImportError as error:
        raise BertologyError(
            "html_action='view' shows the view in a notebook, which needs IPython; leave it out and "
            "save the view with .save(path)."
        ) from error
    display(view)
    return None


def _given_once(options: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    if options.get(name) is not None:
        raise BertologyError(f"Give {name} once: as the positional argument or as {name}=, not both.")
    return {**options, name: value}


#: BertViz's positional parameters after ``attention`` and ``tokens``, per view.
_BERTVIZ_POSITIONAL: dict[ViewKind, tuple[str, ...]] = {
    "head": ("sentence_b_start", "prettify_tokens", "layer", "heads"),
    "model": ("sentence_b_start", "prettify_tokens", "display_mode"),
    "neuron": (),
}
#: Each view's theme when none is given: BertViz's (its model and neuron views are dark, its head view light).
DEFAULT_DISPLAY_MODES: dict[ViewKind, Theme] = {"head": "light", "model": "dark", "neuron": "dark"}
#: Keywords of the attention-tensor form that a text has no use for.
_TENSOR_ONLY = (*ATTENTION_KEYWORDS, "tokens", "encoder_tokens", "decoder_tokens", "index")


def _display_mode(kind: ViewKind, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the theme under ``display_mode`` (BertViz's name; ``theme=`` is taken too), the
    view's default when neither is given."""
    options = dict(options)
    theme = options.pop("theme", None)
    if theme is not None and options.get("display_mode") is not None:
        raise BertologyError("Give display_mode or theme, not both.")
    options["display_mode"] = options.get("display_mode") or theme or DEFAULT_DISPLAY_MODES[kind]
    return options


def _text_view(kind: ViewKind, arguments: tuple[Any, ...], options: dict[str, Any]) -> View:
    """The view of a text (and a second text) or a captured :class:`Attention` (:func:`render_view`), with
    every keyword of the tensor form that applies to it: ``display_mode``, ``prettify_tokens`` (default
    on, as BertViz), ``layer``, ``heads``, ``include_layers``, ``include_heads``, ``model_name`` and
    ``sentence_b_start`` (checked against where ``text_b`` starts)."""
    if len(arguments) > 2:
        raise BertologyError(
            f"{kind}_view takes a text and a second text positionally; give the other options by name."
        )
    for name in _TENSOR_ONLY:
        if options.get(name) is not None:
            raise BertologyError(
                f"{name}= goes with a model's attention tensors; with a text, give model= (and the second "
                "text of a pair after the first)."
            )
    options = _display_mode(
        kind, {name: value for name, value in options.items() if name not in _TENSOR_ONLY}
    )
    sentence_b_start = options.pop("sentence_b_start", None)
    model_name = options.pop("model_name", None)
    options["theme"] = theme_of(options.pop("display_mode"))
    view = render_view(*arguments, kind=kind, **options)
    if sentence_b_start is not None:
        segments = view.data.get("segments", [])
        start = segments.index(1) if 1 in segments else None
        if sentence_b_start != start:
            where = f"at token {start}" if start is not None else "nowhere: there is one text"
            raise BertologyError(
                f"sentence_b_start is {sentence_b_start}, but the second text starts {where}; leave "
                "sentence_b_start out with a text, the view finds it."
            )
    return view if model_name is None else View(kind, {**view.data, "model": str(model_name)})


def _view(kind: ViewKind, arguments: tuple[Any, ...], options: dict[str, Any]) -> View | PageHTML | None:
    """A text (and a second text) or a captured :class:`Attention` goes to :func:`_text_view`; attention
    tensors, positional in BertViz's order or under its keywords, to
    :func:`~bertology.views.bertviz.bertviz_view_data`. Both take ``html_action`` (:func:`_deliver`)."""
    html_action = options.pop("html_action", None)
    if arguments and arguments[0] is not None and not is_attention_arrays(arguments[0]):
        return _deliver(_text_view(kind, arguments, options), html_action)
    names = ("attention", "tokens", *_BERTVIZ_POSITIONAL[kind])
    if len(arguments) > len(names):
        raise BertologyError(
            f"{kind}_view takes at most {len(names)} arguments positionally ({', '.join(names)}); "
            "give the others by name."
        )
    for name, value in zip(names, arguments, strict=False):
        options = _given_once(options, name, value)
    if all(options.get(name) is None for name in ATTENTION_KEYWORDS):
        raise BertologyError(
            f"Give a text to see, a captured Attention, or a model's attention tensors: "
            f"{kind}_view(attention=outputs.attentions, tokens=tokens)."
        )
    return _deliver(View(kind, bertviz_view_data(kind, **_display_mode(kind, options))), html_action)


def _bertviz_call(
    kind: ViewKind, attention: Any, tokens: Any, named: dict[str, Any], options: dict[str, Any]
) -> View | PageHTML | None:
    """A call of :func:`head_view` or :func:`model_view` as :func:`_view` takes it: a text (and its second
    text, in ``tokens``) or a captured attention positionally, anything else (attention tensors, their
    tokens) by name, as every parameter given (not ``None``)."""
    given = {name: value for name, value in {**named, **options}.items() if value is not None}
    textual = isinstance(attention, str) or (
        isinstance(attention, list | tuple) and bool(attention) and all(isinstance(w, str) for w in attention)
    )
    if textual or isinstance(attention, Attention | LongAttention | Seq2SeqAttention):
        return _view(kind, tuple(value for value in (attention, tokens) if value is not None), given)
    return _view(kind, (), {**given, "attention": attention, "tokens": tokens})


def head_view(
    attention: Any = None,
    tokens: Any = None,
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
    html_action: str | None = None,
    *,
    include_heads: Sequence[int] | None = None,
    display_mode: str | None = None,
    model: Any = None,
    tokenizer: Any = None,
    index: int | None = None,
    model_name: str | None = None,
    faint_lines: bool = False,
    **options: Any,
) -> View | PageHTML | None:
    """All heads of one layer as lines between token columns.

    The parameters up to ``html_action`` are BertViz 1.4.1's ``head_view``'s, in its order; the
    keyword-only ones are bertology's. Three forms: ``head_view(text[, text_b], model=...)`` captures
    first (``attention`` holds the text, ``tokens`` the second text; ``model``: a name, a path, a
    :class:`~bertology.models.loading.LoadedModel`, or a transformers model object with ``tokenizer=``);
    ``head_view(attention)`` draws a captured :class:`Attention`; BertViz's
    ``head_view(attention=outputs.attentions, tokens=tokens)`` draws the per-layer
    ``[batch, heads, q, k]`` tensors any model returns, torch or numpy, with the ``encoder_attention`` /
    ``decoder_attention`` / ``cross_attention`` / ``encoder_tokens`` / ``decoder_tokens`` keywords of
    encoder-decoders and ``index`` (the input of a batch)
    (:func:`~bertology.views.bertviz.bertviz_view_data`).

    prettify_tokens: ``Ġ`` and ``▁`` shown as spaces. layer: the layer shown first; heads: the heads
    selected first; include_layers / include_heads: the layers / heads kept, labelled with their own
    numbers. html_action: ``None`` returns the :class:`View` (BertViz: ``"view"``, which shows it at once,
    and ``"return"``, a :class:`PageHTML`). display_mode: ``"light"`` (default) or ``"dark"`` (``theme=``
    is the same; BertViz's head view has no such parameter). model_name: the page's label. faint_lines:
    every line at an opacity of at least 0.1 (by default a line's opacity is its weight divided by the
    heads shown, as in BertViz). options: the text forms' further options of :func:`render_view`.
    """
    named = {
        "sentence_b_start": sentence_b_start,
        "prettify_tokens": prettify_tokens,
        "layer": layer,
        "heads": heads,
        "encoder_attention": encoder_attention,
        "decoder_attention": decoder_attention,
        "cross_attention": cross_attention,
        "encoder_tokens": encoder_tokens,
        "decoder_tokens": decoder_tokens,
        "include_layers": include_layers,
        "html_action": html_action,
        "include_heads": include_heads,
        "display_mode": display_mode,
        "model": model,
        "tokenizer": tokenizer,
        "index": index,
        "model_name": model_name,
        "faint_lines": faint_lines or None,
    }
    return _bertviz_call("head", attention, tokens, named, options)


def model_view(
    attention: Any = None,
    tokens: Any = None,
    sentence_b_start: int | None = None,
    prettify_tokens: bool = True,
    display_mode: str | None = None,
    encoder_attention: Any = None,
    decoder_attention: Any = None,
    cross_attention: Any = None,
    encoder_tokens: Sequence[str] | None = None,
    decoder_tokens: Sequence[str] | None = None,
    include_layers: Sequence[int] | None = None,
    include_heads: Sequence[int] | None = None,
    html_action: str | None = None,
    *,
    model: Any = None,
    tokenizer: Any = None,
    index: int | None = None,
    model_name: str | None = None,
    **options: Any,
) -> View | PageHTML | None:
    """Every layer x head as a heatmap thumbnail in one grid (not BertViz's grid of line drawings); click
    one to enlarge it as lines. The parameters up to ``html_action`` are BertViz 1.4.1's ``model_view``'s,
    in its order, the keyword-only ones bertology's; the same forms and meanings as :func:`head_view`,
    but ``display_mode`` is ``"dark"`` unless given (BertViz's default). A pair of texts gets BertViz's
    "Sentence A -> Sentence B" filter."""
    named = {
        "sentence_b_start": sentence_b_start,
        "prettify_tokens": prettify_tokens,
        "display_mode": display_mode,
        "encoder_attention": encoder_attention,
        "decoder_attention": decoder_attention,
        "cross_attention": cross_attention,
        "encoder_tokens": encoder_tokens,
        "decoder_tokens": decoder_tokens,
        "include_layers": include_layers,
        "include_heads": include_heads,
        "html_action": html_action,
        "model": model,
        "tokenizer": tokenizer,
        "index": index,
        "model_name": model_name,
    }
    return _bertviz_call("model", attention, tokens, named, options)


def neuron_view(*arguments: Any, **options: Any) -> View | PageHTML | None:
    """Query, key, q×k, q·k and softmax for one layer, head and query token, of a text (or a pair) or of
    an :class:`Attention` captured with ``qk=True`` (attention tensors have no query and key vectors).
    The text form takes the keywords of :func:`head_view`'s (``head`` as well; ``display_mode`` is
    ``"dark"`` unless given, BertViz's default); BertViz's ``neuron_view.show(model, model_type,
    tokenizer, sentence_a, sentence_b, ...)`` is :func:`bertology.bertviz.neuron_view.show`."""
    return _view("neuron", arguments, options)
