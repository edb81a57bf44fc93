"""Circuits in a post-norm encoder (issue 44), checked against a decomposition written here with plain
PyTorch hooks on a BERT classifier's own modules: every node's contribution carried through each LayerNorm
by ``c <- gamma (c - mean c) / sigma`` (``sigma`` of that pass's stream), ``input`` the stream less the
others. A node's input in a masked pass is rebuilt here as ``x + sum over absent in-edges (R_u - C_u)``,
``C_u`` from this pass's own decomposition and ``R_u`` from the corrupted run's. Exact edge scores and
faithfulness are compared with it, EAP and EAP-IG with gradients taken here at each downstream node's input.

The model: the tiny random BERT classifier with its matrices (embeddings included) scaled by 10 (sharper
attention, larger updates), so that the clean and corrupted metrics differ (by about 0.5) and the norms'
scales vary from position to position. Tolerances: float32 sums over the 32 widths taken in other orders;
the metric is of order 1, so 1e-5 for f = 1 and f = 0, 1e-4 for scores from passes made in two ways.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.cli import invoke
from support.tiny_models import tiny_classifier

from bertology import BertologyError
from bertology.interventions.circuit import CircuitResult, circuit
from bertology.interventions.circuit_faithfulness import replacements
from bertology.interventions.circuit_pass import circuit_graph, masked_pass
from bertology.interventions.circuit_scores import attribution_scores, circuit_runs
from bertology.interventions.patching_pairs import PairGroup, PatchPair, encode_pairs
from bertology.models.loading import LoadedModel

PAIRS = [
    PatchPair("a good film", "a bad film", None, None, "pos", "neg", 1),
    PatchPair("the best movie ever made", "the worst movie ever made", None, None, "pos", "neg", 2),
]
#: Edges into each kind of input, across norms: a query from two layers back, a key, a value from the input,
#: an MLP from a head of its own layer (across the attention block's norm) and from the input, the logits.
EDGES = [
    ("a0.h1", "a2.h2<q>"),
    ("a0.h3", "a1.h1<k>"),
    ("input", "a1.h0<v>"),
    ("a1.h0", "m1"),
    ("input", "m2"),
    ("m0", "logits"),
    ("a2.h3", "logits"),
]

#: What an edit of a node's input gets: the input as the model computed it [batch, pos, d_model] and the
#: contributions of this pass at that point, by node name.
Edit = Callable[[torch.Tensor, dict[str, torch.Tensor]], torch.Tensor]


@pytest.fixture(scope="module")
def bert(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    loaded = tiny_classifier(tiny_model_dirs["bert"])
    with torch.no_grad():
        for parameter in loaded.model.bert.parameters():
            if parameter.dim() == 2:
                parameter.mul_(10)
    return loaded


# --- The reference: the decomposition, with plain hooks on a BERT ----------------------------------------


def _point(node: str, layers: int) -> tuple[str, int]:
    """Where downstream node ``node`` reads the stream: ``("pre", l)`` the input of layer ``l`` (a head's
    input; ``("pre", layers)`` the last layer's output, the logits'), ``("mid", l)`` the attention block's
    normalised output (the MLP's)."""
    if node == "logits":
        return "pre", layers
    if node.startswith("m"):
        return "mid", int(node[1:])
    return "pre", int(node[1 : node.index(".")])


@contextmanager
def decomposing(
    loaded: LoadedModel, edits: dict[str, Edit] | None = None, embedding: torch.Tensor | None = None
) -> Iterator[dict[tuple[str, int], dict[str, torch.Tensor]]]:
    """Inside the block a pass of the BERT ``loaded`` keeps each point's contributions (yielded: by point,
    then node), and ``edits[v]`` replaces downstream node ``v``'s input (a head's: for its own query, key or
    value rows only); ``embedding`` replaces the input of layer 0. Also keeps ``("remainder", l)``: the
    embeddings, output biases and betas carried as an affine map, to check the input's remainder by."""
    model = loaded.model
    layers = model.bert.encoder.layer
    heads = model.config.num_attention_heads
    dim = model.config.hidden_size // heads
    edits = edits or {}
    live: dict[str, torch.Tensor] = {}
    points: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    remainder: dict[str, torch.Tensor] = {}

    def through(
        norm: torch.nn.LayerNorm, stream: torch.Tensor, output: torch.Tensor, bias: torch.Tensor
    ) -> None:
        sigma = torch.sqrt(stream.var(-1, unbiased=False, keepdim=True) + norm.eps)

        def linear(c: torch.Tensor) -> torch.Tensor:
            return norm.weight * (c - c.mean(-1, keepdim=True)) / sigma

        for name in [name for name in live if name != "input"]:
            live[name] = linear(live[name])
        live["input"] = output - sum(value for name, value in live.items() if name != "input")
        remainder["input"] = linear(remainder["input"] + bias) + norm.bias

    def first(_module: torch.nn.Module, args: tuple) -> tuple | None:
        stream = args[0] if embedding is None else embedding
        live["input"] = remainder["input"] = stream
        points["pre", 0] = dict(live)
        return None if embedding is None else (embedding, *args[1:])

    with ExitStack() as stack:

        def hook(module: torch.nn.Module, fn: Callable, before: bool = False) -> None:
            register = module.register_forward_pre_hook if before else module.register_forward_hook
            stack.callback(register(fn).remove)

        hook(layers[0], first, before=True)
        for index, layer in enumerate(layers):
            attention = layer.attention

            def projection(letter: str, index: int = index) -> Callable:
                def edit(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
                    output = output.clone()
                    for h in range(heads):
                        node = f"a{index}.h{h}<{letter}>"
                        if node in edits:
                            rows = slice(h * dim, (h + 1) * dim)
                            x = edits[node](args[0], points["pre", index])
                            output[..., rows] = x @ module.weight[rows].T + module.bias[rows]
                    return output

                return edit

            def heads_out(module: torch.nn.Module, args: tuple, index: int = index) -> None:
                for h in range(heads):
                    block = slice(h * dim, (h + 1) * dim)
                    live[f"a{index}.h{h}"] = args[0][..., block] @ module.weight[:, block].T

            def attention_norm(
                module: torch.nn.Module, args: tuple, output: torch.Tensor, index: int = index
            ) -> None:
                through(module, args[0], output, layers[index].attention.output.dense.bias)
                points["mid", index] = dict(live)
                points["remainder-mid", index] = dict(remainder)

            def mlp_in(_module: torch.nn.Module, args: tuple, index: int = index) -> tuple | None:
                node = f"m{index}"
                return None if node not in edits else (edits[node](args[0], points["mid", index]),)

            def mlp_out(
                _module: torch.nn.Module, _args: tuple, output: torch.Tensor, index: int = index
            ) -> None:
                live[f"m{index}"] = output

            def output_norm(
                module: torch.nn.Module, args: tuple, output: torch.Tensor, index: int = index
            ) -> None:
                through(module, args[0], output, torch.zeros_like(output[0, 0]))
                points["pre", index + 1] = dict(live)
                points["remainder-pre", index + 1] = dict(remainder)

            for letter in "qkv":
                linear = getattr(attention.self, {"q": "query", "k": "key", "v": "value"}[letter])
                hook(linear, projection(letter))
            hook(attention.output.dense, heads_out, before=True)
            hook(attention.output.LayerNorm, attention_norm)
            hook(layer.intermediate, mlp_in, before=True)
            hook(layer.output.dense, mlp_out)
            hook(layer.output.LayerNorm, output_norm)

        def logits_in(_module: torch.nn.Module, args: tuple) -> tuple | None:
            if "logits" not in edits:
                return None
            return (edits["logits"](args[0], points["pre", len(layers)]), *args[1:])

        hook(model.bert.pooler, logits_in, before=True)
        yield points


def _groups(loaded: LoadedModel) -> list[PairGroup]:
    return encode_pairs(loaded, PAIRS).groups


def _logit_difference(logits: torch.Tensor, group: PairGroup) -> torch.Tensor:
    return logits.gather(1, group.answer[:, None])[:, 0] - logits.gather(1, group.wrong[:, None])[:, 0]


def _plain(loaded: LoadedModel, inputs: dict) -> dict[tuple[str, int], dict[str, torch.Tensor]]:
    with torch.no_grad(), decomposing(loaded) as points:
        loaded.model(**inputs)
    return dict(points)


def _masked_metric(loaded: LoadedModel, absent: set[tuple[str, str]]) -> float:
    """The reference's metric summed over the pairs: clean runs, each node's input with ``R_u - C_u`` added
    for its ``absent`` in-edges (``R_u``: the corrupted run's contribution at that point)."""
    layers = loaded.model.config.num_hidden_layers
    total = 0.0
    for group in _groups(loaded):
        corrupted = _plain(loaded, group.corrupted)

        def edit(node: str, corrupted: dict = corrupted) -> Edit:
            ups = [up for up, down in absent if down == node]
            point = _point(node.split("<")[0], layers)

            def rebuilt(x: torch.Tensor, live: dict[str, torch.Tensor]) -> torch.Tensor:
                return x + sum(corrupted[point][up] - live[up] for up in ups)

            return rebuilt

        edits = {down: edit(down) for _, down in absent}
        with torch.no_grad(), decomposing(loaded, edits):
            total += float(_logit_difference(loaded.model(**group.clean).logits, group).sum())
    return total


# --- Tests --------------------------------------------------------------------------------------------------


def test_the_references_input_remainder_is_the_embeddings_biases_and_betas_carried(bert: LoadedModel) -> None:
    """The stream less the other nodes' carried contributions equals the embeddings with every attention
    output bias and every beta carried through the norms as an affine map: LayerNorm is affine once its
    scale is fixed, so the decomposition is exact (the heads', MLPs' and remainder's sum is the stream)."""
    points = _plain(bert, _groups(bert)[0].clean)
    layers = bert.model.config.num_hidden_layers
    for layer in range(layers):
        for kind in ("mid", "pre"):
            at = (kind, layer if kind == "mid" else layer + 1)
            carried = points[f"remainder-{kind}", at[1]]["input"]
            torch.testing.assert_close(points[at]["input"], carried, rtol=0, atol=1e-4, msg=str(at))
    assert float(points["pre", layers]["a0.h1"].norm()) > 0.1  # a head's output still matters at the end


@pytest.fixture(scope="module")
def eap(bert: LoadedModel) -> CircuitResult:
    return circuit(bert, PAIRS, method="eap")


def test_every_edge_gives_faithfulness_1_and_none_the_corrupted_metric(
    bert: LoadedModel, eap: CircuitResult
) -> None:
    """f = 1 and f = 0 exactly: with every edge the masked pass is the clean run, with none every node gets
    the corrupted run's input (its contributions carried with the corrupted run's scales), so the logits are
    the corrupted run's (``circuit`` reads m(full) and m(empty) from those runs). Under mean ablation the
    full graph is the clean run too, the empty one not the corrupted run."""
    assert abs(eap.clean_metric - eap.corrupted_metric) > 0.1
    assert eap.faithfulness["eap"][-1] == 1.0 and eap.empty_metric == eap.corrupted_metric
    runs = [circuit_runs(bert, group, "noising", "logit-diff") for group in _groups(bert)]
    graph = circuit_graph(bert)
    none = torch.zeros(len(graph.upstream), len(graph.downstream))
    for run in runs:
        empty = masked_pass(bert, run.target_inputs, run.source_stacks(), 1 - none)
        torch.testing.assert_close(empty, run.logits["corrupted"], rtol=0, atol=1e-5)
    for run, mean in zip(runs, replacements(runs, "mean"), strict=True):
        full = masked_pass(bert, run.target_inputs, mean, none)
        torch.testing.assert_close(full, run.logits["clean"], rtol=0, atol=1e-5)
        empty = masked_pass(bert, run.target_inputs, mean, 1 - none)
        assert (empty - run.logits["corrupted"]).abs().max() > 1e-3


def test_exact_edge_scores_equal_the_reference_masked_pass(bert: LoadedModel) -> None:
    """An exact score is ``m(clean with edge u->v from the corrupted run) - m(clean)``, one masked pass
    per edge (``exact_scores``' loop, here for the chosen edges: every edge of the graph takes 1,300 passes
    of the two groups); the reference rebuilds the one downstream input itself."""
    graph = circuit_graph(bert)
    runs = [circuit_runs(bert, group, "noising", "logit-diff") for group in _groups(bert)]
    clean = _masked_metric(bert, set())
    assert clean == pytest.approx(sum(float(run.metric("clean").sum()) for run in runs), abs=1e-5)
    found = []
    for up, down in EDGES:
        absent = torch.zeros(len(graph.upstream), len(graph.downstream))
        absent[graph.upstream.index(up), graph.downstream.index(down)] = 1
        value = sum(
            float(run.score(masked_pass(bert, run.target_inputs, run.source_stacks(), absent)).sum())
            for run in runs
        )
        expected = _masked_metric(bert, {(up, down)})
        assert value == pytest.approx(expected, abs=1e-4), (up, down)
        found.append(value - clean)
    assert max(np.abs(found)) > 1e-3  # the edges chosen do matter


def test_a_circuits_faithfulness_equals_the_reference_masked_pass(
    bert: LoadedModel, eap: CircuitResult
) -> None:
    frame = eap.edges_frame()
    every = set(zip(frame["upstream"], frame["downstream"], strict=True))
    full, empty = _masked_metric(bert, set()), _masked_metric(bert, every)
    assert empty / len(PAIRS) == pytest.approx(eap.corrupted_metric, abs=1e-5)
    size = 6  # 10 % of the edges: some kept, most absent, edges into every kind of input among them
    count = eap.edges[size]
    graph = circuit_graph(bert)
    kept = np.zeros_like(graph.real)
    for up, down in zip(frame["upstream"][:count], frame["downstream"][:count], strict=True):
        kept[graph.upstream.index(up), graph.downstream.index(down)] = True
    # pruned first, as MIB's evaluate_graph prunes: here that changes the metric (a kept edge out of a node
    # no kept edge feeds carries the corrupted run's output through the norms with this pass's scales, a
    # pruned one with the corrupted run's)
    pruned = graph.pruned(kept)
    assert 0 < pruned.sum() < kept.sum()
    value = _masked_metric(bert, every - set(graph.edge_names(*np.nonzero(pruned))))
    assert 0 < count < len(frame)
    assert eap.faithfulness["eap"][size] == pytest.approx((value - empty) / (full - empty), abs=1e-4)


def _second_token_hidden(group: PairGroup) -> PairGroup:
    """``group`` with its corrupted runs' second token hidden from attention (attention mask 0): its clean
    and corrupted inputs differ in more than their tokens."""
    mask = group.corrupted["attention_mask"].clone()
    mask[:, 1] = 0
    return replace(group, corrupted={**group.corrupted, "attention_mask": mask})


# EAP-IG's first point is the corrupted run where the inputs differ in their tokens only; with masks that
# differ too, a pass on the clean input (its mask) with the corrupted embeddings, after a plain corrupted run
@pytest.mark.parametrize(("steps", "hidden"), [(None, False), (2, False), (2, True)])
def test_eap_and_eap_ig_equal_gradients_taken_at_the_reference_inputs(
    bert: LoadedModel, steps: int | None, hidden: bool
) -> None:
    """The scores ``circuit`` ranks by (its sum over the groups, over the pairs), without its curves."""
    graph = circuit_graph(bert)
    groups = [_second_token_hidden(group) if hidden else group for group in _groups(bert)]
    method = "eap" if steps is None else "eap-ig"
    scores = sum(
        attribution_scores(bert, circuit_runs(bert, group, "noising", "logit-diff", method, steps or 1))
        for group in groups
    )
    layers = bert.model.config.num_hidden_layers
    downstream = sorted({down for _, down in EDGES})
    expected: dict[tuple[str, str], float] = {}
    for group in groups:
        clean, corrupted = _plain(bert, group.clean), _plain(bert, group.corrupted)
        start = clean["pre", 0]["input"]
        points = [None] if steps is None else [k / steps for k in range(steps)]
        gradients = {node: torch.zeros_like(start) for node in downstream}
        for alpha in points:
            embedding = None
            if alpha is not None:  # MIB: corrupted + (k / steps) (clean - corrupted), k = 0 .. steps - 1
                embedding = corrupted["pre", 0]["input"] + alpha * (start - corrupted["pre", 0]["input"])
            nudges = {node: torch.zeros_like(start, requires_grad=True) for node in downstream}
            edits = {node: (lambda x, _live, nudge=nudges[node]: x + nudge) for node in downstream}
            with torch.enable_grad(), decomposing(bert, edits, embedding):
                metric = _logit_difference(bert.model(**group.clean).logits, group).sum()
                found = torch.autograd.grad(metric, [nudges[node] for node in downstream])
            for node, gradient in zip(downstream, found, strict=True):
                gradients[node] += gradient / len(points)
        for up, down in EDGES:
            point = _point(down.split("<")[0], layers)
            change = (corrupted[point][up] - clean[point][up]) * gradients[down]
            expected[up, down] = expected.get((up, down), 0.0) + float(change.sum()) / len(PAIRS)
    for (up, down), value in expected.items():
        score = float(scores[graph.upstream.index(up), graph.downstream.index(down)]) / len(PAIRS)
        assert score == pytest.approx(value, rel=1e-4, abs=1e-5), (up, down)
    assert max(abs(value) for value in expected.values()) > 1e-3


@pytest.mark.parametrize(
    "model_type", ["roberta", "xlm-roberta", "electra", "camembert", "ernie", "data2vec-text", "mpnet"]
)
def test_the_full_and_the_empty_graph_of_bert_kin_are_the_clean_and_the_corrupted_run(
    tiny_model_dirs: dict[str, Path], model_type: str
) -> None:
    """Every post-norm encoder circuits accept besides BERT: RoBERTa, XLM-RoBERTa, CamemBERT and
    Data2Vec-Text (BERT's layout, other embeddings), ELECTRA (narrower embeddings projected up), ERNIE
    and MPNet (its norms named otherwise, a relative position bias): the masked pass with
    no edge absent gives the clean logits, with every edge absent the corrupted ones (two masked passes, as
    ``circuit`` measures f = 1 and f = 0). Two texts of one token count in every tokenizer here."""
    loaded = tiny_classifier(tiny_model_dirs[model_type])
    with torch.no_grad():
        for parameter in loaded.model.base_model.parameters():
            if parameter.dim() == 2:
                parameter.mul_(10)
    pair = PatchPair("a b c d", "a b c e", None, None, "pos", "neg", 1)
    (group,) = encode_pairs(loaded, [pair]).groups
    run = circuit_runs(loaded, group, "noising", "logit-diff")
    graph = circuit_graph(loaded)
    none = torch.zeros(len(graph.upstream), len(graph.downstream))
    full = masked_pass(loaded, run.target_inputs, run.source_stacks(), none)
    empty = masked_pass(loaded, run.target_inputs, run.source_stacks(), 1 - none)
    assert (run.logits["clean"] - run.logits["corrupted"]).abs().max() > 0.05
    torch.testing.assert_close(full, run.logits["clean"], rtol=0, atol=1e-5)
    torch.testing.assert_close(empty, run.logits["corrupted"], rtol=0, atol=1e-5)


def test_an_encoder_whose_norms_are_not_known_is_refused_in_one_sentence(
    tiny_model_dirs: dict[str, Path],
) -> None:
    distilbert = tiny_classifier(tiny_model_dirs["distilbert"])
    with pytest.raises(
        BertologyError, match=r"^Circuits in encoders work for post-norm BERT, .* is a distilbert model\.$"
    ):
        circuit(distilbert, PAIRS)


def test_the_command_finds_a_classifiers_circuit_and_writes_its_files(
    tiny_classifier_run: Path, tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    labels = {"label": "1", "wrong_label": "0"}  # the run's label names
    records = [{"clean": p.clean, "corrupted": p.corrupted, **labels} for p in PAIRS[:1]]  # one group
    pairs.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    output = tmp_path / "circuit"
    code, text = invoke("circuit", str(tiny_classifier_run), str(pairs), "-o", str(output), "--method", "eap")
    assert code == 0, text
    edges = pd.read_csv(output / "edges.csv")
    assert {"input", "a0.h0", "m2"} <= set(edges["upstream"]) and {"a2.h3<k>", "logits"} <= set(
        edges["downstream"]
    )
    summary = json.loads((output / "summary.json").read_text())
    assert summary["edges"] == len(edges) and summary["pairs"] == 1 and summary["layers"] == 3
    faithfulness = pd.read_csv(output / "faithfulness.csv")
    assert set(faithfulness["method"]) == {"eap", "random"} and len(faithfulness) == 20
    assert (output / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (output / "circuit.html").is_file() and (output / "graph.json").is_file()
