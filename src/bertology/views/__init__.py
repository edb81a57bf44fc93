"""Head, model and neuron views: one self-contained HTML page each, also shown inline in notebooks."""

from __future__ import annotations

import html
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from bertology.capture import Attention, capture
from bertology.capture_seq2seq import AttentionSetName, Seq2SeqAttention, capture_seq2seq
from bertology.errors import BertologyError
from bertology.inputs import Text
from bertology.models import KIND_PHRASES, LoadedModel, resolve_model
from bertology.norms import Weights
from bertology.views.build import VIEW_KINDS, Theme, ViewKind, seq2seq_view_data, view_data
from bertology.views.page import render_page

__all__ = ["VIEW_KINDS", "View", "head_view", "model_view", "neuron_view", "render_view", "seq2seq_view"]

_TITLES = {"head": "Head view", "model": "Model view", "neuron": "Neuron view"}

#: The tallest a notebook frame grows (px); a taller view scrolls inside it, its header rows sticky.
MAX_FRAME_HEIGHT = 2400
_TOOLBAR_HEIGHT = 130  # px: toolbar, hint and status lines, about
_ROW_HEIGHT = 18  # px per token row (views.css --bt-row)
_THUMBNAIL_ROW = 70  # px per layer of the model view's grid at a notebook's width, about

# Beside the frame: size it to the height its page reports (views.js reportHeight), up to the cap. The
# page is sandboxed (no same origin), so only a message can say how tall it is.
_FRAME_SIZER = """<script>(() => {
  const frame = document.getElementById("%(id)s");
  const resize = (event) => {
    if (!frame.isConnected) return removeEventListener("message", resize);
    const height = event.source === frame.contentWindow && Number(event.data && event.data.bertologyHeight);
    if (height > 0) frame.style.height = Math.min(Math.ceil(height), %(cap)d) + "px";
  };
  addEventListener("message", resize);
})();</script>"""


@dataclass
class View:
    """A rendered view: ``.html`` is the whole page, ``.save(path)`` writes it, notebooks show it inline."""

    kind: ViewKind
    data: dict[str, Any]

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
        """How many tokens the view shows, in words: "19 tokens" or "9 source and 20 target tokens"."""
        sets = {entry["name"]: entry for entry in self.data.get("attentionSets", [])}
        if "cross" in sets:
            return f"{len(sets['cross']['keyTokens'])} source and {sets['cross']['n']} target tokens"
        return f"{self.data['n']} tokens"

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
        # An iframe keeps the page's script, styles and strict CSP apart from the notebook's; the script
        # beside it sizes it to its content.
        frame_id = f"bertology-{uuid.uuid4().hex}"
        return (
            f'<iframe id="{frame_id}" srcdoc="{html.escape(self.html, quote=True)}" '
            'sandbox="allow-scripts allow-downloads" '
            f'style="width:100%;height:{self.estimated_height}px;border:0" title="bertology view"></iframe>'
        ) + _FRAME_SIZER % {"id": frame_id, "cap": MAX_FRAME_HEIGHT}


def render_view(
    source: Attention | Text,
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
) -> View:
    """Build a view from a captured :class:`Attention`, or capture ``source`` (and ``text_b``) first.

    weights: when capturing, show the softmax output (``"attention"``) or the norm-based weights
    (``"norm"``, :mod:`bertology.norms`; the neuron view shows them beside the softmax).
    head_names: labels shown instead of the head numbers (one per head).
    A decoder-only model's attention is drawn as causal. An encoder-decoder model takes ``source`` and
    ``target`` texts and shows ``attention_set`` first (see :func:`seq2seq_view`).
    """
    if isinstance(source, Attention):
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
        attention = capture(source, text_b, model=loaded, qk=kind == "neuron", weights=weights)
    data = view_data(attention, kind, layer=layer, head=head, query=query, theme=theme, head_names=head_names)
    return View(kind, data)


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


def head_view(source: Attention | Text, text_b: Text | None = None, **options: Any) -> View:
    """All heads of one layer as lines between token columns (see :func:`render_view` for options)."""
    return render_view(source, text_b, kind="head", **options)


def model_view(source: Attention | Text, text_b: Text | None = None, **options: Any) -> View:
    """Every layer x head as a thumbnail in one grid; click one to enlarge it."""
    return render_view(source, text_b, kind="model", **options)


def neuron_view(source: Attention | Text, text_b: Text | None = None, **options: Any) -> View:
    """Query, key, q×k, q·k and softmax for one layer, head and query token."""
    return render_view(source, text_b, kind="neuron", **options)
