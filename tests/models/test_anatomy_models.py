"""Interventions and norm-based weights on every encoder type bertology.models.anatomy describes, whichever
route captures its attention: head gates against zeroed output-projection columns, the ablation sweep against
full passes, batched importance against one example at a time, pruning against gating (and reloading),
norm-based weights against a hand computation from the model's own weights and ``output_attentions``;
GPT-2's Conv1D projections; and the refusals for the types it does not describe."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_models import ARCHITECTURES, DECODERS, MORE_ENCODERS, tiny_classifier
from torch import nn
from torch.nn.functional import cross_entropy
from transformers import AutoModel, DebertaConfig, DebertaModel, FunnelConfig, FunnelModel, RoFormerConfig

import bertology
from bertology.attention.norms import NormWeighting
from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions.ablation import sweep_outputs
from bertology.interventions.data import LabelledTexts
from bertology.interventions.gates import head_gates
from bertology.interventions.importance import head_importance
from bertology.interventions.pruning import count_parameters, prune_heads, save_model
from bertology.interventions.task import ClassifierTask
from bertology.models.anatomy import attention_parts, described_types, describes
from bertology.models.classify import predict_logits
from bertology.models.loading import LoadedModel, load_model, wrap_model
from bertology.models.model_store import packaged_model_path

ENCODERS = (*ARCHITECTURES, *MORE_ENCODERS)
TEXTS = ["The quick brown fox jumps over the lazy dog.", "She said, that the committee would publish it."]
TEXT = "Researchers measured how much each head attends to punctuation, and separators."

#: Per type, independently of bertology.models.anatomy: the path from the base model to the layers, then from
#: a layer to its output projection and to the Linear computing its value vectors, and how that Linear
#: orders its rows ("separate": the values alone; "stacked": q, k, v of every head in turn; "interleaved":
#: q, k, v of head 0, then of head 1, ...).
_BERT = ("encoder.layer", "attention.output.dense", "attention.self.value", "separate")
LAYOUT: dict[str, tuple[str, str, str, str]] = {
    **{name: _BERT for name in ("bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie")},
    **{name: _BERT for name in ("data2vec-text", "xmod", "roc_bert", "xlm-roberta-xl", "megatron-bert")},
    **{name: _BERT for name in ("roformer", "mobilebert")},
    "albert": ("encoder.albert_layer_groups", "albert_layers.0.attention.dense",
               "albert_layers.0.attention.value", "separate"),
    "distilbert": ("transformer.layer", "attention.out_lin", "attention.v_lin", "separate"),
    "modernbert": ("layers", "attn.Wo", "attn.Wqkv", "stacked"),
    "gte": ("layers", "self_attn.o_proj", "self_attn.v_proj", "separate"),
    "nomic_bert": ("layers", "self_attn.o_proj", "self_attn.v_proj", "separate"),
    "deberta": ("encoder.layer", "attention.output.dense", "attention.self.in_proj", "interleaved"),
    "deberta-v2": ("encoder.layer", "attention.output.dense", "attention.self.value_proj", "separate"),
    "mpnet": ("encoder.layer", "attention.attn.o", "attention.attn.v", "separate"),
}  # fmt: skip


#: Norm-based weights (Kobayashi et al.) computed by hand here and by the capture: float32 products of each
#: value vector with the output projection, their norms and the normalising sum, in another order. Each is
#: a sum of d <= 768 float32 terms (relative error about sqrt(d)·2^-24, 2e-6), through a square root and a
#: ratio: rtol 1e-4 leaves a margin for the wider models, atol 1e-6 for weights near 0.
NORM_RTOL, NORM_ATOL = 1e-4, 1e-6


def layer_module(model: nn.Module, model_type: str, layer: int, path: str) -> nn.Module:
    layers, *_ = LAYOUT[model_type]
    groups = model.base_model.get_submodule(layers)
    return groups[0 if model_type == "albert" else layer].get_submodule(path)


def model_inputs(loaded: LoadedModel, texts: list[str]) -> dict[str, torch.Tensor]:
    return loaded.model_inputs(encode(loaded.tokenizer, texts, max_length=loaded.max_length))


def hidden_states(loaded: LoadedModel) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model(**model_inputs(loaded, TEXTS)).last_hidden_state


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor, baseline: torch.Tensor) -> None:
    """``actual`` equals ``expected`` far within the change from ``baseline`` that both show (tiny random
    MobileBERTs change their outputs by 1e-5 only), and that change is real."""
    change = (expected - baseline).abs().max()
    assert change > 1e-6
    assert (actual - expected).abs().max() <= 1e-3 * change + 1e-7


def test_every_encoder_and_decoder_type_is_described_and_no_other() -> None:
    assert set(described_types()) == {*ENCODERS, "gpt2", *DECODERS}
    assert not any(describes(name) for name in ("bart", "t5", "funnel"))


@pytest.mark.parametrize("model_type", ENCODERS)
def test_gates_equal_zeroed_output_columns(model_type: str, tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs[model_type])
    plain = hidden_states(loaded)
    with head_gates(loaded, torch.ones(loaded.num_layers, loaded.num_heads)):
        assert torch.equal(hidden_states(loaded), plain)
    # ALBERT's layers share one output projection: zeroing it removes the head from every layer.
    layers = list(range(loaded.num_layers)) if model_type == "albert" else [1]
    head = 2
    zeroed = copy.deepcopy(loaded.model)
    for layer in layers:
        output = layer_module(zeroed, model_type, layer, LAYOUT[model_type][1])
        width = output.in_features // loaded.num_heads
        with torch.no_grad():
            output.weight[:, head * width : (head + 1) * width] = 0
    expected = hidden_states(wrap_model(zeroed, loaded.tokenizer, "zeroed"))
    with head_gates(loaded, {(layer, head) for layer in layers}):
        gated = hidden_states(loaded)
    assert_close_to(gated, expected, plain)
    assert torch.equal(hidden_states(loaded), plain)  # nothing changes outside the block


def value_rows(model: nn.Module, model_type: str, layer: int, head: int, d: int) -> tuple[nn.Linear, slice]:
    """The Linear computing ``layer``'s value vectors and the rows of ``head``'s (``d`` features each)."""
    _, _, value_path, order = LAYOUT[model_type]
    linear = layer_module(model, model_type, layer, value_path)
    heads = linear.out_features // d // (1 if order == "separate" else 3)
    starts = {"separate": head * d, "stacked": (2 * heads + head) * d, "interleaved": (3 * head + 2) * d}
    return linear, slice(starts[order], starts[order] + d)


def hand_norm_weights(directory: Path, loaded: LoadedModel) -> np.ndarray:
    """[layers, heads, n, n] norm-based weights of :data:`TEXT` from an independently loaded eager model:
    its ``output_attentions``, each layer's value Linear applied by hand to that Linear's own input (rows by
    :data:`LAYOUT`; DeBERTa adds its separate ``v_bias``), each head's block of the output projection, and
    ``a_ij ||f(x_j)||`` row-normalised."""
    model_type = loaded.model_type
    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    value_path = LAYOUT[model_type][2]
    linears = {id(linear): linear for linear in (
        layer_module(reference, model_type, layer, value_path) for layer in range(loaded.num_layers)
    )}  # fmt: skip
    entering: list[torch.Tensor] = []  # per layer, [n, features] the value Linear's input
    handles = [
        linear.register_forward_pre_hook(lambda _, args: entering.append(args[0][0]))
        for linear in linears.values()
    ]
    with torch.no_grad():
        attentions = reference(**model_inputs(loaded, [TEXT]), output_attentions=True).attentions
        for handle in handles:
            handle.remove()
        result = []
        for layer, probs in enumerate(attentions):  # probs [1, heads, n, n]
            output = layer_module(reference, model_type, layer, LAYOUT[model_type][1])
            heads = probs.shape[1]
            d = output.in_features // heads
            per_head = []
            for head in range(heads):
                linear, rows = value_rows(reference, model_type, layer, head, d)
                own = slice(head * d, (head + 1) * d)  # the head's features and output columns
                values = entering[layer] @ linear.weight[rows].T  # [n, d]
                if linear.bias is not None:
                    values = values + linear.bias[rows]
                if model_type == "deberta":  # its value bias is a parameter of its own
                    values = values + layer_module(reference, model_type, layer, "attention.self").v_bias[own]
                norms = torch.linalg.vector_norm(values @ output.weight[:, own].T, dim=-1)
                weighted = probs[0, head] * norms[None, :]
                per_head.append(weighted / weighted.sum(-1, keepdim=True))
            result.append(torch.stack(per_head))
    return torch.stack(result).numpy()


@pytest.mark.parametrize("model_type", ENCODERS)
def test_norm_weights_equal_a_hand_computation(model_type: str, tiny_model_dirs: dict[str, Path]) -> None:
    directory = tiny_model_dirs[model_type]
    loaded = load_model(directory)
    captured = bertology.capture(TEXT, model=loaded, weights="norm")
    expected = hand_norm_weights(directory, loaded)
    np.testing.assert_allclose(captured.probs, expected, rtol=NORM_RTOL, atol=NORM_ATOL)
    softmax = bertology.capture(TEXT, model=loaded).probs
    assert np.abs(softmax - expected).max() > 1e-3  # the norms matter, so the check can fail
    value_projections = {
        id(parts.value.linear): parts.value.linear for parts in attention_parts(loaded.model)
    }
    assert not any(linear._forward_hooks for linear in value_projections.values())  # the tap is gone


def importance_one_by_one(loaded: LoadedModel, data: LabelledTexts) -> np.ndarray:
    """[layers, heads] ``E_x |dL(x)/dξ|`` from one forward and backward pass per example, with one set of
    gates ``[layers, heads]`` each (no batching, no padding)."""
    total = np.zeros((loaded.num_layers, loaded.num_heads))
    for text, label in zip(data.texts, data.labels, strict=True):
        gates = torch.ones(loaded.num_layers, loaded.num_heads, dtype=torch.float64, requires_grad=True)
        with head_gates(loaded, gates):
            logits = loaded.model(**model_inputs(loaded, [text])).logits
        (gradient,) = torch.autograd.grad(cross_entropy(logits, torch.tensor([label])), gates)
        total += gradient.abs().numpy()
    return total / len(data)


#: Heads to remove, including every head of layer 1 (the layer then adds only its output bias).
PRUNED = {0: [1, 3], 1: [0, 1, 2, 3]}


@pytest.mark.parametrize("model_type", ENCODERS)
def test_ablation_importance_and_pruning(
    model_type: str, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    loaded = tiny_classifier(tiny_model_dirs[model_type])
    data = LabelledTexts([*TEXTS, TEXT], None, np.array([0, 1, 1]))

    # The sweep that reuses the lower layers (each type's own layer arguments) gives the full passes' logits.
    task = ClassifierTask(loaded, data)
    fast_baseline, fast = sweep_outputs(task, lambda logits, *_: logits.float(), batch_size=2)
    slow_baseline, slow = sweep_outputs(
        task, lambda logits, *_: logits.float(), batch_size=2, reuse_lower_layers=False
    )
    # the same float32 logits, the lower layers' outputs reused rather than recomputed in another batch
    # shape: matmul sums reordered, a few units of 2^-24 relative on each logit
    np.testing.assert_allclose(fast_baseline, slow_baseline, rtol=1e-5, atol=1e-7)
    assert_close_to(torch.from_numpy(fast), torch.from_numpy(slow), torch.from_numpy(slow_baseline))

    gated = torch.from_numpy(predict_logits(loaded, TEXTS))
    with head_gates(loaded, PRUNED):
        expected = torch.from_numpy(predict_logits(loaded, TEXTS))
    if model_type == "albert":
        with pytest.raises(BertologyError, match="gate it instead"):
            prune_heads(loaded, PRUNED)
    else:
        pruned = prune_heads(wrap_model(copy.deepcopy(loaded.model), loaded.tokenizer, "pruned"), PRUNED)
        assert_close_to(torch.from_numpy(predict_logits(pruned, TEXTS)), expected, gated)
        assert count_parameters(pruned.model) < count_parameters(loaded.model)
        widths = [
            layer_module(pruned.model, model_type, layer, LAYOUT[model_type][1]).in_features
            for layer in (0, 1)
        ]
        head_dim = (
            layer_module(loaded.model, model_type, 0, LAYOUT[model_type][1]).in_features // loaded.num_heads
        )
        assert widths == [2 * head_dim, head_dim]  # two heads kept; one (zeroed) where all were removed
        save_model(pruned, tmp_path / "run")
        reloaded = load_model(tmp_path / "run", classifier=True)
        assert_close_to(torch.from_numpy(predict_logits(reloaded, TEXTS)), expected, gated)

    # Per-example gates in padded batches give each example's own gradient (the gradient itself is checked
    # against finite differences in test_ablation; DeBERTa's float32 layer norms blur those in float64).
    # head_importance takes the loss in float32, hence the tolerance.
    loaded.model.double()
    importance = head_importance(ClassifierTask(loaded, data), batch_size=2)
    expected = importance_one_by_one(loaded, data)
    np.testing.assert_allclose(importance.raw, expected, rtol=1e-4, atol=1e-10)
    assert expected.max() > 1e-8


def test_gpt2_heads_are_gated_and_weighed_through_its_conv1d_projections_but_not_pruned(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """GPT-2's projections are Conv1D (weight [in, out], ``y = x W + b``; q, k, v stacked in ``c_attn``):
    gate 0 equals zeroing the head's input rows of ``c_proj``; norm-based weights equal
    ``a_ij ||v_j W_O^h||`` with ``v_j`` from ``c_attn``'s value columns; pruning is refused."""
    directory = tiny_model_dirs["gpt2"]
    gpt2 = load_model(directory)
    d, hidden = 8, 32  # 4 heads of 8 features
    plain = hidden_states(gpt2)
    zeroed = copy.deepcopy(gpt2.model)
    with torch.no_grad():
        zeroed.h[1].attn.c_proj.weight[2 * d : 3 * d] = 0
    expected = hidden_states(wrap_model(zeroed, gpt2.tokenizer, "zeroed"))
    with head_gates(gpt2, {(1, 2)}):
        gated = hidden_states(gpt2)
    assert_close_to(gated, expected, plain)

    reference = AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    projected: list[torch.Tensor] = []  # per layer, [n, 3 * hidden] what c_attn computed
    handles = [
        block.attn.c_attn.register_forward_hook(lambda _, __, output: projected.append(output[0]))
        for block in reference.h
    ]
    with torch.no_grad():
        attentions = reference(**model_inputs(gpt2, [TEXT]), output_attentions=True).attentions
        for handle in handles:
            handle.remove()
        weights = []
        for layer, probs in enumerate(attentions):  # probs [1, heads, n, n]
            output = reference.h[layer].attn.c_proj.weight  # [heads * d, hidden]
            per_head = []
            for head in range(4):
                values = projected[layer][:, 2 * hidden + head * d : 2 * hidden + (head + 1) * d]
                norms = torch.linalg.vector_norm(values @ output[head * d : (head + 1) * d], dim=-1)
                weighted = probs[0, head] * norms[None, :]
                per_head.append(weighted / weighted.sum(-1, keepdim=True))
            weights.append(torch.stack(per_head))
    by_hand = torch.stack(weights).numpy()
    captured = bertology.capture(TEXT, model=gpt2, weights="norm")
    np.testing.assert_allclose(captured.probs, by_hand, rtol=NORM_RTOL, atol=NORM_ATOL)
    assert np.abs(bertology.capture(TEXT, model=gpt2).probs - by_hand).max() > 1e-3

    refusal = r"^Pruning rebuilds nn\.Linear projections, .* not removed \(prune none of them\)\.$"
    with pytest.raises(BertologyError, match=refusal):
        prune_heads(gpt2, {0: [1]})


def test_undescribed_and_inseparable_models_are_refused() -> None:
    small = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 50}
    funnel = FunnelModel(
        FunnelConfig(d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], vocab_size=50)
    )
    with pytest.raises(BertologyError, match="a 'funnel' model is not one of them"):
        attention_parts(funnel)
    talking = DebertaModel(DebertaConfig(num_hidden_layers=1, talking_head=True, **small))
    with pytest.raises(BertologyError, match="mixes its heads' scores"):
        attention_parts(talking)
    rotary_values = AutoModel.from_config(RoFormerConfig(num_hidden_layers=1, rotary_value=True, **small))
    with pytest.raises(BertologyError, match="rotates its value vectors by position"):
        NormWeighting(rotary_values)


def test_on_the_real_mpnet(mpnet_model: LoadedModel) -> None:
    """all-mpnet-base-v2 (12 x 12, attention in its own code): norm-based weights equal the hand computation,
    and removing a third of its heads from the weights computes what gating them to 0 does."""
    expected = hand_norm_weights(packaged_model_path("all-mpnet-base-v2"), mpnet_model)
    captured = bertology.capture(TEXT, model=mpnet_model, weights="norm")
    np.testing.assert_allclose(captured.probs, expected, rtol=NORM_RTOL, atol=NORM_ATOL)

    heads = {layer: list(range(layer % 3, 12, 3)) for layer in range(12)}
    inputs = model_inputs(mpnet_model, TEXTS)
    pruned = prune_heads(wrap_model(copy.deepcopy(mpnet_model.model), mpnet_model.tokenizer, "pruned"), heads)
    with torch.inference_mode():
        plain = mpnet_model.model(**inputs).last_hidden_state
        with head_gates(mpnet_model, heads):
            gated = mpnet_model.model(**inputs).last_hidden_state
        assert_close_to(pruned.model(**inputs).last_hidden_state, gated, plain)
    assert count_parameters(mpnet_model.model) - count_parameters(pruned.model) == 48 * (
        4 * 64 * 768 + 3 * 64
    )
