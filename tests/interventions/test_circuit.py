"""Circuits (edge attribution patching) checked against a masked forward pass written here with plain
PyTorch hooks on a Llama's own modules: every node's input rebuilt as the sum of its upstream nodes' outputs,
each taken from the run its edge says. Exact edge scores and faithfulness are compared with it, EAP and
EAP-IG with gradients taken here at each downstream node's input, and on a Llama made linear in its edges
EAP equals exact.

Tolerances: the reference sums the upstream outputs where the model adds them one block at a time, and the
model's masked pass adds differences to the running stream, so float32 sums are reordered: on the tiny
models (width 32, logits of order 1 to 10, the head scaled by 30) a logit differs by some 1e-5; atol 1e-4
leaves a margin. Gradients taken in two graphs: rtol 1e-4 as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.cli import invoke
from support.tiny_models import tiny_language_model

from bertology import BertologyError
from bertology.interventions import circuit_pass, circuit_scores
from bertology.interventions.circuit import CircuitResult, circuit
from bertology.interventions.circuit_faithfulness import (
    FRACTIONS,
    areas,
    circuit_metric,
    curve,
    edge_counts,
    empty_metric,
    faithfulness,
    random_ranking,
    replacements,
    top_edges,
)
from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.circuit_pass import circuit_graph, masked_pass
from bertology.interventions.circuit_scores import circuit_runs
from bertology.interventions.patching_pairs import PairGroup, PatchPair, encode_pairs
from bertology.models.anatomy import attention_parts
from bertology.models.loading import LoadedModel, load_model
from bertology.models.sites import recording, replacing

PAIRS = [
    PatchPair(
        "The quick brown fox jumps over the lazy",
        "The quick brown dog jumps over the lazy",
        " the",
        " dog",
        None,
        None,
        1,
    ),
    PatchPair(
        "She said that the committee would publish its findings",
        "She said that the findings would publish its committee",
        " the",
        " dog",
        None,
        None,
        2,
    ),
]
#: Edges into each kind of input: a query, a key (of key/value head 1: the tiny Llama shares 2 among 4
#: heads), a value, an MLP from a head of its own layer, and the logits.
EDGES = [
    ("a0.h1", "a1.h2<q>"),
    ("a0.h3", "a1.h1<k>"),
    ("input", "a0.h0<v>"),
    ("a1.h0", "m1"),
    ("m0", "logits"),
]


@pytest.fixture(scope="module")
def llama(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_language_model(tiny_model_dirs["llama"])


# --- The reference: a masked pass with plain hooks on a Llama ----------------------------------------------


def _upstream(layers: int, heads: int, layer: int, with_heads_of_layer: bool = False) -> list[str]:
    names = ["input"]
    for earlier in range(layer):
        names += [f"a{earlier}.h{h}" for h in range(heads)] + [f"m{earlier}"]
    if with_heads_of_layer:
        names += [f"a{layer}.h{h}" for h in range(heads)]
    return names


@contextmanager
def reference_pass(
    loaded: LoadedModel,
    absent: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
    source: dict[str, torch.Tensor] | None = None,
    nudges: dict[str, torch.Tensor] | None = None,
    embedding: torch.Tensor | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Inside the block, a forward pass of the Llama ``loaded`` rebuilds every node's input as the sum of
    its upstream nodes' outputs, ``source[u]`` for the edges in ``absent`` and this pass's own otherwise,
    plus ``nudges[v]`` where given (a zero tensor to take gradients at); ``embedding`` replaces the input.
    Yields the outputs of the pass's nodes, by MIB name."""
    model = loaded.model
    layers = model.model.layers
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    outputs: dict[str, torch.Tensor] = {}
    nudges = nudges or {}

    def rebuilt(node: str, names: list[str]) -> torch.Tensor:
        parts = [(source or {})[u] if (u, node) in absent else outputs[u] for u in names]
        total = torch.stack(parts).sum(0)
        return total + nudges[node] if node in nudges else total

    def record_input(_module: torch.nn.Module, args: tuple) -> tuple | None:
        if embedding is not None:
            outputs["input"] = embedding
            return (embedding, *args[1:])
        outputs["input"] = args[0]
        return None

    with ExitStack() as stack:
        stack.callback(layers[0].register_forward_pre_hook(record_input).remove)
        for index, layer in enumerate(layers):
            attention = layer.self_attn

            def heads_out(_module: torch.nn.Module, args: tuple, index: int = index) -> None:
                z = args[0]
                weight = layers[index].self_attn.o_proj.weight
                for h in range(heads):
                    block = slice(h * dim, (h + 1) * dim)
                    outputs[f"a{index}.h{h}"] = z[..., block] @ weight[:, block].T

            def mlp_out(
                _module: torch.nn.Module, _args: tuple, output: torch.Tensor, index: int = index
            ) -> None:
                outputs[f"m{index}"] = output

            def projection(letter: str, count: int, index: int = index) -> Callable:
                def hook(module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> torch.Tensor:
                    norm = layers[index].input_layernorm
                    names = _upstream(len(layers), heads, index)
                    columns = []
                    for h in range(count):
                        x = norm(rebuilt(f"a{index}.h{h}<{letter}>", names))
                        columns.append(x @ module.weight[h * dim : (h + 1) * dim].T)
                    return torch.cat(columns, dim=-1)

                return hook

            def mlp_in(_module: torch.nn.Module, args: tuple, index: int = index) -> tuple:
                names = _upstream(len(layers), heads, index, with_heads_of_layer=True)
                return (rebuilt(f"m{index}", names), *args[1:])

            stack.callback(attention.o_proj.register_forward_pre_hook(heads_out).remove)
            stack.callback(layer.mlp.register_forward_hook(mlp_out).remove)
            for letter, count in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                linear = getattr(attention, f"{letter}_proj")
                stack.callback(linear.register_forward_hook(projection(letter, count)).remove)
            stack.callback(layer.post_attention_layernorm.register_forward_pre_hook(mlp_in).remove)

        def logits_in(_module: torch.nn.Module, args: tuple) -> tuple:
            return (rebuilt("logits", _upstream(len(layers), heads, len(layers))), *args[1:])

        stack.callback(model.model.norm.register_forward_pre_hook(logits_in).remove)
        yield outputs


def _groups(loaded: LoadedModel) -> list[PairGroup]:
    return encode_pairs(loaded, PAIRS).groups


def _logit_difference(logits: torch.Tensor, group: PairGroup) -> torch.Tensor:
    last = logits[:, -1]
    return last.gather(1, group.answer[:, None])[:, 0] - last.gather(1, group.wrong[:, None])[:, 0]


def _plain(loaded: LoadedModel, inputs: dict) -> dict[str, torch.Tensor]:
    with torch.no_grad(), reference_pass(loaded) as outputs:
        loaded.model(**inputs)
    return dict(outputs)


def _masked_metric(loaded: LoadedModel, absent: set[tuple[str, str]]) -> float:
    """The reference's metric summed over the pairs: clean runs, ``absent`` edges from the corrupted run."""
    total = 0.0
    for group in _groups(loaded):
        corrupted = _plain(loaded, group.corrupted)
        with torch.no_grad(), reference_pass(loaded, absent, corrupted):
            total += float(_logit_difference(loaded.model(**group.clean).logits, group).sum())
    return total


def _score(result: CircuitResult, upstream: str, downstream: str) -> float:
    graph = result.graph
    return float(result.scores[graph.upstream.index(upstream), graph.downstream.index(downstream)])


# --- Tests --------------------------------------------------------------------------------------------------


def test_the_node_input_sites_replaced_by_themselves_change_no_logit(
    tiny_model_dirs: dict[str, Path],
) -> None:
    for model_type in ("llama", "gpt2"):
        loaded = tiny_language_model(tiny_model_dirs[model_type])
        inputs = _groups(loaded)[0].clean
        same = {
            name: (lambda tensor, _layer: tensor.clone())
            for name in ("q_input", "k_input", "v_input", "qkv_input", "mlp_in")
        }
        with torch.no_grad():
            plain = loaded.model(**inputs).logits
            with replacing(loaded.model, same):
                replaced = loaded.model(**inputs).logits
        torch.testing.assert_close(replaced, plain, rtol=0, atol=1e-5, msg=model_type)
    with (
        pytest.raises(BertologyError, match="replaced but not recorded"),
        recording(loaded.model, ["q_input"]),
    ):
        pass


def test_the_reference_rebuilds_the_plain_run(llama: LoadedModel) -> None:
    """Without absent edges the reference's sums of node outputs give the model's own logits: its
    decomposition of the residual stream is right, so it can judge the masked pass."""
    inputs = _groups(llama)[0].clean
    with torch.no_grad():
        plain = llama.model(**inputs).logits
        with reference_pass(llama):
            rebuilt = llama.model(**inputs).logits
    torch.testing.assert_close(rebuilt, plain, rtol=0, atol=1e-4)


def test_exact_edge_scores_equal_the_reference_masked_pass(llama: LoadedModel) -> None:
    result = circuit(llama, PAIRS, method="exact")
    clean = _masked_metric(llama, set())
    for edge in EDGES:
        expected = (_masked_metric(llama, {edge}) - clean) / len(PAIRS)
        assert _score(result, *edge) == pytest.approx(expected, abs=1e-4), edge
    assert max(abs(_score(result, *edge)) for edge in EDGES) > 1e-3  # the edges chosen do matter


# (EAP-IG, 5 steps, points side by side in passes of at most twice a group's tokens: two or three points a
# pass, its last pass with fewer)
@pytest.mark.parametrize(("steps", "side_by_side"), [(None, False), (3, False), (5, True)])
def test_eap_and_eap_ig_equal_gradients_taken_at_the_reference_inputs(
    llama: LoadedModel, steps: int | None, side_by_side: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if side_by_side:
        most = max(group.clean["input_ids"].numel() for group in _groups(llama))
        monkeypatch.setattr(circuit_scores, "_TOKENS_PER_GRADIENT_PASS", 2 * most)
    result = circuit(llama, PAIRS, method="eap" if steps is None else "eap-ig", ig_steps=steps or 5)
    downstream = [down for _, down in EDGES]
    expected: dict[tuple[str, str], float] = {}
    for group in _groups(llama):
        clean, corrupted = _plain(llama, group.clean), _plain(llama, group.corrupted)
        points = [None] if steps is None else [k / steps for k in range(steps)]
        gradients = {node: torch.zeros_like(clean["input"]) for node in downstream}
        for alpha in points:
            embedding = None
            if alpha is not None:  # MIB: corrupted + (k / steps) (clean - corrupted), k = 0 .. steps - 1
                embedding = corrupted["input"] + alpha * (clean["input"] - corrupted["input"])
            nudges = {node: torch.zeros_like(clean["input"], requires_grad=True) for node in downstream}
            with torch.enable_grad(), reference_pass(llama, nudges=nudges, embedding=embedding):
                metric = _logit_difference(llama.model(**group.clean).logits, group).sum()
                found = torch.autograd.grad(metric, list(nudges.values()))
            for node, gradient in zip(downstream, found, strict=True):
                gradients[node] += gradient / len(points)
        for up, down in EDGES:
            change = (corrupted[up] - clean[up]) * gradients[down]
            expected[up, down] = expected.get((up, down), 0.0) + float(change.sum()) / len(PAIRS)
    for edge, value in expected.items():
        assert _score(result, *edge) == pytest.approx(value, rel=1e-4, abs=1e-5), edge


@pytest.fixture(scope="module")
def linear_llama(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    """The tiny Llama made linear in every edge: no norms, queries and keys zero (uniform causal attention),
    each MLP one linear map."""
    loaded = tiny_language_model(tiny_model_dirs["llama"])
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in loaded.model.model.layers:
            layer.input_layernorm = torch.nn.Identity()
            layer.post_attention_layernorm = torch.nn.Identity()
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.k_proj.weight.zero_()
            width = loaded.model.config.hidden_size
            layer.mlp = torch.nn.Linear(width, width, bias=False)
        loaded.model.model.norm = torch.nn.Identity()
    return loaded


def test_on_a_model_linear_in_its_edges_eap_equals_exact(linear_llama: LoadedModel) -> None:
    eap = circuit(linear_llama, PAIRS, method="eap")
    exact = circuit(linear_llama, PAIRS, method="exact")
    assert np.abs(exact.scores).max() > 0.01  # edges into values, MLPs and logits move the metric
    np.testing.assert_allclose(eap.scores, exact.scores, rtol=1e-4, atol=1e-6)


def test_the_full_and_the_empty_graph_are_the_clean_and_the_corrupted_run(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """f = 1 and f = 0: the masked pass with no edge absent gives the clean logits, with every edge absent
    the corrupted ones, so ``circuit`` reads ``m(full)`` and ``m(empty)`` from those two runs."""
    for model_type in ("llama", "gpt2"):
        loaded = tiny_language_model(tiny_model_dirs[model_type])
        graph = circuit_graph(loaded)
        none = torch.zeros(len(graph.upstream), len(graph.downstream))
        for group in _groups(loaded):
            run = circuit_runs(loaded, group, "noising", "logit-diff")
            full = masked_pass(loaded, run.target_inputs, run.source_stacks(), none)
            empty = masked_pass(loaded, run.target_inputs, run.source_stacks(), 1 - none)
            assert (run.logits["clean"] - run.logits["corrupted"]).abs().max() > 0.01
            torch.testing.assert_close(full, run.logits["clean"], rtol=0, atol=1e-4)
            torch.testing.assert_close(empty, run.logits["corrupted"], rtol=0, atol=1e-4)
        result = circuit(loaded, PAIRS, method="eap")
        assert result.edges[-1] == graph.edge_count and result.faithfulness["eap"][-1] == 1.0
        assert result.empty_metric == result.corrupted_metric
        assert result.full_metric == result.clean_metric


def _mib_prune(graph: CircuitGraph, kept: np.ndarray) -> np.ndarray:
    """MIB's ``Graph.prune`` (hannamw/EAP-IG ``eap/graph.py``) on ``kept`` [forward, backward]: repeatedly
    keep the nodes with an incoming and an outgoing edge (``input`` counts as having incoming ones), then the
    edges whose parent and child are kept (``logits`` always), until nothing changes. A node's inputs are
    found from the MIB names here: ``a{l}.h{j}<k>`` and ``<v>`` feed the query heads of key/value head
    ``j``."""
    groups = graph.heads // graph.key_value_heads
    forward_to_backward = np.zeros(graph.real.shape, dtype=bool)
    for index, name in enumerate(graph.downstream[:-1]):
        node, _, letter = name.partition("<")
        if letter in ("k>", "v>"):
            layer, head = node[1:].split(".h")
            owners = [f"a{layer}.h{h}" for h in range(int(head) * groups, (int(head) + 1) * groups)]
        else:
            owners = [node]
        for owner in owners:
            forward_to_backward[graph.upstream.index(owner), index] = True
    in_graph = kept.copy()
    nodes = np.ones(len(graph.upstream), dtype=bool)
    while True:
        outgoing = in_graph.any(1)
        incoming = (forward_to_backward & in_graph.any(0)[None, :]).any(1)
        incoming[0] = True
        old_nodes, old_edges = nodes.copy(), in_graph.copy()
        nodes = outgoing & incoming
        backward = (nodes[:, None] & forward_to_backward).any(0)
        backward[-1] = True
        in_graph &= nodes[:, None] & backward[None, :]
        if (old_nodes == nodes).all() and (old_edges == in_graph).all():
            return in_graph


@pytest.mark.parametrize("shape", [(3, 4, 2), (4, 3, 3), (2, 6, 1)])
def test_pruning_keeps_what_mibs_prune_keeps(shape: tuple[int, int, int]) -> None:
    graph = CircuitGraph(*shape, 8)
    rng = np.random.default_rng(sum(shape))
    for density in (0.01, 0.03, 0.1, 0.3, 0.7, 1.0):
        for _ in range(20):
            kept = graph.real & (rng.random(graph.real.shape) < density)
            np.testing.assert_array_equal(graph.pruned(kept), _mib_prune(graph, kept))
    # a path input -> a0.h1 (its query) -> m1 -> logits stays; an edge out of a head nothing feeds, and one
    # into a head that feeds nothing, go
    kept = np.zeros_like(graph.real)
    path = [("input", "a0.h1<q>"), ("a0.h1", "m1"), ("m1", "logits")]
    for up, down in [*path, ("a0.h2", "m1"), ("input", "a1.h0<q>")]:
        kept[graph.upstream.index(up), graph.downstream.index(down)] = True
    left = graph.pruned(kept)
    assert sorted(graph.edge_names(*np.nonzero(left))) == sorted(path)


def test_under_mean_ablation_a_circuit_is_pruned_before_it_runs(llama: LoadedModel) -> None:
    """MIB prunes every circuit before it runs it; under mean ablation that changes the metric: an edge out
    of a head no kept edge feeds carries that head's output on the means, not the mean of its output. The 5 %
    circuit (4 edges) here: a path input -> a0.h1 -> a1.h0 -> logits and such an edge, a0.h2 -> a1.h0's
    value."""
    graph = circuit_graph(llama)
    path = [("input", "a0.h1<q>"), ("a0.h1", "a1.h0<q>"), ("a1.h0", "logits")]
    chosen = [
        graph.upstream.index(up) * len(graph.downstream) + graph.downstream.index(down)
        for up, down in [*path, ("a0.h2", "a1.h0<v>")]
    ]
    rest = [edge for edge in random_ranking(graph.real, 3) if edge not in chosen]
    order = np.array(chosen + rest)
    runs = [circuit_runs(llama, group, "noising", "logit-diff") for group in _groups(llama)]
    carried = replacements(runs, "mean")
    full = sum(float(run.metric("clean").sum()) for run in runs) / len(PAIRS)
    empty = empty_metric(llama, runs, carried, "mean")
    values = curve(llama, runs, carried, order, graph, full, empty)
    size = FRACTIONS.index(0.05)
    kept = top_edges(order, edge_counts(graph.edge_count)[size], graph.real.shape)
    assert kept.sum() == 4 and sorted(graph.edge_names(*np.nonzero(graph.pruned(kept)))) == sorted(path)
    as_kept, as_pruned = (circuit_metric(llama, runs, carried, edges) for edges in (kept, graph.pruned(kept)))
    assert values[size] == pytest.approx(faithfulness(as_pruned, full, empty), abs=1e-6)
    assert abs(faithfulness(as_kept, full, empty) - values[size]) > 1e-3


def test_a_circuits_faithfulness_equals_the_reference_masked_pass(llama: LoadedModel) -> None:
    result = circuit(llama, PAIRS, method="eap")
    frame = result.edges_frame()
    full = _masked_metric(llama, set())
    every = set(zip(frame["upstream"], frame["downstream"], strict=True))
    empty = _masked_metric(llama, every)
    for size in (FRACTIONS.index(0.1), FRACTIONS.index(0.5)):
        count = result.edges[size]
        order = np.argsort(-frame["score"].abs().to_numpy(), kind="stable")
        kept = {(frame["upstream"][i], frame["downstream"][i]) for i in order[:count]}
        value = _masked_metric(llama, every - kept)
        expected = (value - empty) / (full - empty)
        assert 0 < count < len(frame)
        assert result.faithfulness["eap"][size] == pytest.approx(expected, abs=1e-4)
    cpr, cmd = areas(result.faithfulness["eap"])
    assert result.areas()["cpr"]["eap"] == cpr and result.areas()["cmd"]["eap"] == cmd


@pytest.mark.parametrize("kept", [0.03, 0.3, 0.7, 0.97])
def test_random_circuits_of_every_density_equal_the_reference_masked_pass(
    llama: LoadedModel, kept: float
) -> None:
    """The masked pass sums each layer's absent edges by a sparse product (few weights), a dense one (many),
    from the running total less the kept edges (more absent than kept), and skips the heads no edge reads:
    random circuits keeping 3 %, 30 %, 70 % and 97 % of the edges cover each, against the reference."""
    graph = circuit_graph(llama)
    rng = np.random.default_rng(int(kept * 100))
    absent = torch.as_tensor(graph.real & (rng.random(graph.real.shape) >= kept)).float()
    names = set()
    for up, down in zip(*absent.numpy().nonzero(), strict=True):
        names.add((graph.upstream[up], graph.downstream[down]))
    total = 0.0
    for group in _groups(llama):
        run = circuit_runs(llama, group, "noising", "logit-diff")
        total += float(run.score(masked_pass(llama, run.target_inputs, run.source_stacks(), absent)).sum())
    assert 0 < len(names) < graph.edge_count
    assert total == pytest.approx(_masked_metric(llama, names), abs=1e-4)


def test_a_layer_no_kept_edge_leaves_is_skipped_and_changes_nothing(
    tiny_model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept edges out of ``input`` and layer 1 only: layer 0 does not run (its attention is never called),
    and the logits equal the reference's (Llama) and, for GPT-2, whose attention output projection has a
    bias that the skipped layer still adds, the same masked pass with every layer run."""
    kept = [("input", "a1.h0<v>"), ("input", "m1"), ("a1.h0", "logits"), ("m1", "logits")]
    calls: list[int] = []
    for model_type in ("llama", "gpt2"):
        loaded = tiny_language_model(tiny_model_dirs[model_type])
        bias = attention_parts(loaded.model)[0].output.bias
        if bias is not None:  # GPT-2's, zeros as initialised
            with torch.no_grad():
                bias.normal_(generator=torch.Generator().manual_seed(0))
        graph = circuit_graph(loaded)
        absent = torch.as_tensor(graph.real).float()
        for up, down in kept:
            absent[graph.upstream.index(up), graph.downstream.index(down)] = 0
        attention = attention_parts(loaded.model)[0].module
        handle = attention.register_forward_hook(lambda *_: calls.append(1))
        logits = []
        for group in _groups(loaded):
            run = circuit_runs(loaded, group, "noising", "logit-diff")
            calls.clear()
            skipped = masked_pass(loaded, run.target_inputs, run.source_stacks(), absent)
            assert not calls
            with monkeypatch.context() as patch:
                patch.setattr(circuit_pass, "returns_hidden_states", lambda _layer: False)
                every_layer = masked_pass(loaded, run.target_inputs, run.source_stacks(), absent)
            assert calls
            torch.testing.assert_close(skipped, every_layer, rtol=0, atol=1e-4)
            assert (skipped - run.logits["corrupted"]).abs().max() > 1e-3
            logits.append(skipped)
        handle.remove()
        if model_type == "llama":
            every = {(up, down) for up, down in zip(*np.nonzero(graph.real), strict=True)}
            names = {(graph.upstream[up], graph.downstream[down]) for up, down in every} - set(kept)
            total = sum(
                float(_logit_difference(found, group).sum())
                for found, group in zip(logits, _groups(loaded), strict=True)
            )
            assert total == pytest.approx(_masked_metric(loaded, names), abs=1e-4)


def test_areas_follow_mibs_trapezoids() -> None:
    """A curve at 1 everywhere: CPR is the span of the fractions, 0.999, and CMD 0; at 0: CPR 0, CMD 0.999."""
    assert areas([1.0] * 10) == pytest.approx((0.999, 0.0))
    assert areas([0.0] * 10) == pytest.approx((0.0, 0.999))
    # f = 0.5 up to 10 %, then 1: the trapezoid from 0.1 to 0.2 is 0.1 * 0.75
    values = [0.5] * 7 + [1.0] * 3
    assert areas(values)[0] == pytest.approx(0.099 * 0.5 + 0.1 * 0.75 + 0.8)


def test_mean_ablation_and_denoising_run_and_differ(llama: LoadedModel) -> None:
    noising = circuit(llama, PAIRS, method="eap")
    mean = circuit(llama, PAIRS, method="eap", ablation="mean")
    denoising = circuit(llama, PAIRS, method="eap", direction="denoising")
    assert mean.empty_metric != pytest.approx(noising.empty_metric, abs=1e-3)
    assert denoising.full_metric == denoising.corrupted_metric
    assert denoising.empty_metric == pytest.approx(denoising.clean_metric, abs=1e-4)


def test_bad_options_and_models_are_refused_in_one_sentence(
    llama: LoadedModel, tiny_model_dirs: dict[str, Path]
) -> None:
    for options, message in (
        ({"method": "greedy"}, "Unknown circuit method 'greedy'; choose one of eap, eap-ig, exact."),
        ({"ablation": "zero"}, "Unknown circuit ablation 'zero'"),
        ({"ig_steps": 0}, "--ig-steps must be at least 1; 0 was given."),
        ({"metric": "accuracy"}, "Unknown patching metric 'accuracy'"),
    ):
        with pytest.raises(BertologyError, match=message.replace("(", r"\(").replace(".", r"\.")):
            circuit(llama, PAIRS, **options)  # type: ignore[arg-type]
    with pytest.raises(BertologyError, match="There are no pairs"):
        circuit(llama, [])
    bare = load_model(tiny_model_dirs["llama"])  # no language-model head: no logits to end at
    with pytest.raises(BertologyError, match="has no head: circuits end at logits"):
        circuit(bare, PAIRS)
    gemma2 = tiny_language_model(tiny_model_dirs["gemma2"])  # norms after attention and the MLP too
    with pytest.raises(BertologyError, match=r"Circuits rebuild every node's input, which .* refuses: Site "):
        circuit(gemma2, PAIRS)


def _invoke(*arguments: str) -> tuple[int, str]:
    return invoke("circuit", *arguments)


def test_the_command_writes_the_files_and_marks_a_circuit_run(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    records = [
        {"clean": p.clean, "corrupted": p.corrupted, "answer": p.answer, "wrong": p.wrong} for p in PAIRS
    ]
    pairs.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    output = tmp_path / "circuit"
    code, text = _invoke(str(tiny_model_dirs["llama"]), str(pairs), "-o", str(output), "--method", "eap")
    assert code == 0, text
    edges = pd.read_csv(output / "edges.csv")
    assert list(edges.columns) == ["upstream", "downstream", "score"]
    assert (np.diff(edges["score"].abs().to_numpy()) <= 0).all()
    assert {"input", "a0.h0", "m1"} <= set(edges["upstream"]) and "a1.h3<q>" in set(edges["downstream"])
    faithfulness = pd.read_csv(output / "faithfulness.csv")
    assert list(faithfulness.columns) == ["method", "percent_edges", "edges", "faithfulness"]
    assert set(faithfulness["method"]) == {"eap", "random"} and len(faithfulness) == 20
    summary = json.loads((output / "summary.json").read_text())
    assert summary["edges"] == len(edges) and summary["pairs"] == 2 and summary["method"] == "eap"
    assert set(summary["cpr"]) == {"eap", "random"} and summary["ablation"] == "counterfactual"
    graph = json.loads((output / "graph.json").read_text())
    assert len(graph["edges"]) == len(edges) and "a0.h1->a1.h2<q>" in graph["edges"]
    assert graph["cfg"]["n_layers"] == 2 and graph["nodes"]["logits"]["in_graph"]
    assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((output / "bertology-run.json").read_text())["kind"] == "circuit"
    page = (output / "circuit.html").read_text(encoding="utf-8")  # the page of the run's own edges
    assert page.lstrip().lower().startswith("<!doctype html") and "a1.h3" in page
    code, text = _invoke(
        str(tiny_model_dirs["llama"]), str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x")
    )
    assert code == 2 and "does not exist" in " ".join(text.split()), text
