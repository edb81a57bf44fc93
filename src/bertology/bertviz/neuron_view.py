"""BertViz's ``neuron_view.show``, drawn by bertology's neuron view."""

from __future__ import annotations

from typing import Any

from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.views import PageHTML, View, neuron_view

#: The model types BertViz's ``show`` takes (it picked a tokenization template by them).
BERTVIZ_MODEL_TYPES = ("bert", "gpt2", "xlnet", "roberta")


def show(
    model: Any,
    model_type: str,
    tokenizer: Any,
    sentence_a: str,
    sentence_b: str | None = None,
    display_mode: str = "dark",
    layer: int | None = None,
    head: int | None = None,
    html_action: str = "view",
) -> View | PageHTML | None:
    """BertViz's ``show(model, model_type, tokenizer, sentence_a, sentence_b, display_mode, layer, head,
    html_action)``: the neuron view of ``sentence_a`` (and ``sentence_b``, with the Sentence A / B filter)
    for a transformers ``model`` object and its ``tokenizer`` (or a bertology model name, path or
    :class:`~bertology.models.loading.LoadedModel` with ``tokenizer=None``).

    The input is built by the tokenizer's own template (``tokenizer(sentence_a, sentence_b)``), so
    ``model_type`` (BertViz's ``"bert"``, ``"gpt2"``, ``"xlnet"``, ``"roberta"``, or the model's own type)
    is only checked. ``html_action``: ``"view"`` (BertViz's default) shows the page in the notebook,
    ``"return"`` gives a :class:`~bertology.views.PageHTML` (``.data`` is the page).

    Raises:
        BertologyError: an unknown ``model_type``, or anything :func:`bertology.neuron_view` refuses.
    """
    config = getattr(model.model if isinstance(model, LoadedModel) else model, "config", None)
    own_type = getattr(config, "model_type", None)
    if model_type not in (*BERTVIZ_MODEL_TYPES, own_type):
        raise BertologyError(
            f"model_type {model_type!r} is none of BertViz's ({', '.join(BERTVIZ_MODEL_TYPES)})"
            + (f" nor the model's own ({own_type})." if own_type else ".")
        )
    return neuron_view(
        sentence_a,
        sentence_b,
        model=model,
        tokenizer=tokenizer,
        display_mode=display_mode,
        layer=layer,
        head=head,
        html_action=html_action,
    )
