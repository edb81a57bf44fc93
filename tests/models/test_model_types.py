"""Every supported model type: the table, capture equal to the model's own ``output_attentions`` (both
routes), streaming, a view, a corpus analysis, decoders' causal and grouped-query attention, and the
one-sentence refusals."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.ci_rules import REPOSITORY
from support.tiny_models import DECODERS, GENERATIVE_ARCHITECTURES, SINGLE_STACK_TYPES
from transformers import AutoConfig, AutoModel

import bertology
from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.capturing import encode_for_model, stream_batch
from bertology.models.loading import LoadedModel
from bertology.models.model_types import FEATURES, MODEL_TYPES, REFUSED, features
from bertology.views.build import view_data

TEXTS = ["Unbelievably, the quick brown fox jumps over the lazy dog.", "I went to the store."]
#: Short enough that the pair (TEXTS[0], SECOND) fits the tiny models' 62-64 positions untruncated.
SECOND = "I bought figs."
#: A text short enough for the 8-token sliding windows of the tiny Mistral and Gemma 2 / 3.
SHORT = "The cat sat."


def test_the_table_covers_every_tiny_model_and_says_why_a_neuron_view_is_refused() -> None:
    assert set(MODEL_TYPES) == {*SINGLE_STACK_TYPES, "bart", "t5"}
    assert set(GENERATIVE_ARCHITECTURES) <= set(MODEL_TYPES)
    for name, entry in MODEL_TYPES.items():
        assert entry.route == ("module" if entry.module_route else "interface")
        if entry.module_route is not None and entry.module_route.queries_keys is None:
            assert entry.no_neuron_view, name  # no q and k: the table must say why
        assert list(features(name)) == list(FEATURES)
    assert {name for name, entry in MODEL_TYPES.items() if entry.route == "module"} == {
        "deberta",
        "deberta-v2",
        "mpnet",
        "megatron-bert",
        "roformer",
    }
    assert not features("llama")["probes"] and features("llama")["analysis"]
    assert not features("mpnet")["neuron view"] and features("megatron-bert")["neuron view"]


@pytest.mark.parametrize("model_type", SINGLE_STACK_TYPES)
def test_capture_equals_output_attentions_and_streams_views_and_analyses(
    model_type: str,
    tiny_model_dirs: dict[str, Path],
    loaded_types: Callable[[str], LoadedModel],
    sample_corpus_head: Callable[[int], Path],
) -> None:
    loaded = loaded_types(model_type)
    assert loaded.model_type == model_type and loaded.kind == MODEL_TYPES[model_type].kind
    decoder = loaded.kind == "decoder"
    seconds = None if decoder else [SECOND, None]
    batch = bertology.capture_batch(TEXTS, seconds, model=loaded)

    reference = AutoModel.from_pretrained(tiny_model_dirs[model_type], attn_implementation="eager").eval()
    with torch.no_grad():
        outputs = reference(**loaded.model_inputs(batch.encoded), output_attentions=True)
    expected = torch.stack(outputs.attentions, dim=1)
    assert batch.probs.shape == expected.shape
    assert batch.probs.shape[1:3] == (loaded.num_layers, loaded.num_heads)
    for index, n in enumerate(batch.lengths):
        # padded batch against transformers' own pass: float32 matmuls blocked differently, weights <= 1
        # differ by a few units of 2^-24 per layer; 1e-5 leaves a margin
        np.testing.assert_allclose(batch.probs[index, ..., :n, :n], expected[index, ..., :n, :n], atol=1e-5)

    streamed: list[torch.Tensor] = []
    stream_batch(
        encode_for_model(loaded, TEXTS, seconds),
        lambda encoded: lambda probs: streamed.append(probs.clone()),
        model=loaded,
    )
    assert len(streamed) == loaded.num_layers
    torch.testing.assert_close(torch.stack(streamed, dim=1), batch.probs)

    attention = batch[1]
    data = view_data(attention, "head")
    assert data["layers"] == loaded.num_layers and data["tokens"] == attention.tokens
    assert data.get("causal", False) == decoder
    if decoder:  # causal: nothing above the diagonal, and one text without [CLS] / [SEP] roles
        assert not np.triu(attention.probs, k=1).any() and not attention.is_pair

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = analyze_corpus(
            sample_corpus_head(6), loaded, AnalysisSettings(max_length=48, js_tokens_per_segment=2)
        )
    heads = analysis.heads_frame()
    assert len(heads) == loaded.num_layers * loaded.num_heads
    assert np.isfinite(heads["entropy"]).all() and np.isfinite(heads["previous"]).all()
    if decoder:  # the next token and [CLS] / [SEP] are never attendable: undefined, not 0
        assert heads[["next", "cls", "sep"]].isna().all().all()
    else:
        assert np.isfinite(heads[["next", "cls", "sep"]]).all().all()


def test_modernbert_local_layers_attend_within_their_window(
    loaded_types: Callable[[str], LoadedModel],
) -> None:
    """Layer 0 is global; layers 1 and 2 see keys at most 4 positions away (local_attention=8)."""
    attention = bertology.capture(TEXTS[0], model=loaded_types("modernbert"))
    n = len(attention.tokens)
    distance = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    assert n > 10 and (attention.probs[0][:, distance > 4] > 0).all()
    assert not attention.probs[1:][:, :, distance > 4].any()


@pytest.mark.parametrize(
    "model_type", ["megatron-bert", "roformer", "gpt2", *(name for name in DECODERS if name != "gemma2")]
)
def test_queries_and_keys_give_the_captured_probabilities(
    model_type: str, loaded_types: Callable[[str], LoadedModel]
) -> None:
    """What the neuron view recomputes, softmax(q·k * scaling + mask), equals the captured attention: the
    module route's recomputed q and k (RoFormer's rotated ones), and the decoders' causal, grouped-query
    attention, where each query head's key is its key/value group's."""
    loaded = loaded_types(model_type)
    attention = bertology.capture(SHORT, model=loaded, qk=True)
    n = len(attention.tokens)
    scores = (
        np.einsum("lhqd,lhkd->lhqk", attention.queries, attention.keys)
        * attention.scaling[:, None, None, None]
    )
    if loaded.kind == "decoder":
        scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scores)
    recomputed = torch.softmax(torch.from_numpy(scores), dim=-1).numpy()
    # the softmax recomputed from the stored float32 queries and keys in float64 (einsum): the model's
    # own float32 scores differ by about sqrt(d)·2^-24·|q||k|; 1e-5 on weights <= 1
    np.testing.assert_allclose(recomputed, attention.probs, atol=1e-5)
    groups = getattr(loaded.model.config, "num_key_value_heads", None)
    if groups is not None and groups < loaded.num_heads:  # shared keys: equal within a group
        per_group = loaded.num_heads // groups
        np.testing.assert_array_equal(attention.keys[:, 0], attention.keys[:, per_group - 1])


@pytest.mark.parametrize(
    ("model_type", "text", "refusal"),
    [
        ("mpnet", SHORT, "MPNet adds relative-position terms to q·k"),
        ("deberta-v2", SHORT, "DeBERTa-v2/v3 adds relative-position terms"),
        ("gemma2", SHORT, "Gemma 2 caps its attention scores"),
        ("mistral", TEXTS[0], "takes at most 8 tokens"),
    ],
)
def test_neuron_view_is_refused_where_q_k_is_not_the_attention(
    model_type: str, text: str, refusal: str, loaded_types: Callable[[str], LoadedModel]
) -> None:
    loaded = loaded_types(model_type)
    with pytest.raises(bertology.BertologyError, match=refusal):
        bertology.capture(text, model=loaded, qk=True)
    assert bertology.capture(text, model=loaded).probs.shape[0] == loaded.num_layers  # the other views work


def test_a_decoder_reads_one_text(loaded_types: Callable[[str], LoadedModel]) -> None:
    with pytest.raises(bertology.BertologyError, match="a decoder model reads one running text"):
        bertology.capture("One text.", "Another text.", model=loaded_types("llama"))


def _save_config(model_type: str, directory: Path) -> Path:
    config = AutoConfig.for_model(model_type)
    config.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("model_type", [*REFUSED, "xlnet", "clip"])
def test_unsupported_types_get_one_sentence(model_type: str, tmp_path: Path) -> None:
    """Every type the README names as unsupported (and any other) is refused in one sentence that names
    the type and what is supported, before any weights load."""
    with pytest.raises(bertology.BertologyError) as refused:
        bertology.load_model(_save_config(model_type, tmp_path))
    message = str(refused.value)
    assert f"is a '{model_type}' model, which bertology does not support" in message
    assert "\n" not in message and message.endswith(".")
    if model_type in REFUSED:
        assert REFUSED[model_type] in message
    else:
        assert "encoders: BERT, RoBERTa" in message and "decoders: GPT-2, Llama" in message


def _readme_rows() -> dict[str, list[str]]:
    """The README's table of supported model types: model_type -> its row's cells after the name."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    table = readme.split("### Supported model types", 1)[1].split("\n\n")[2]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines()[2:]:
        names, *cells = (cell.strip() for cell in line.strip("|").split("|"))
        for name in re.sub(r"\(.*?\)", "", names).split(","):
            rows[name.strip()] = cells
    return rows


def test_readme_table_lists_every_type_with_its_features() -> None:
    rows = _readme_rows()
    assert set(rows) == set(MODEL_TYPES)
    for name, (kind, route, neuron, analysis, probes, interventions) in rows.items():
        entry, has = MODEL_TYPES[name], features(name)
        assert (kind, route) == (entry.kind, entry.route), name
        assert neuron.startswith("no") != has["neuron view"], name
        for cell, feature in ((analysis, "analysis"), (probes, "probes"), (interventions, "interventions")):
            assert (cell == "yes") == has[feature], (name, feature)
        # an encoder-decoder's heads are gated in three stacks; norm weights are for single stacks
        assert has["norm weights"] == (has["interventions"] and entry.kind != "encoder-decoder")
