"""Head gates, sites, ablation, importance and patching on encoder-decoders (tiny random BART and T5), in all
three stacks: each checked against a plain torch hook on the Hugging Face module written out here
(independently of the stacks in :mod:`bertology.models.model_types`) and a cross-entropy computed here;
``ablate`` refuses in one sentence (a BertologyError, which the entry point prints as one line) what an
encoder-decoder does not have."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.interventions.gates import head_gates, stack_row
from bertology.interventions.importance import head_importance
from bertology.interventions.target_loss import SourceTargets, TargetLossTask
from bertology.interventions.target_patching import patch_target_loss
from bertology.models.anatomy import attention_parts
from bertology.models.loading import LoadedModel, load_model
from bertology.models.sites import recording, replacing

#: Each stack's output projection of layer ``{l}`` (its input: the heads' outputs side by side), as the
#: modeling files name them.
OUTPUT_PROJECTIONS = {
    "bart": {
        "encoder": "encoder.layers.{l}.self_attn.out_proj",
        "decoder": "decoder.layers.{l}.self_attn.out_proj",
        "cross": "decoder.layers.{l}.encoder_attn.out_proj",
    },
    "t5": {
        "encoder": "encoder.block.{l}.layer.0.SelfAttention.o",
        "decoder": "decoder.block.{l}.layer.0.SelfAttention.o",
        "cross": "decoder.block.{l}.layer.1.EncDecAttention.o",
    },
}
#: Both tiny models have 8-dimensional heads.
HEAD_DIM = 8
PAIRS = [("the cat sat on the mat", "a cat sat"), ("dogs run fast", "dogs run"), ("birds fly high", "birds")]


@pytest.fixture(scope="module")
def seq2seq(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    """``load(architecture)``: the tiny BART or T5 with its language-modelling head, loaded once."""
    cache: dict[str, LoadedModel] = {}

    def load(architecture: str) -> LoadedModel:
        if architecture not in cache:
            cache[architecture] = load_model(tiny_model_dirs[architecture], language_model=True, device="cpu")
        return cache[architecture]

    return load


def _projection(loaded: LoadedModel, architecture: str, stack: str, layer: int) -> torch.nn.Module:
    return loaded.model.base_model.get_submodule(OUTPUT_PROJECTIONS[architecture][stack].format(l=layer))


@contextmanager
def _setting_head(
    projection: torch.nn.Module, head: int, values: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """A plain forward pre-hook: head ``head``'s slice of the projection's input set to ``values(slice)``."""

    def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        heads = args[0].clone()
        part = slice(head * HEAD_DIM, (head + 1) * HEAD_DIM)
        heads[..., part] = values(heads[..., part])
        return (heads, *args[1:])

    handle = projection.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _target_loss(logits: torch.Tensor, task: TargetLossTask) -> float:
    """The mean cross-entropy of every target token, computed here from one batch's logits of all pairs."""
    losses = [
        torch.nn.functional.cross_entropy(
            logits[row, : len(labels)].double(), torch.as_tensor(labels), reduction="sum"
        )
        for row, labels in enumerate(task.data.labels)
    ]
    return float(sum(losses) / task.data.predicted_tokens)


@pytest.mark.parametrize("architecture", ["bart", "t5"])
@pytest.mark.parametrize("stack", ["encoder", "decoder", "cross"])
def test_a_gate_on_any_stacks_head_equals_zeroing_its_slice(
    seq2seq: Callable[[str], LoadedModel], architecture: str, stack: str
) -> None:
    loaded = seq2seq(architecture)
    task = TargetLossTask(loaded, SourceTargets.of_texts(loaded, PAIRS))
    inputs = task.inputs_of(np.arange(len(PAIRS)))
    with torch.no_grad():
        plain = loaded.model(**inputs).logits
        with head_gates(loaded, {(stack_row(loaded, stack, 1), 2)}):
            gated = loaded.model(**inputs).logits
        with _setting_head(_projection(loaded, architecture, stack, 1), 2, torch.zeros_like):
            hooked = loaded.model(**inputs).logits
    assert not torch.equal(gated, plain)  # the head matters, so equality below says something
    assert torch.equal(gated, hooked)


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_stacked_sites_equal_the_modules_tensors_and_the_models_attentions(
    seq2seq: Callable[[str], LoadedModel], architecture: str
) -> None:
    loaded = seq2seq(architecture)
    task = TargetLossTask(loaded, SourceTargets.of_texts(loaded, PAIRS))
    inputs = task.inputs_of(np.arange(len(PAIRS)))
    seen: dict[str, torch.Tensor] = {}
    handles = [
        _projection(loaded, architecture, stack, 1).register_forward_pre_hook(
            lambda _module, args, stack=stack: seen.__setitem__(stack, args[0])
        )
        for stack in ("encoder", "decoder", "cross")
    ]
    sites = [(f"{stack}:{name}", 1) for stack in ("encoder", "decoder", "cross") for name in ("z", "pattern")]
    try:
        with torch.no_grad(), recording(loaded.model, sites) as cache:
            output = loaded.model(**inputs, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    for stack in ("encoder", "decoder", "cross"):
        assert torch.equal(cache[f"{stack}:z", 1].flatten(-2), seen[stack])
    assert torch.equal(cache["encoder:pattern", 1], output.encoder_attentions[1])
    assert torch.equal(cache["decoder:pattern", 1], output.decoder_attentions[1])
    assert torch.equal(cache["cross:pattern", 1], output.cross_attentions[1])
    sources, targets = inputs["input_ids"].shape[1], inputs["decoder_input_ids"].shape[1]
    assert cache["cross:pattern", 1].shape == (len(PAIRS), loaded.num_heads, targets, sources)


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_replacing_a_cross_attention_heads_output_equals_its_gate(
    seq2seq: Callable[[str], LoadedModel], architecture: str
) -> None:
    loaded = seq2seq(architecture)
    inputs = TargetLossTask(loaded, SourceTargets.of_texts(loaded, PAIRS)).inputs_of(np.arange(len(PAIRS)))

    def without_head_2(z: torch.Tensor, _layer: int | None) -> torch.Tensor:
        z = z.clone()
        z[:, :, 2] = 0
        return z

    with torch.no_grad():
        with replacing(loaded.model, {("cross:z", 1): without_head_2}):
            replaced = loaded.model(**inputs).logits
        with head_gates(loaded, {(stack_row(loaded, "cross", 1), 2)}):
            gated = loaded.model(**inputs).logits
    assert torch.equal(replaced, gated)


def test_an_encoder_decoders_sites_name_their_stack(seq2seq: Callable[[str], LoadedModel]) -> None:
    loaded = seq2seq("bart")
    with pytest.raises(BertologyError, match="name their stack"), recording(loaded.model, ["z"]):
        pass
    with (
        pytest.raises(BertologyError, match="no site 'cross:resid_pre'"),
        recording(loaded.model, ["cross:resid_pre"]),
    ):
        pass
    with pytest.raises(BertologyError, match="There is no cross layer 2"):
        stack_row(loaded, "cross", 2)
    # what works on one stack only (pruning, norm weights, exact patching) says where the stacks' are
    with pytest.raises(BertologyError, match="is an encoder-decoder, whose heads bertology gates"):
        attention_parts(loaded.model)


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_patching_a_cross_attention_head_equals_a_hooked_pass(
    seq2seq: Callable[[str], LoadedModel], architecture: str
) -> None:
    loaded = seq2seq(architecture)
    clean = TargetLossTask(loaded, SourceTargets.of_texts(loaded, PAIRS))
    # corrupted sources: each clean source's inner tokens in reverse order (its token count kept)
    reversed_sources = [np.concatenate([ids[:1], ids[1:-1][::-1], ids[-1:]]) for ids in clean.data.sources]
    corrupted = SourceTargets(reversed_sources, clean.data.labels, ["reversed"] * len(PAIRS))
    row = stack_row(loaded, "cross", 0)
    patching = patch_target_loss(clean, corrupted, heads=[(row, 3), (row, 0)])  # the other heads stay NaN
    # By hand: the clean run's slice of head 3 of cross-attention layer 0, put into the corrupted run.
    projection = _projection(loaded, architecture, "cross", 0)
    kept: list[torch.Tensor] = []
    rows = np.arange(len(PAIRS))
    with torch.no_grad():
        with _setting_head(projection, 3, lambda part: kept.append(part.clone()) or part):
            clean_logits = loaded.model(**clean.inputs_of(rows)).logits
        corrupted_task = TargetLossTask(loaded, corrupted)
        corrupted_logits = loaded.model(**corrupted_task.inputs_of(rows)).logits
        with _setting_head(projection, 3, lambda _part: kept[0]):
            patched_logits = loaded.model(**corrupted_task.inputs_of(rows)).logits
    losses = [_target_loss(logits, clean) for logits in (clean_logits, corrupted_logits, patched_logits)]
    # float64 sums of float32 logits computed in two orders: 1e-9 nats is far above their rounding
    assert patching.loss_clean == pytest.approx(losses[0], abs=1e-9)
    assert patching.loss_corrupted == pytest.approx(losses[1], abs=1e-9)
    assert patching.loss_patched[row, 3] == pytest.approx(losses[2], abs=1e-9)
    frame = patching.to_frame()
    assert list(frame.columns) == ["stack", "layer", "head", "loss", "effect"]
    assert frame["loss"].notna().sum() == 2  # the heads not patched are NaN
    cell = frame[(frame["stack"] == "cross") & (frame["layer"] == 0) & (frame["head"] == 3)]
    assert cell.effect.item() == pytest.approx((losses[2] - losses[1]) / (losses[0] - losses[1]), abs=1e-6)


def test_importance_is_the_gradient_of_the_target_loss_at_each_gate(
    seq2seq: Callable[[str], LoadedModel],
) -> None:
    loaded = seq2seq("t5")
    task = TargetLossTask(loaded, SourceTargets.of_texts(loaded, PAIRS[:1]))
    importance = head_importance(task)
    # one pair: |dL/dξ| of decoder layer 1, head 0, by a central difference of the loss
    row, step = stack_row(loaded, "decoder", 1), 1e-3
    losses = []
    for gate in (1 + step, 1 - step):
        gates = torch.ones(loaded.gate_layers, loaded.num_heads, dtype=torch.float64)
        gates[row, 0] = gate
        losses.append(task.evaluate(gates=gates))
    # a central difference of float32 passes: its error (~1e-4 relative) bounds the tolerance
    assert importance.raw[row, 0] == pytest.approx(abs(losses[0] - losses[1]) / (2 * step), rel=1e-2)
    assert list(importance.to_frame().columns[:3]) == ["stack", "layer", "head"]


@pytest.mark.parametrize("architecture", ["bart", "t5"])
def test_ablate_command_on_an_encoder_decoder_writes_the_stack_column(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, architecture: str
) -> None:
    corpus = tmp_path / "pairs.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": s, "target": t}) + "\n" for s, t in PAIRS[:2]), encoding="utf-8"
    )
    output = tmp_path / "ablation"
    arguments = ["ablate", str(tiny_model_dirs[architecture]), "--lm-corpus", str(corpus), "-o", str(output)]
    result = CliRunner().invoke(app, [*arguments, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "Target loss" in result.output
    layers = {"bart": (3, 2), "t5": (2, 2)}[architecture]
    expected = [("encoder", layers[0]), ("decoder", layers[1]), ("cross", layers[1])]
    for name, score in (("ablation", "loss"), ("importance", "importance")):
        frame = pd.read_csv(output / f"{name}.csv")
        assert list(frame.columns[:4]) == ["stack", "layer", "head", score]
        counts = frame.groupby("stack", sort=False).layer.nunique()
        assert list(counts.items()) == expected and len(frame) == 4 * sum(n for _, n in expected)
    assert "Structural pruning" not in (output / "report.html").read_text()


def test_ablate_refuses_what_an_encoder_decoder_does_not_have(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    untargeted, pairs = tmp_path / "sources.jsonl", tmp_path / "pairs.jsonl"
    untargeted.write_text('{"text": "a source"}\n', encoding="utf-8")
    pairs.write_text('{"text": "a source", "target": "a target"}\n', encoding="utf-8")
    for corpus, extra, message in (
        (untargeted, [], "line 1 has no 'target'"),
        (pairs, ["--prune", "0.5"], "Structural pruning is for encoders and decoders"),
        (pairs, ["--ablation", "mean"], "removed with zero ablation"),
    ):
        arguments = ["ablate", str(tiny_model_dirs["bart"]), "--lm-corpus", str(corpus), "--device", "cpu"]
        output = tmp_path / f"out_{len(list(tmp_path.iterdir()))}"
        result = CliRunner().invoke(app, [*arguments, "-o", str(output), *extra])
        # the entry point prints a BertologyError as one line (exit code 1)
        assert isinstance(result.exception, BertologyError), result.output
        assert message in str(result.exception)


def test_ablate_refuses_an_option_of_the_other_kind_of_scoring(tmp_path: Path) -> None:
    corpus, task = tmp_path / "pairs.jsonl", tmp_path / "task"
    corpus.write_text('{"text": "a source", "target": "a target"}\n', encoding="utf-8")
    task.mkdir()
    output = ["-o", str(tmp_path / "out")]
    for arguments, message in (
        (["--lm-corpus", str(corpus), "--max-dev", "6"], "--max-dev goes with --task"),
        (
            ["--lm-corpus", str(corpus), "--attribution-examples", "5"],
            "--attribution-examples goes with --task",
        ),
        (["--task", str(task), "--max-segments", "3"], "--max-segments goes with --lm-corpus"),
        (["--task", str(task), "--max-len", "20"], "--max-len goes with --lm-corpus"),
    ):
        result = CliRunner().invoke(app, ["ablate", "model", *arguments, *output])
        assert result.exit_code == 2 and message in result.output, result.output
