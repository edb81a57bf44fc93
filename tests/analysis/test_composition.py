"""Composition scores: equal to the formulas computed here from the weight matrices (a tiny llama with
grouped-query attention, a tiny BERT, ModernBERT's fused and GPT-2's Conv1D projections), known answers
on constructed weights, and ``heads --composition``.

Tolerances: composition scores are Frobenius norms of products of float64 copies of the weights, here and
in the test's own products, in another order: rtol 1e-9; a score that is 0 by construction, 1e-12.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import bertology
from bertology.analysis.composition import composition_scores
from bertology.cli import app
from bertology.models.loading import LoadedModel
from bertology.server.runs import RunsFolder

#: Both sides are float64 from the same float32 weights, the library's through QR factors of the circuits (a
#: backward-stable QR keeps the Frobenius norms to ~d u64, u64 = 2^-53 ~ 1.1e-16, d = 32: ~4e-15; seen 1e-15).
FLOAT64_REORDERED = 1e-9


def frobenius_score(left: torch.Tensor, right: torch.Tensor) -> float:
    """||L R||_F / (||L||_F ||R||_F) of two [d_model, d_model] matrices."""
    return float(torch.linalg.norm(left @ right) / torch.linalg.norm(left) / torch.linalg.norm(right))


def circuits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, heads: int, kv_heads: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per query head, (W_QK, W_OV) [d_model, d_model] (residual vectors as rows) from a layer's nn.Linear
    weights ``q`` [heads * d, d_model], ``k``, ``v`` [kv_heads * d, d_model], ``o`` [d_model, heads * d]."""
    q, k, v, o = (weight.detach() for weight in (q, k, v, o))
    d = q.shape[0] // heads
    qk, ov = [], []
    for head in range(heads):
        shared = head // (heads // kv_heads)
        w_q = q[head * d : (head + 1) * d].T.double()
        w_k = k[shared * d : (shared + 1) * d].T.double()
        w_v = v[shared * d : (shared + 1) * d].T.double()
        w_o = o[:, head * d : (head + 1) * d].T.double()
        qk.append(w_q @ w_k.T)
        ov.append(w_v @ w_o)
    return qk, ov


def expected_scores(
    layers: list[tuple[torch.Tensor, ...]], heads: int, kv_heads: int
) -> dict[str, np.ndarray]:
    per_layer = [circuits(*weights, heads, kv_heads) for weights in layers]
    count = len(layers)
    expected = {kind: np.full((count, heads, count, heads), np.nan) for kind in "qkv"}
    for a in range(count):
        for b in range(a + 1, count):
            for ha in range(heads):
                for hb in range(heads):
                    ov_a = per_layer[a][1][ha]
                    qk_b, ov_b = per_layer[b][0][hb], per_layer[b][1][hb]
                    expected["q"][a, ha, b, hb] = frobenius_score(ov_a, qk_b)
                    expected["k"][a, ha, b, hb] = frobenius_score(ov_a, qk_b.T)
                    expected["v"][a, ha, b, hb] = frobenius_score(ov_a, ov_b)
    return expected


def test_llama_with_grouped_query_attention(loaded_types: Callable[[str], LoadedModel]) -> None:
    loaded: LoadedModel = loaded_types("llama")
    config = loaded.model.config
    assert config.num_key_value_heads < config.num_attention_heads
    layers = [
        (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight)
        for a in (layer.self_attn for layer in loaded.model.base_model.layers)
    ]
    expected = expected_scores(layers, config.num_attention_heads, config.num_key_value_heads)
    scores = composition_scores(loaded)
    for kind in "qkv":
        np.testing.assert_allclose(scores.scores[kind], expected[kind], rtol=FLOAT64_REORDERED)
    assert np.nanmin(scores.scores["q"]) > 0  # random weights compose a little everywhere


def test_bert(loaded_types: Callable[[str], LoadedModel]) -> None:
    loaded: LoadedModel = loaded_types("bert")
    config = loaded.model.config
    layers = [
        (s.self.query.weight, s.self.key.weight, s.self.value.weight, s.output.dense.weight)
        for s in (layer.attention for layer in loaded.model.base_model.encoder.layer)
    ]
    expected = expected_scores(layers, config.num_attention_heads, config.num_attention_heads)
    scores = composition_scores(loaded)
    for kind in "qkv":
        np.testing.assert_allclose(scores.scores[kind], expected[kind], rtol=FLOAT64_REORDERED)
    frame = scores.to_frame()
    pairs = sum(range(config.num_hidden_layers)) * config.num_attention_heads**2
    assert len(frame) == 3 * pairs and list(frame.columns) == [
        "layer_a", "head_a", "layer_b", "head_b", "kind", "score"
    ]  # fmt: skip
    assert (frame["layer_b"] > frame["layer_a"]).all()


def test_orthogonal_subspaces_give_zero_and_shared_ones_give_known_scores(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """Layer 0 head 0 writes only to residual features 0..7; layer 1's head 0 reads its queries there
    (Q-composition 1/sqrt(8) with identity blocks: ||I_8||_F / (||I_8||_F ||I_8||_F)), its keys and
    values elsewhere (0)."""
    loaded = bertology.load_model(tiny_model_dirs["llama"])  # its own copy: the weights are changed
    config = loaded.model.config
    d, heads = config.head_dim, config.num_attention_heads
    assert d == 8
    first, second = (layer.self_attn for layer in loaded.model.base_model.layers[:2])
    with torch.no_grad():
        for module in (first, second):
            for projection in (module.q_proj, module.k_proj, module.v_proj, module.o_proj):
                projection.weight.zero_()
        block = torch.eye(d)
        first.v_proj.weight[:d, :d] = block  # key/value head 0, read by query heads 0 and 1
        first.o_proj.weight[:d, :d] = block  # query head 0 writes features 0..7
        first.q_proj.weight[:d, :d] = block
        first.k_proj.weight[:d, :d] = block
        second.q_proj.weight[:d, :d] = block  # query head 0 reads features 0..7
        second.k_proj.weight[:d, d : 2 * d] = block  # its keys read features 8..15
        second.v_proj.weight[:d, 2 * d : 3 * d] = block
        second.o_proj.weight[:d, :d] = block
    scores = composition_scores(loaded)
    assert scores.scores["q"][0, 0, 1, 0] == pytest.approx(1 / np.sqrt(d))
    # Exact by construction: the identity blocks read features the writing head leaves at exactly 0.
    assert scores.scores["k"][0, 0, 1, 0] == pytest.approx(0.0, abs=1e-12)
    assert scores.scores["v"][0, 0, 1, 0] == pytest.approx(0.0, abs=1e-12)
    assert scores.top("q", 1)[0][:4] == (0, 0, 1, 0)
    assert heads == 4


def test_heads_composition_command(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "composition"
    result = CliRunner().invoke(
        app, ["heads", str(tiny_model_dirs["bert"]), "--composition", "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert "Strongest composition" in result.output
    table = pd.read_csv(output / "composition.csv")
    loaded = bertology.load_model(tiny_model_dirs["bert"])
    expected = composition_scores(loaded).to_frame()
    # Exact by construction: the CSV keeps every float64 digit (pandas writes repr); 1e-9 hides nothing.
    np.testing.assert_allclose(table["score"], expected["score"], rtol=1e-9)
    stored = json.loads((output / "composition.json").read_text())
    assert set(stored["scores"]) == {"q", "k", "v"}
    for kind in "qkv":
        assert (output / "plots" / f"composition_{kind}.png").read_bytes().startswith(b"\x89PNG")
    assert "Q-composition" in (output / "report.html").read_text()
    listed = RunsFolder(tmp_path).runs()  # marked as a `composition` run of its model, and listed so
    assert [(run.path, run.kind, run.model) for run in listed] == [
        ("composition", "composition", loaded.name)
    ]


def test_modernbert_with_its_fused_projection(loaded_types: Callable[[str], LoadedModel]) -> None:
    loaded = loaded_types("modernbert")
    config = loaded.model.config
    width = config.hidden_size  # heads * head_dim: Wqkv stacks q, k, v rows
    layers = [
        (*layer.attn.Wqkv.weight.split(width), layer.attn.Wo.weight)
        for layer in loaded.model.base_model.layers
    ]
    expected = expected_scores(layers, config.num_attention_heads, config.num_attention_heads)
    scores = composition_scores(loaded)
    for kind in "qkv":
        np.testing.assert_allclose(scores.scores[kind], expected[kind], rtol=FLOAT64_REORDERED)


def test_gpt2_with_its_conv1d_projections(loaded_types: Callable[[str], LoadedModel]) -> None:
    """GPT-2's Conv1D weights are [in, out] (``y = x W + b``): transposed to nn.Linear's [out, in] here, its
    ``c_attn`` split into q, k and v columns."""
    loaded = loaded_types("gpt2")
    config = loaded.model.config
    width = config.hidden_size
    layers = [
        (*(w.T for w in block.attn.c_attn.weight.split(width, dim=1)), block.attn.c_proj.weight.T)
        for block in loaded.model.base_model.h
    ]
    expected = expected_scores(layers, config.num_attention_heads, config.num_attention_heads)
    scores = composition_scores(loaded)
    for kind in "qkv":
        np.testing.assert_allclose(scores.scores[kind], expected[kind], rtol=FLOAT64_REORDERED)
