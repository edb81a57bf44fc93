"""Every view of every kind of model, in headless Chromium, against the probabilities the model computed.

Each page is built from a real capture of a small random model of each architecture (encoders, GPT-2,
BART and T5). What the page shows is read back through its API (the neuron view's softmax column, the
weight boxes beside the tokens of the head view and of the model view's enlarged head) and compared with
``Attention.probs`` as captured from the model's own attention, never with a re-derivation of the
page's formula.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.browser import ViewPage
from support.tiny_models import ARCHITECTURES, save_tiny_model
from support.view_readback import CODE_TOLERANCE, NEURON_TOLERANCE, assert_head_view_shows, neuron_shown

import bertology
from bertology.attention.seq2seq import ATTENTION_SETS, capture_seq2seq
from bertology.models.loading import LoadedModel
from bertology.views import seq2seq_view
from bertology.views.build import view_data

pytestmark = pytest.mark.browser

TEXT = "The quick brown fox jumps over the lazy dog."
TEXT_B = "It was not amused."
# The enlarged head's weight boxes: [layers][heads][query][key] (one head, so one box per key).
DETAIL_JS = """({layers, heads, n}) => {
  const api = window.bertology;
  const out = [];
  for (let layer = 0; layer < layers; layer++) {
    const perHead = [];
    for (let head = 0; head < heads; head++) {
      api.openDetail(layer, head);
      const rows = [];
      for (let query = 0; query < n; query++) {
        api.focusToken("left", query);
        rows.push(api.weightBoxes().rows.map((boxes) => boxes[0]));
      }
      perHead.push(rows);
    }
    out.push(perHead);
  }
  api.closeDetail();
  return out;
}"""


@pytest.fixture(scope="module")
def generative_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generative_models")
    return {name: save_tiny_model(name, root) for name in ("gpt2", "bart", "t5")}


def _model(
    architecture: str, tiny_model_dirs: dict[str, Path], generative_dirs: dict[str, Path]
) -> LoadedModel:
    directory = generative_dirs.get(architecture) or tiny_model_dirs[architecture]
    return bertology.load_model(directory)


@pytest.mark.parametrize("architecture", [*ARCHITECTURES, "gpt2"])
def test_head_and_model_view_show_the_captured_weights(
    architecture: str,
    tiny_model_dirs: dict[str, Path],
    generative_dirs: dict[str, Path],
    open_page: Callable[..., ViewPage],
) -> None:
    model = _model(architecture, tiny_model_dirs, generative_dirs)
    pair = (TEXT_B,) if architecture != "gpt2" else ()
    attention = bertology.capture(TEXT, *pair, model=model)
    layers, heads, n, _ = attention.probs.shape

    head = open_page(view_data(attention, "head"), "head")
    assert_head_view_shows(head, attention.probs)
    head.assert_clean()

    model_view = open_page(view_data(attention, "model"), "model")
    shown = np.array(model_view.js(DETAIL_JS, {"layers": layers, "heads": heads, "n": n}))
    np.testing.assert_allclose(shown, attention.probs, atol=CODE_TOLERANCE)
    model_view.assert_clean()


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_encoder_decoder_views_show_the_captured_weights_of_every_set(
    architecture: str, generative_dirs: dict[str, Path], open_page: Callable[..., ViewPage]
) -> None:
    model = bertology.load_model(generative_dirs[architecture])
    attention = capture_seq2seq(TEXT, "She bought fresh strawberries at the store.", model=model)
    view = open_page(seq2seq_view(attention, kind="head").data)
    for name in ATTENTION_SETS:
        view.js("(name) => window.bertology.setAttentionSet(name)", name)
        assert_head_view_shows(view, attention.probs(name))
    view.assert_clean()


@pytest.mark.parametrize("architecture", [*ARCHITECTURES, "gpt2"])
def test_neuron_view_softmax_equals_the_captured_probabilities(
    architecture: str,
    tiny_model_dirs: dict[str, Path],
    generative_dirs: dict[str, Path],
    open_page: Callable[..., ViewPage],
) -> None:
    """For GPT-2 the softmax runs over the query's own and earlier keys only (later ones are masked):
    over all keys it gave 20 weights of about 0.05 where the model has [0.502, 0.498, 0, ...]."""
    model = _model(architecture, tiny_model_dirs, generative_dirs)
    attention = bertology.capture(TEXT, model=model, qk=True)
    view = open_page(view_data(attention, "neuron"))
    shown = neuron_shown(view, attention)
    np.testing.assert_allclose(shown["probs"], attention.probs, atol=NEURON_TOLERANCE)
    n = attention.probs.shape[-1]
    later = np.triu(np.ones((n, n), dtype=bool), k=1)
    causal = architecture == "gpt2"
    assert (shown["masked"] == (later if causal else np.zeros_like(later))).all()
    view.assert_clean()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_neuron_view_of_padded_pairs_and_norm_based_weights(
    architecture: str, tiny_model_dirs: dict[str, Path], open_page: Callable[..., ViewPage]
) -> None:
    """A pair that was padded in a batch (its keys past its length dropped) and norm-based weights
    (softmax x ||f(x)||, rows normalised) both show what the model computed."""
    model = bertology.load_model(tiny_model_dirs[architecture])
    texts, texts_b = ["Short.", TEXT], [TEXT_B, "And a longer second text."]
    padded = bertology.capture_batch(texts, texts_b, model=model, qk=True)
    assert padded.lengths[0] < padded.probs.shape[-1]  # the first pair is padded in its batch
    pair = padded[0]
    shown = neuron_shown(open_page(view_data(pair, "neuron"), "pair"), pair)
    np.testing.assert_allclose(shown["probs"], pair.probs, atol=NEURON_TOLERANCE)

    norm = bertology.capture(TEXT, TEXT_B, model=model, qk=True, weights="norm")
    softmax = bertology.capture(TEXT, TEXT_B, model=model)
    view = open_page(view_data(norm, "neuron"), "norm")
    shown = neuron_shown(view, norm)
    np.testing.assert_allclose(shown["probs"], softmax.probs, atol=NEURON_TOLERANCE)
    np.testing.assert_allclose(shown["normWeights"], norm.probs, atol=NEURON_TOLERANCE)
    view.assert_clean()
