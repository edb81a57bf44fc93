"""The views of every model type added in issue 14, in headless Chromium, against the captured attention.

The six BERT-family architectures and GPT-2 are covered by ``test_views_models_browser.py``, whose page
helpers these tests reuse: what the page shows is read back through its API and compared with
``Attention.probs`` as captured from the model's own attention.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.browser import ViewPage
from support.tiny_models import DECODERS, MORE_ENCODERS
from support.view_readback import NEURON_TOLERANCE, assert_head_view_shows, neuron_shown

import bertology
from bertology.views.build import view_data

pytestmark = pytest.mark.browser

TEXT = "The quick brown fox jumps."
TEXT_B = "It was not amused."
#: Within the 8-token sliding windows of the tiny Mistral and Gemma 3.
SHORT = "The cat sat."


@pytest.mark.parametrize("model_type", [*MORE_ENCODERS, *DECODERS])
def test_head_view_opens_and_shows_the_captured_weights(
    model_type: str, tiny_model_dirs: dict[str, Path], open_page: Callable[..., ViewPage]
) -> None:
    model = bertology.load_model(tiny_model_dirs[model_type])
    pair = () if model.kind == "decoder" else (TEXT_B,)
    attention = bertology.capture(TEXT, *pair, model=model)
    view = open_page(view_data(attention, "head"), "head")
    assert_head_view_shows(view, attention.probs)
    assert ("· causal" in view.js("document.body.innerText")) == (model.kind == "decoder")  # the subtitle
    view.assert_clean()


@pytest.mark.parametrize("model_type", ["megatron-bert", "roformer", *(t for t in DECODERS if t != "gemma2")])
def test_neuron_view_softmax_equals_the_captured_probabilities(
    model_type: str, tiny_model_dirs: dict[str, Path], open_page: Callable[..., ViewPage]
) -> None:
    """The module route's queries and keys, and the decoders' causal grouped-query attention (each query
    head shown with its key/value group's keys): the page's softmax is the model's attention."""
    model = bertology.load_model(tiny_model_dirs[model_type])
    attention = bertology.capture(SHORT, model=model, qk=True)
    view = open_page(view_data(attention, "neuron"))
    shown = neuron_shown(view, attention)
    np.testing.assert_allclose(shown["probs"], attention.probs, atol=NEURON_TOLERANCE)
    n = attention.probs.shape[-1]
    later = np.triu(np.ones((n, n), dtype=bool), k=1)
    assert (shown["masked"] == (later if model.kind == "decoder" else np.zeros_like(later))).all()
    view.assert_clean()
