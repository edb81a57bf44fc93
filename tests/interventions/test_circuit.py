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
from bertology.interventions.circuit import CircuitResult, circuit
from bertology.interventions.circuit_faithfulness import FRACTIONS, areas
from bertology.interventions.circuit_pass import circuit_graph, masked_pass
from bertology.interventions.circuit_scores import circuit_runs
from bertology.interventions.patching_pairs import PairGroup, PatchPair, encode_pairs
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


@pytest.mark.parametrize("steps", [None, 3])
def test_eap_and_eap_ig_equal_gradients_taken_at_the_reference_inputs(
    llama: LoadedModel, steps: int | None
) -> None:
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


def test_all_edges_give_faithfulness_1_and_none_the_corrupted_metric(
    tiny_model_dirs: dict[str, Path],
) -> None:
    for model_type in ("llama", "gpt2"):
        loaded = tiny_language_model(tiny_model_dirs[model_type])
        result = circuit(loaded, PAIRS, method="eap")
        assert result.edges[-1] == result.graph.edge_count
        assert result.faithfulness["eap"][-1] == pytest.approx(1.0, abs=1e-4)
        assert result.faithfulness["random"][-1] == pytest.approx(1.0, abs=1e-4)
        assert result.empty_metric == pytest.approx(result.corrupted_metric, abs=1e-4)
        assert result.full_metric == result.clean_metric
        assert abs(result.clean_metric - result.corrupted_metric) > 0.01


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
