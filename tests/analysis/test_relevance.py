"""Attention rollout and flow: hand-computed answers, networkx max-flow, the length limit, view and CLI.

Tolerances: rollout and flow of hand-made float64 matrices against hand-computed values, 1e-12 (float64 sums
of a few terms); flow against networkx's maximum flow within flow_error_bound (the integer scaling that
networkx's algorithm needs, stated there); the command's JSON of float32 results: rows sum to 1 within 1e-6
and flow equals rollout at the first layer within 1e-7.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
from support.browser import open_view

import bertology
from bertology.analysis.relevance import (
    FLOW_MAX_TOKENS,
    attention_flow,
    attention_rollout,
    flow_error_bound,
    flow_pair_count,
    normalise_rows,
    relevance,
    residual_attention,
)
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.views.payload import ATTENTION_SCALE, unpack
from bertology.views.relevance import CAPTION, HEADING, relevance_view


def hand_example() -> np.ndarray:
    """probs [2 layers, 2 heads, 3, 3].

    Layer 0: head means A_0 = [[0, 1, 0], [.5, 0, .5], [.5, .5, 0]], so
        Â_0 = .5 A_0 + .5 I = [[.5, .5, 0], [.25, .5, .25], [.25, .25, .5]].
    Layer 1: every token attends to the last, so Â_1 = [[.5, 0, .5], [0, .5, .5], [0, 0, 1]].
    """
    layer_0 = [
        [[0, 1, 0], [0, 0, 1], [1, 0, 0]],
        [[0, 1, 0], [1, 0, 0], [0, 1, 0]],
    ]
    layer_1 = [[[0, 0, 1]] * 3] * 2
    return np.array([layer_0, layer_1], dtype=np.float32)


HAND_A0 = np.array([[0.5, 0.5, 0], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]])


def random_attention(layers: int, heads: int, n: int, seed: int) -> np.ndarray:
    """[layers, heads, n, n] rows drawn from a Dirichlet(0.5): peaked, like real attention."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(n, 0.5), size=(layers, heads, n)).astype(np.float32)


def test_rollout_matches_the_hand_computed_example() -> None:
    rollout = attention_rollout(hand_example())
    # R_1 = Â_1 Â_0: row 0 = .5 * Â_0[0] + .5 * Â_0[2] = [.375, .375, .25];
    # row 1 = .5 * Â_0[1] + .5 * Â_0[2] = [.25, .375, .375]; row 2 = Â_0[2].
    expected_1 = np.array([[0.375, 0.375, 0.25], [0.25, 0.375, 0.375], [0.25, 0.25, 0.5]])
    # Exact by construction: sums and products of halves and quarters in float64 (atol=0 would pass).
    np.testing.assert_allclose(rollout[0], HAND_A0, atol=1e-12)
    np.testing.assert_allclose(rollout[1], expected_1, atol=1e-12)


def test_flow_matches_the_hand_computed_example() -> None:
    flow = attention_flow(hand_example())
    # F_1[i, j] = sum_k min(Â_1[i, k], Â_0[k, j]): e.g. row 0, column 0 = min(.5, .5) + 0 + min(.5, .25).
    expected_1 = np.array([[0.75, 0.75, 0.5], [0.5, 0.75, 0.75], [0.25, 0.25, 0.5]])
    # Exact by construction, as for the rollout: the capacities are multiples of 1 / 4.
    np.testing.assert_allclose(flow[0], HAND_A0, atol=1e-12)
    np.testing.assert_allclose(flow[1], expected_1, atol=1e-12)


def networkx_flow(probs: np.ndarray) -> np.ndarray:
    """The straightforward computation: the whole (layers + 1) x n graph with float capacities, one
    ``nx.maximum_flow_value`` per (layer, token, input token)."""
    augmented = residual_attention(probs)
    layers, n, _ = augmented.shape
    graph = nx.DiGraph()
    for layer in range(layers):
        for i in range(n):
            for k in range(n):
                graph.add_edge((layer + 1, i), (layer, k), capacity=float(augmented[layer, i, k]))
    return np.array(
        [
            [[nx.maximum_flow_value(graph, (layer + 1, i), (0, j)) for j in range(n)] for i in range(n)]
            for layer in range(layers)
        ]
    )


def test_flow_equals_networkx_max_flow_within_the_rounding_bound() -> None:
    probs = random_attention(layers=5, heads=3, n=6, seed=1)
    progress: list[int] = []
    flow = attention_flow(probs, on_progress=lambda solved, total: progress.append(solved))
    bound = flow_error_bound(5, 6)
    assert 0 < bound < 1e-7
    np.testing.assert_allclose(flow, networkx_flow(probs), rtol=0, atol=bound)
    assert progress[-1] == flow_pair_count(5, 6) == 3 * 36


def test_flow_lies_between_rollout_and_one_and_equals_it_at_the_first_layer() -> None:
    probs = random_attention(layers=4, heads=4, n=9, seed=2)
    flow, rollout = attention_flow(probs), attention_rollout(probs)
    bound = flow_error_bound(4, 9)
    assert (flow <= 1 + bound).all()
    assert (flow >= rollout - bound - 1e-12).all()
    assert (flow[1:] > rollout[1:] + 1e-3).any()  # not equal beyond the first layer
    # Rows renormalised in float64, then 4 products of 9 x 9 row-stochastic matrices: a few ulps (~1e-15).
    np.testing.assert_allclose(rollout.sum(axis=-1), 1, atol=1e-12)
    np.testing.assert_array_equal(flow[0], rollout[0])


def test_flow_refuses_inputs_over_the_length_limit() -> None:
    probs = random_attention(layers=3, heads=1, n=9, seed=3)
    with pytest.raises(BertologyError, match=r"limited to 8 tokens and this input has 9: it solves 81 "):
        attention_flow(probs, max_tokens=8)
    assert attention_flow(probs, max_tokens=9).shape == (3, 9, 9)
    long_probs = np.full((3, 1, FLOW_MAX_TOKENS + 1, FLOW_MAX_TOKENS + 1), 1 / (FLOW_MAX_TOKENS + 1))
    with pytest.raises(BertologyError, match=rf"limited to {FLOW_MAX_TOKENS} tokens and this input has 65"):
        attention_flow(long_probs)


def test_view_has_attention_rollout_and_normalised_flow_as_columns(default_model: LoadedModel) -> None:
    attention = bertology.capture("The cat sat on the mat.", model=default_model)
    view = relevance_view(attention)
    data = view.data
    assert data["view"] == "model" and data["heads"] == 3
    assert data["headNames"] == ["attention", "rollout", "flow"]
    assert "divided by its sum" in data["caption"] and "rollout" in view.title
    result = view.relevance
    expected = np.stack(
        [
            attention.probs.mean(axis=1),
            attention_rollout(attention.probs),
            normalise_rows(attention_flow(attention.probs)),
        ],
        axis=1,
    )
    codes = unpack(data["attention"])
    assert codes.shape == (6, 3, 9, 9)
    assert np.abs(codes / ATTENTION_SCALE - expected).max() <= 0.5 / ATTENTION_SCALE + 1e-6
    np.testing.assert_allclose(result.methods["flow"], attention_flow(attention.probs))


def test_view_with_rollout_only_has_two_columns(default_model: LoadedModel) -> None:
    attention = bertology.capture("Short.", model=default_model)
    view = relevance_view(attention, ("rollout",))
    assert view.data["headNames"] == ["attention", "rollout"] and list(view.relevance.methods) == ["rollout"]


def test_unknown_method_is_refused(default_model: LoadedModel) -> None:
    attention = bertology.capture("Short.", model=default_model)
    with pytest.raises(BertologyError, match=r"Unknown relevance method \['saliency'\]"):
        relevance(attention, ["saliency"])  # type: ignore[list-item]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "bertology", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_cli_writes_the_page_and_the_matrices(tmp_path: Path) -> None:
    target = tmp_path / "relevance.html"
    result = run_cli("relevance", "The cat sat on the mat.", "It was tired.", "-o", str(target))
    assert result.returncode == 0, result.stderr
    json_path = tmp_path / "relevance.json"
    assert f"Wrote the rollout and flow of 14 tokens to {target} and {json_path}." in result.stdout
    page = target.read_text()
    assert page.count('id="bertology-data"') == 1 and '"headNames":["attention","rollout","flow"]' in page
    saved = json.loads(json_path.read_text())
    assert saved["model"] == "all-MiniLM-L6-v2" and len(saved["tokens"]) == 14
    rollout, flow = np.array(saved["rollout"]), np.array(saved["flow"])
    assert rollout.shape == flow.shape == (6, 14, 14)
    # The JSON rounds to 8 decimals: <= 5e-9 per value, <= 7e-8 on a row of 14.
    np.testing.assert_allclose(rollout.sum(axis=-1), 1, atol=1e-6)
    # Exact by construction: flow's first layer is the rollout's (asserted equal above), rounded alike.
    np.testing.assert_allclose(flow[0], rollout[0], atol=1e-7)
    assert (flow >= rollout - 1e-6).all() and (flow.sum(axis=-1)[1:] > 1).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--method", "flow", "--max-tokens", "5"],
            "Attention flow is limited to 5 tokens and this input has 9",
        ),
    ],
)
def test_cli_user_errors_are_one_sentence(args: list[str], message: str, tmp_path: Path) -> None:
    result = run_cli("relevance", "The cat sat on the mat.", *args, "-o", str(tmp_path / "r.html"))
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r.html").exists()


@pytest.mark.browser
def test_page_draws_one_row_per_layer_and_the_three_named_columns(
    chromium_browser: Any, default_model: LoadedModel, tmp_path: Path
) -> None:
    attention = bertology.capture("The cat sat on the mat.", model=default_model)
    path = relevance_view(attention).save(tmp_path / "relevance.html")
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        view = open_view(context, path)
        labels = view.js("[...document.querySelectorAll('.bt-col-label')].map((e) => e.textContent)")
        assert labels == ["attention", "rollout", "flow"]
        assert view.js("document.querySelectorAll('.bt-thumb').length") == 6 * 3
        assert view.ink(".bt-thumb") > 0
        assert view.js("document.querySelector('#bt-caption').textContent") == CAPTION
        assert view.js("document.querySelector('.bt-title strong').textContent") == HEADING
        assert "3 columns" in view.js("document.querySelector('.bt-subtitle').textContent")
        assert view.js("document.querySelector('.bt-corner').textContent") == "layer \\ column"
        view.assert_clean()
    finally:
        context.close()
