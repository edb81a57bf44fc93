"""Head, model and neuron views: one self-contained HTML page each, also shown inline in notebooks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from bertology.attention import Attention, capture
from bertology.capture_seq2seq import AttentionSetName, Seq2SeqAttention, capture_seq2seq
from bertology.errors import BertologyError
from bertology.inputs import Text
from bertology.long_capture import LongAttention
from bertology.models import KIND_PHRASES, LoadedModel, resolve_model
from bertology.norms import Weights
from bertology.views.bertviz import ATTENTION_KEYWORDS, bertviz_view_data, is_attention_arrays
from bertology.views.build import VIEW_KINDS, Theme, ViewKind, seq2seq_view_data, view_data
from bertology.views.long import long_view_data
from bertology.views.notebook import MAX_FRAME_HEIGHT, notebook_frame
from bertology.views.page import render_page

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
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.html, encoding="utf-8")
        return target

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
    model: LoadedModel | str | Path | None = None,
    layer: int = 0,
    head: int = 0,
    query: int = 0,
    theme: Theme = "light",
    weights: Weights = "attention",
    head_names: Sequence[str] | None = None,
    target: str | None = None,
    attention_set: AttentionSetName = "cross",
    window: tuple[int, int] | None = None,
    max_tokens: int | None = None,
) -> View:
    """Build a view from a captured :class:`Attention` or :class:`LongAttention`, or capture ``source``
    (and ``text_b``) first.

    weights: when capturing, show the softmax output (``"attention"``) or the norm-based weights
    (``"norm"``, :mod:`bertology.norms`; the neuron view shows them beside the softmax).
    head_names: labels shown instead of the head numbers (one per head).
    A decoder-only model's attention is drawn as causal. An encoder-decoder model takes ``source`` and
    ``target`` texts and shows ``attention_set`` first (see :func:`seq2seq_view`).
    A long input (a :class:`LongAttention`, which ``capture`` gives above
    :data:`~bertology.long_capture.LONG_INPUT_TOKENS` tokens) is shown as :mod:`bertology.views.long`
    describes: a ``window`` of ``(start, size)`` tokens (default: 256 around ``query``) and a minimap.
    max_tokens: when capturing, read at most this many tokens (default: the model's own limit).
    """
    if isinstance(source, Attention | LongAttention):
        attention = source
    else:
        loaded = resolve_model(model)
        if loaded.kind == "encoder-decoder":
            if text_b is not None:
                raise BertologyError(
                    "An encoder-decoder model takes a source and a target, not a pair of texts."
                )
            text = source if isinstance(source, str) else " ".join(source)
            return seq2seq_view(
                text, target, kind=kind, attention_set=attention_set, model=loaded, layer=layer, theme=theme
            )
        if target is not None:
            raise BertologyError(
                "A target text is for encoder-decoder models; "
                f"'{loaded.name}' is {KIND_PHRASES[loaded.kind]} model."
            )
        attention = capture(
            source, text_b, model=loaded, qk=kind == "neuron", weights=weights, max_length=max_tokens
        )
    options = {"layer": layer, "head": head, "query": query, "theme": theme, "head_names": head_names}
    if isinstance(attention, LongAttention):
        return View(kind, long_view_data(attention, kind, window=window, **options))
    return View(kind, view_data(attention, kind, **options))


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


def _view(kind: ViewKind, arguments: tuple[Any, ...], options: dict[str, Any]) -> View | PageHTML | None:
    """A text (and a second text) or a captured :class:`Attention` goes to :func:`render_view`; attention
    tensors, positional in BertViz's order or under its keywords, to
    :func:`~bertology.views.bertviz.bertviz_view_data`."""
    if arguments and arguments[0] is not None and not is_attention_arrays(arguments[0]):
        if len(arguments) > 2:
            raise BertologyError(
                f"{kind}_view takes a text and a second text positionally; give the other options by name."
            )
        return render_view(*arguments, kind=kind, **options)
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
    html_action = options.pop("html_action", None)
    return _deliver(View(kind, bertviz_view_data(kind, **options)), html_action)


def head_view(*arguments: Any, **options: Any) -> View | PageHTML | None:
    """All heads of one layer as lines between token columns.

    Three forms: ``head_view(text[, text_b], model=...)`` captures first; ``head_view(attention)`` draws a
    captured :class:`Attention` (options: :func:`render_view`); BertViz's
    ``head_view(attention=outputs.attentions, tokens=tokens)``, or positionally ``head_view(attentions,
    tokens, sentence_b_start, prettify_tokens, layer, heads)``, draws the per-layer
    ``[batch, heads, q, k]`` tensors any model returns, torch or numpy, with BertViz's
    ``sentence_b_start``, ``prettify_tokens``, ``layer``, ``heads``, ``include_layers``, the
    ``encoder_attention`` / ``decoder_attention`` / ``cross_attention`` / ``encoder_tokens`` /
    ``decoder_tokens`` keywords of encoder-decoders and ``html_action``, and bertology's ``index`` (the
    input of a batch), ``include_heads``, ``display_mode`` and ``model_name``
    (:func:`~bertology.views.bertviz.bertviz_view_data`).
    """
    return _view("head", arguments, options)


def model_view(*arguments: Any, **options: Any) -> View | PageHTML | None:
    """Every layer x head as a thumbnail in one grid; click one to enlarge it. The same three forms as
    :func:`head_view`; BertViz's positional order is ``model_view(attentions, tokens, sentence_b_start,
    prettify_tokens, display_mode)``, and it takes ``include_heads`` but no ``heads``."""
    return _view("model", arguments, options)


def neuron_view(*arguments: Any, **options: Any) -> View | PageHTML | None:
    """Query, key, q×k, q·k and softmax for one layer, head and query token, of a text or of an
    :class:`Attention` captured with ``qk=True`` (attention tensors have no query and key vectors)."""
    return _view("neuron", arguments, options)
