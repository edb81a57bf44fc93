"""Views of long inputs (:mod:`bertology.views.long`): a captured LongAttention gives a head, model and
neuron view whose weights equal the model's own eager attention, its window and minimap bounded, and the
report's example pages build from the long path.

Tolerances: the pages carry weights as 8-bit codes (CODE_ERROR, half a step; plus 1e-5 where a code holds a
float32 sum); weights, pooled cells and blocks computed from stored queries and keys against the model's own
float32 eager softmax, atol 1e-5 (dot products in another order), the same block pooled twice 1e-6, one
row's sums against a block's rtol 1e-5, atol 1e-7; a softmax of float16 vectors (relative 2^-11 per
element, magnified by the scores' size) within 2e-2.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.transfers import HostTransfers
from transformers import AutoModel

import bertology
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.capturing import capture, encode_for_model
from bertology.attention.long_capture import LongAttention
from bertology.errors import BertologyError
from bertology.views import head_view, model_view, neuron_view
from bertology.views.long import layer_summaries
from bertology.views.payload import ATTENTION_SCALE, unpack

TEXT = "Unbelievably, the quick brown fox jumps over the lazy dog near the riverbank again and again."
#: Half an 8-bit code (0.5 / 255 ~ 2e-3), plus 1e-6 for the float32 weights of the two paths (~2e-7 apart).
CODE_ERROR = 0.5 / ATTENTION_SCALE + 1e-6
#: Weights from the captured queries and keys against the model's eager ones: float32 softmax(q.k) with sums
#: reordered (another kernel for the earlier layers), ~sqrt(d) u |s| (u = 2^-24); seen <= 2e-7.
WEIGHTS_REORDERED = 1e-5


def _eager(directory: Path, attention: LongAttention, loaded: bertology.LoadedModel) -> np.ndarray:
    """[layers, heads, n, n]: the model's own eager ``output_attentions`` for the same tokens."""
    encoded = encode_for_model(loaded, [TEXT])
    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    with torch.no_grad():
        outputs = reference(**loaded.model_inputs(encoded), output_attentions=True)
    n = len(attention.tokens)
    return torch.stack(outputs.attentions, dim=1)[0, :, :, :n, :n].numpy()


@pytest.fixture(scope="module", params=["bert", "modernbert", "gpt2"])
def long_case(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]) -> tuple:
    directory = tiny_model_dirs[request.param]
    loaded = bertology.load_model(directory)
    attention = capture(TEXT, model=loaded, mode="qk", chunk_bytes=4 * 4 * 3 * 64)
    assert isinstance(attention, LongAttention)
    return attention, _eager(directory, attention, loaded), loaded


def test_model_view_window_equals_the_eager_attention(long_case: tuple) -> None:
    attention, eager, _ = long_case
    n = len(attention.tokens)
    assert n > 20
    view = model_view(attention, window=(5, 12), prettify_tokens=False)  # the tokens as captured
    data = view.data
    assert data["long"] == {**data["long"], "n": n, "start": 5, "stop": 17}
    assert data["tokens"] == attention.tokens[5:17] and data["n"] == 12
    assert view.token_count == f"{n} tokens (a window of 12 at a time)"  # the input's count, not the window's
    shown = unpack(data["attention"]) / ATTENTION_SCALE
    np.testing.assert_allclose(shown, eager[:, :, 5:17, 5:17], atol=CODE_ERROR)
    outside = unpack(data["long"]["outside"]) / ATTENTION_SCALE
    want = np.stack([eager[:, :, 5:17, :5].sum(-1), eager[:, :, 5:17, 17:].sum(-1)], axis=-1)
    # The mass outside the window sums up to n ~ 30 weights, each ~2e-7 apart between the paths: <= 6e-6.
    np.testing.assert_allclose(outside, want, atol=CODE_ERROR + 1e-5)
    assert "<html" in view.html


def test_head_view_carries_every_layers_largest_weights_and_pooled_minimap(long_case: tuple) -> None:
    attention, eager, _ = long_case
    n = len(attention.tokens)
    data = head_view(attention, window=(5, 12), layer=1, prettify_tokens=False).data
    long = data["long"]
    assert (data["layers"], data["layer"]) == (attention.num_layers, 1) and "layerNames" not in data
    assert long["tokens"] == attention.tokens and (long["start"], long["stop"]) == (5, 17)
    indices = unpack(long["topIndices"]).astype(np.int64)
    weights = unpack(long["topWeights"]) / ATTENTION_SCALE
    k = min(16, n)
    assert indices.shape == weights.shape == (attention.num_layers, attention.num_heads, n, k)
    np.testing.assert_allclose(weights, np.take_along_axis(eager, indices, -1), atol=CODE_ERROR)
    kth = np.take_along_axis(eager, indices[..., -1:], -1)
    left_out = eager.copy()
    np.put_along_axis(left_out, indices, -1.0, -1)
    assert (left_out <= kth + 1e-6).all()  # no weight left out is larger than the k-th kept
    minimap = unpack(long["minimap"])
    assert minimap.shape == eager.shape  # fewer tokens than cells: one cell per token
    np.testing.assert_allclose(minimap / ATTENTION_SCALE, eager, atol=CODE_ERROR)


def test_the_top_k_shrinks_to_keep_every_layers_weights_within_the_page_bound(long_case: tuple) -> None:
    from bertology.views.long import layer_summaries, top_k_for

    attention, eager, _ = long_case
    n, layers, heads = len(attention.tokens), attention.num_layers, attention.num_heads
    assert top_k_for(attention) == min(16, n)
    assert top_k_for(attention, budget=3 * layers * heads * n * 5 + 2) == 5
    assert top_k_for(attention, budget=10) == 1
    indices, weights, pooled = layer_summaries(attention, 3, cells=4)
    np.testing.assert_allclose(weights, -np.sort(-eager, -1)[..., :3], atol=WEIGHTS_REORDERED)
    np.testing.assert_allclose(np.take_along_axis(eager, indices, -1), weights, atol=WEIGHTS_REORDERED)
    np.testing.assert_allclose(pooled, _pooled(eager, 4), atol=WEIGHTS_REORDERED)


def test_model_view_thumbnails_pool_the_whole_input(long_case: tuple) -> None:
    attention, eager, _ = long_case
    data = model_view(attention, window=(5, 12)).data
    thumbnails = unpack(data["long"]["thumbnails"]) / ATTENTION_SCALE
    assert thumbnails.shape == eager.shape  # fewer tokens than cells: one cell per token
    np.testing.assert_allclose(thumbnails, eager, atol=CODE_ERROR)
    blocks = np.stack([attention.block(layer) for layer in range(attention.num_layers)])
    # Maxima of the same float32 rows computed in other chunks: exact in practice (seen 0), at most a few u.
    np.testing.assert_allclose(attention.thumbnails(3), _pooled(blocks, 3), atol=1e-6)


def _pooled(blocks: np.ndarray, cells: int) -> np.ndarray:
    """[..., cells, cells]: ``blocks`` max-pooled, cell ``p`` over tokens ``floor(p n / cells) ..``."""
    bins = np.floor(np.arange(cells) * blocks.shape[-1] / cells).astype(int)
    return np.maximum.reduceat(np.maximum.reduceat(blocks, bins, axis=-2), bins, axis=-1)


def test_the_default_window_centres_on_the_query_and_stays_inside(long_case: tuple) -> None:
    attention, _, _ = long_case
    n = len(attention.tokens)
    late = head_view(attention, query=n - 1).data
    assert late["long"]["stop"] == n and late["tokens"][late["query"]] == attention.tokens[n - 1]
    with pytest.raises(BertologyError, match="Window start"):
        head_view(attention, window=(n, 4))


def test_neuron_view_carries_the_chosen_heads_vectors_for_any_query(long_case: tuple) -> None:
    attention, eager, _ = long_case
    n = len(attention.tokens)
    data = neuron_view(attention, layer=1, head=2, query=n - 1).data
    assert (data["layers"], data["heads"], data["n"], data["query"]) == (1, 1, n, n - 1)
    assert data["layerNames"] == ["1"] and data["headNames"] == ["2"]
    queries = unpack(data["queries"])[0, 0].astype(np.float32)
    keys = unpack(data["keys"])[0, 0].astype(np.float32)
    scores = queries @ keys.T * data["scaling"][0]
    visible = eager[1, 2] > 0
    scores[~visible] = -np.inf
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    # float16 vectors (u16 = 2^-11 ~ 4.9e-4): a score s moves by ~2 u16 |s|, a weight p by <= 2 p max|ds|;
    # 2e-2 holds for scores up to |s| ~ 10 (a real model's); the tiny model's are far smaller (seen 1.4e-6).
    np.testing.assert_allclose(probs, eager[1, 2], atol=2e-2)
    assert data.get("causal", False) == bool(not np.triu(eager, k=1).any())


def test_the_reports_example_pages_build_from_long_captures(
    sample_corpus_head: Callable[[int], Path],
    tiny_model_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bertology.analysis.analyze import analyze_corpus
    from bertology.report.analysis import save_analysis

    # The tiny model's segments of up to 64 tokens count as long, so the report captures them so.
    monkeypatch.setattr(importlib.import_module("bertology.attention.capturing"), "LONG_INPUT_TOKENS", 8)
    loaded = bertology.load_model(tiny_model_dirs["modernbert"])
    analysis = analyze_corpus(
        sample_corpus_head(6), loaded, AnalysisSettings(limit=6, batch_size=3, max_length=64)
    )
    report = save_analysis(analysis, loaded, tmp_path)
    links = sorted(set(re.findall(r'href="(examples/[^"]+\.html)"', report.read_text(encoding="utf-8"))))
    assert links, "labelled heads link their example segment"
    for link in links:
        page = (tmp_path / link).read_text(encoding="utf-8")
        assert '"long":{' in page


@pytest.mark.filterwarnings("ignore::bertology.errors.TruncationWarning")  # cut to 20 tokens on purpose
def test_view_command_reads_max_tokens_and_draws_the_long_view(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from bertology.cli import app

    monkeypatch.setattr(importlib.import_module("bertology.attention.capturing"), "LONG_INPUT_TOKENS", 8)
    output = tmp_path / "view.html"
    arguments = ["view", TEXT, "--model", str(tiny_model_dirs["modernbert"]), "--max-tokens", "20"]
    result = CliRunner().invoke(app, [*arguments, "--query", "15", "-o", str(output)])
    assert result.exit_code == 0, result.output
    page = output.read_text(encoding="utf-8")
    assert '"long":{"n":20,"start":0,"stop":20,' in page and '"query":15' in page


def test_the_api_answers_a_block_of_a_long_input(long_case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from bertology.server import create_app

    attention, eager, loaded = long_case
    n = len(attention.tokens)
    monkeypatch.setattr(importlib.import_module("bertology.attention.capturing"), "LONG_INPUT_TOKENS", 8)
    with TestClient(create_app([loaded])) as client:
        body = {"text": TEXT, "layer": 1, "rows": [n - 6, n - 1], "keys": [2, n]}
        answer = client.post("/api/attention", json=body)
        assert answer.status_code == 200, answer.text
        block = np.array(answer.json()["attention"])
        assert answer.json()["rows"] == [n - 6, n - 1] and answer.json()["keys"] == [2, n]
        np.testing.assert_allclose(block[0], eager[1][:, n - 6 : n - 1, 2:n], atol=WEIGHTS_REORDERED)
        for wrong in ([3, 3], [0, n + 1], [5, 2]):
            refused = client.post("/api/attention", json={**body, "rows": wrong})
            assert refused.status_code == 422 and "is not a span" in refused.text


def test_the_long_summaries_reach_the_host_once_per_layer_whatever_the_blocks(long_case: tuple) -> None:
    """The head view's top-k and minimaps and the model view's thumbnails are reduced where the rows are
    computed: the same number of host transfers, and the same values (to float rounding), for blocks of
    one row as for one block per layer."""
    attention, _, _ = long_case
    one_block = dataclasses.replace(attention, chunk_bytes=2**30)
    one_row = dataclasses.replace(attention, chunk_bytes=1)
    assert len(list(one_block.row_chunks(0))) == 1 < len(list(one_row.row_chunks(0))) == len(attention.tokens)
    counts, results = [], []
    for each in (one_block, one_row):
        with HostTransfers() as counted:
            results.append((*layer_summaries(each, 3), each.thumbnails(8)))
        counts.append(counted.count)
    assert counts[0] == counts[1] <= 4 * attention.num_layers + 4, counts  # cpu() and numpy() each count
    (_, weights, minimap, thumbnails), (_, *one_row_values) = results  # keys may swap on float ties
    for mine, theirs in zip((weights, minimap, thumbnails), one_row_values, strict=True):
        # float32 q.k of one row against a block's: the same dot products, reduced in another order: a few u
        # relative (seen 1.5e-8 absolute); the atol for weights near 0.
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
