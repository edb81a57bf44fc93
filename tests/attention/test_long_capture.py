"""Long inputs captured by queries and keys: rows computed in chunks equal the model's own eager
``output_attentions`` (padding, causal, sliding-window and grouped-query attention), pooled thumbnails
and blocks equal the same slices of them, ``capture``'s modes and refusals, and corpus statistics equal
between the chunked and the full path.

Tolerances: rows computed in chunks from stored queries and keys against the model's own float32 eager
softmax: scores of d-wide float32 dot products in another order, weights <= 1 within atol 1e-5; float16
queries and keys (relative 2^-11 each, through the softmax) within 2e-3; corpus statistics of the two paths
(float64 sums of those weights) within rtol 1e-5, atol 1e-6, and the JS sums (logarithms of weights near 0
magnify the 1e-6) within rtol 1e-4, atol 1e-5.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import SINGLE_STACK_TYPES
from transformers import AutoModel

import bertology
from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.attention import long_capture
from bertology.attention.capturing import capture, capture_long_batch
from bertology.attention.long_capture import LongAttention
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.models.model_types import MODEL_TYPES

#: Two inputs of different lengths (the shorter is padded), longer than the tiny models' windows of 8.
TEXTS = [
    "Unbelievably, the quick brown fox jumps over the lazy dog near the riverbank again.",
    "I went to the store.",
]
SECOND = ["At the store, I bought fresh strawberries.", None]
#: A chunk of 4 heads x 3 rows x 64 keys in float32: every layer is cut into many blocks.
TINY_CHUNK = 4 * 4 * 3 * 64
#: Weights (<= 1) from this file's queries and keys against the model's own: both float32 softmax(q.k), the
#: layers before the last run by another kernel (fused against eager), so sums are reordered: a score moves by
#: ~sqrt(d) u |s| (u = 2^-24 ~ 6e-8), a weight by about as much; seen <= 2e-7, 1e-5 leaves a margin.
WEIGHTS_REORDERED = 1e-5
#: Statistics over such weights (float32 row sums, float64 means): as in tests/stats/test_stats_surface.py,
#: relative ~n u for rows of n <= 48 tokens; the atol for entries near 0.
STATISTICS_RTOL, STATISTICS_ATOL = 1e-5, 1e-6
#: Every type whose attention is softmax(q·k * scaling + mask) in the AttentionInterface: among them
#: ModernBERT (fused Wqkv, rotary, sliding-window layers of 8 tokens), Mistral (causal, a window of 8, 2
#: key/value heads for 4 query heads), Llama, Qwen and Gemma (rotary, grouped-query), GPT-2 (causal).
QK_TYPES = [
    name
    for name in SINGLE_STACK_TYPES
    if MODEL_TYPES[name].route == "interface" and not MODEL_TYPES[name].no_neuron_view
]


def _eager_attentions(directory: Path, loaded: LoadedModel, encoded: object) -> np.ndarray:
    """[batch, layers, heads, N, N]: the model's own eager ``output_attentions``, loaded afresh."""
    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        outputs = reference(**loaded.model_inputs(encoded), output_attentions=True)
    return torch.stack(outputs.attentions, dim=1).numpy()


@pytest.mark.filterwarnings("ignore::bertology.errors.TruncationWarning")  # cut to 62-64 tokens: still long
@pytest.mark.parametrize("model_type", QK_TYPES)
def test_rows_from_queries_and_keys_equal_the_models_eager_attention(
    model_type: str, tiny_model_dirs: dict[str, Path], loaded_types: Callable[[str], LoadedModel]
) -> None:
    loaded = loaded_types(model_type)
    seconds = None if loaded.kind == "decoder" else SECOND
    batch = capture_long_batch(TEXTS, seconds, model=loaded, chunk_bytes=TINY_CHUNK)
    expected = _eager_attentions(tiny_model_dirs[model_type], loaded, batch.encoded)
    assert len(batch.layers) == loaded.num_layers == expected.shape[1]
    window = getattr(loaded.model.config, "sliding_window", None)
    if window is not None:
        assert int(batch.lengths.max()) > 2 * window  # the windows hide keys in these inputs
    for index, attention in enumerate(batch):
        assert isinstance(attention, LongAttention)
        n = len(attention.tokens)
        want = expected[index, :, :, :n, :n]
        got = np.stack([attention.block(layer) for layer in range(attention.num_layers)])
        np.testing.assert_allclose(got, want, atol=WEIGHTS_REORDERED)
        # any block of rows, keys and heads is the same slice
        part = attention.block(1, rows=slice(3, n - 2), keys=slice(1, 9), heads=[2, 0])
        np.testing.assert_allclose(part, want[1][[2, 0], 3 : n - 2, 1:9], atol=WEIGHTS_REORDERED)
        # hidden keys (padding cut, causal, outside a window) get exactly 0, visible ones more
        for layer in range(attention.num_layers):
            visible = attention.visible(layer)
            assert (got[layer][:, ~visible] == 0).all() and (want[layer][:, ~visible] == 0).all()
        # max-pooled thumbnails: each cell the largest weight of its rows and keys
        size = 5
        edges = [(p * n) // size for p in range(size + 1)]
        thumbnails = attention.thumbnails(size)
        assert thumbnails.shape == (attention.num_layers, attention.num_heads, size, size)
        for i in range(size):
            for j in range(size):
                cell = want[:, :, edges[i] : edges[i + 1], edges[j] : edges[j + 1]].max(axis=(-2, -1))
                np.testing.assert_allclose(thumbnails[:, :, i, j], cell, atol=WEIGHTS_REORDERED)


def test_row_blocks_stay_within_the_chunk_and_keys_are_kept_once_per_group(
    loaded_types: Callable[[str], LoadedModel],
) -> None:
    loaded = loaded_types("mistral")
    batch = capture_long_batch(TEXTS, model=loaded)
    layer = batch.layers[0]
    assert layer.key.shape[1] == 2 and layer.query.shape[1] == 4  # grouped-query: 2 key/value heads
    starts = []
    for start, block in layer.row_blocks(TINY_CHUNK):
        assert block.numel() * 4 <= TINY_CHUNK
        starts.append((start, block.shape[2]))
    assert starts[0][0] == 0 and sum(rows for _, rows in starts) == layer.width
    attention = batch[0]
    head = 3  # query head 3 attends with key/value head 3 // 2 = 1
    np.testing.assert_array_equal(attention.key_vectors(0, head), layer.key[0, 1, : len(attention.tokens)])
    assert attention.query_vectors(0, head).shape == (len(attention.tokens), attention.head_dim)


def test_float16_queries_and_keys_halve_the_memory_and_stay_close(
    loaded_types: Callable[[str], LoadedModel],
) -> None:
    loaded = loaded_types("modernbert")
    full = capture_long_batch(TEXTS, SECOND, model=loaded)
    half = capture_long_batch(TEXTS, SECOND, model=loaded, qk_dtype=torch.float16)
    assert half.layers[0].query.dtype == torch.float16
    assert half.layers[0].query.element_size() * 2 == full.layers[0].query.element_size()
    # float16 queries and keys: each rounded by u16 = 2^-11 ~ 4.9e-4, so a score s by ~2 u16 |s| and a weight
    # p by <= 2 p max|ds| ~ 2e-3 for |s| <= 1, which the tiny model's scores are well under (seen 2e-6).
    np.testing.assert_allclose(half[0].block(2), full[0].block(2), atol=2e-3)


def test_capture_modes_choose_queries_and_keys_above_the_threshold(
    loaded_types: Callable[[str], LoadedModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = loaded_types("modernbert")
    probs = capture(TEXTS[0], model=loaded)
    assert isinstance(probs, bertology.Attention)  # 24 tokens: under the threshold
    monkeypatch.setattr(importlib.import_module("bertology.attention.capturing"), "LONG_INPUT_TOKENS", 16)
    long = capture(TEXTS[0], model=loaded)
    assert isinstance(long, LongAttention) and long.tokens == probs.tokens
    np.testing.assert_allclose(
        np.stack([long.block(layer) for layer in range(3)]), probs.probs, atol=WEIGHTS_REORDERED
    )
    assert isinstance(capture(TEXTS[1], model=loaded, mode="qk"), LongAttention)  # asked for: any length
    assert isinstance(capture(TEXTS[0], model=loaded, weights="norm"), bertology.Attention)
    with pytest.raises(BertologyError, match="Norm-based weights need every layer's probabilities"):
        capture(TEXTS[0], model=loaded, mode="qk", weights="norm")
    with pytest.raises(BertologyError, match="capture mode must be"):
        capture(TEXTS[0], model=loaded, mode="long")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("deberta", "adds relative-position terms"),
        ("megatron-bert", "computes its attention in its own code"),
        ("gemma2", "caps its attention scores"),
    ],
)
def test_models_whose_attention_is_not_qk_are_refused_in_one_sentence(
    model_type: str, reason: str, loaded_types: Callable[[str], LoadedModel]
) -> None:
    loaded = loaded_types(model_type)
    with pytest.raises(BertologyError, match=reason) as raised:
        capture("The cat sat.", model=loaded, mode="qk")
    assert str(raised.value).count(". ") == 0 and "long inputs" in str(raised.value)
    assert isinstance(capture("The cat sat.", model=loaded), bertology.Attention)  # auto: probabilities


@pytest.mark.parametrize("model_type", ["default", "modernbert", "qwen2"])
def test_statistics_are_equal_between_the_chunked_and_the_full_path(
    model_type: str,
    loaded_types: Callable[[str], LoadedModel],
    sample_corpus_head: Callable[[int], Path],
) -> None:
    loaded = bertology.load_model() if model_type == "default" else loaded_types(model_type)
    corpus = sample_corpus_head(30)
    runs = {
        mode: analyze_corpus(
            corpus,
            loaded,
            AnalysisSettings(
                max_length=48,
                limit=12,
                batch_size=4,
                js_tokens_per_segment=3,
                convention="clark",  # also the smoothed entropies, over the keys each query may see
                mode=mode,
                chunk_bytes=TINY_CHUNK,
            ),
        )
        for mode in ("probs", "qk")
    }
    full, chunked = runs["probs"], runs["qk"]
    assert chunked.segments == full.segments == 12
    for name, values in full.surface.columns.items():
        np.testing.assert_allclose(
            chunked.surface[name], values, rtol=STATISTICS_RTOL, atol=STATISTICS_ATOL, err_msg=name
        )
    for name, values in full.patterns.scores.columns.items():
        np.testing.assert_allclose(
            chunked.patterns.scores[name], values, rtol=STATISTICS_RTOL, atol=STATISTICS_ATOL, err_msg=name
        )
    assert chunked.distances.tokens == full.distances.tokens
    # Float64 JS of rows ~1e-7 apart (the two paths' weights): a JS moves by <= (ln 2 / 2) sum|dp| ~ 2e-6 over
    # 48 keys, its sum over 36 query tokens by up to ~6e-5, far less in practice (seen 9e-6); rtol 1e-4
    # covers the large sums, atol 1e-5 the sums near 0.
    np.testing.assert_allclose(chunked.distances.js_sum, full.distances.js_sum, rtol=1e-4, atol=1e-5)


def test_the_last_layer_runs_no_fused_attention(
    tiny_model_dirs: dict[str, Path],
    loaded_types: Callable[[str], LoadedModel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass ends at the last layer's attention, so only the layers before it run the fused kernel; the
    last layer's rows, computed from its queries and keys, are still the model's own."""
    loaded = loaded_types("bert")
    calls: list[int] = []
    fused = long_capture.sdpa_attention_forward

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(long_capture, "sdpa_attention_forward", counted)
    batch = capture_long_batch(TEXTS, SECOND, model=loaded)
    assert len(calls) == loaded.num_layers - 1
    expected = _eager_attentions(tiny_model_dirs["bert"], loaded, batch.encoded)
    last = loaded.num_layers - 1
    for index, attention in enumerate(batch):
        n = len(attention.tokens)
        np.testing.assert_allclose(
            attention.block(last), expected[index, last, :, :n, :n], atol=WEIGHTS_REORDERED
        )
