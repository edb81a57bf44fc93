"""Head gates: gate 0 equals zeroing the head's input columns of the output projection; gate 1 is a no-op.

Tolerances: hidden states with gates against a model whose output projection's columns were zeroed here:
the same float32 matmul of other operands (a product by 0 against a zeroed weight), blocked differently in
batches: rtol and atol 1e-5 on hidden states of order 1.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions.gates import gate_values, head_gates
from bertology.models.loading import LoadedModel, load_model, wrap_model

TEXTS = ["The quick brown fox jumps over the lazy dog.", "She said that the committee would publish."]

#: The output projection of layer ``l``, found by path (independently of the package's own lookup).
OUTPUT_PROJECTION: dict[str, Callable[[nn.Module, int], nn.Linear]] = {
    "bert": lambda model, layer: model.encoder.layer[layer].attention.output.dense,
    "roberta": lambda model, layer: model.encoder.layer[layer].attention.output.dense,
    "xlm-roberta": lambda model, layer: model.encoder.layer[layer].attention.output.dense,
    "electra": lambda model, layer: model.encoder.layer[layer].attention.output.dense,
    "distilbert": lambda model, layer: model.transformer.layer[layer].attention.out_lin,
    "albert": lambda model, layer: model.encoder.albert_layer_groups[0].albert_layers[0].attention.dense,
    "mpnet": lambda model, layer: model.encoder.layer[layer].attention.attn.o,  # attention in its own code
}


def hidden_states(loaded: LoadedModel) -> torch.Tensor:
    """[batch, tokens, hidden] last hidden states of :data:`TEXTS`."""
    encoded = encode(loaded.tokenizer, TEXTS, max_length=loaded.max_length)
    with torch.inference_mode():
        return loaded.model(**loaded.model_inputs(encoded)).last_hidden_state


def zeroed_copy(loaded: LoadedModel, layers: list[int], head: int) -> LoadedModel:
    """A copy of ``loaded`` whose output projections in ``layers`` ignore ``head`` (its input columns 0)."""
    model = copy.deepcopy(loaded.model)
    width = model.config.hidden_size // loaded.num_heads
    for layer in layers:
        with torch.no_grad():
            OUTPUT_PROJECTION[loaded.model_type](model, layer).weight[
                :, head * width : (head + 1) * width
            ] = 0
    return wrap_model(model, loaded.tokenizer, "zeroed")


def check_gate_zero_equals_zeroed_weights(loaded: LoadedModel, layer: int, head: int) -> None:
    # ALBERT's layers share one output projection, so zeroing it removes the head in every layer.
    layers = list(range(loaded.num_layers)) if loaded.model_type == "albert" else [layer]
    expected = hidden_states(zeroed_copy(loaded, layers, head))
    plain = hidden_states(loaded)
    with head_gates(loaded, {(each, head) for each in layers}):
        gated = hidden_states(loaded)
    torch.testing.assert_close(gated, expected, rtol=1e-5, atol=1e-5)
    assert (gated - plain).abs().max() > 1e-4  # the head mattered, so the check can fail
    assert torch.equal(hidden_states(loaded), plain)  # nothing changes outside the block


def check_gate_one_changes_nothing(loaded: LoadedModel) -> None:
    plain = hidden_states(loaded)
    with head_gates(loaded, torch.ones(loaded.num_layers, loaded.num_heads)):
        assert torch.equal(hidden_states(loaded), plain)


@pytest.mark.parametrize(
    "architecture", ["bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra"]
)
def test_gates_on_tiny_models(architecture: str, tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs[architecture])
    check_gate_zero_equals_zeroed_weights(loaded, layer=1, head=2)
    check_gate_one_changes_nothing(loaded)


def test_gates_on_the_default_model(default_model: LoadedModel) -> None:
    check_gate_zero_equals_zeroed_weights(default_model, layer=3, head=7)
    check_gate_one_changes_nothing(default_model)


def test_per_example_gates_equal_separate_runs(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs["bert"])
    gates = torch.ones(2, loaded.num_layers, loaded.num_heads)
    gates[0, 0, 1] = 0.0
    gates[1, 2, 3] = 0.5
    with head_gates(loaded, gates):
        together = hidden_states(loaded)
    for row in range(2):
        with head_gates(loaded, gates[row]):
            alone = hidden_states(loaded)[row]
        torch.testing.assert_close(together[row], alone, rtol=1e-5, atol=1e-5)


def test_gates_stay_in_their_thread(default_model: LoadedModel) -> None:
    plain = hidden_states(default_model)
    seen: list[torch.Tensor] = []
    with head_gates(default_model, {0: range(12)}):
        worker = threading.Thread(target=lambda: seen.append(hidden_states(default_model)))
        worker.start()
        worker.join()
        gated = hidden_states(default_model)
    assert torch.equal(seen[0], plain)
    assert not torch.allclose(gated, plain)


def test_gates_are_differentiable(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = load_model(tiny_model_dirs["distilbert"])
    gates = torch.ones(loaded.num_layers, loaded.num_heads, requires_grad=True)
    encoded = encode(loaded.tokenizer, TEXTS, max_length=loaded.max_length)
    with head_gates(loaded, gates):
        output = loaded.model(**loaded.model_inputs(encoded)).last_hidden_state
    (gradient,) = torch.autograd.grad(output.square().sum(), gates)
    assert gradient.shape == (loaded.num_layers, loaded.num_heads)
    assert bool((gradient != 0).all())


@pytest.mark.parametrize(
    ("gates", "message"),
    [
        ({(6, 0)}, "There is no head (6, 0)"),
        ({0: [12]}, "There is no head (0, 12)"),
        (torch.ones(6, 11), "Gates must be [layers, heads] = [6, 12]"),
    ],
)
def test_bad_gates_are_clear_errors(default_model: LoadedModel, gates: object, message: str) -> None:
    with pytest.raises(BertologyError, match=re.escape(message)):
        gate_values(default_model, gates)  # type: ignore[arg-type]


class LayerFailure(Exception):
    """Raised on purpose inside a layer."""


def fail_inside_layer(loaded: LoadedModel, layer: int) -> Callable[[], None]:
    """Make the next forward pass fail in ``layer`` after its attention (at its output projection, which
    follows the gated heads); returns the function that removes the failure."""
    calls = 0
    projection = OUTPUT_PROJECTION[loaded.model_type](loaded.model.base_model, layer)
    target = layer + 1 if loaded.model_type == "albert" else 1  # ALBERT: one projection, called per layer

    def fail(_: nn.Module, __: tuple[torch.Tensor, ...]) -> None:
        nonlocal calls
        calls += 1
        if calls == target:
            raise LayerFailure

    return projection.register_forward_pre_hook(fail).remove


@pytest.mark.parametrize("architecture", ["bert", "albert", "distilbert", "mpnet"])
def test_a_pass_cut_short_leaves_the_next_pass_under_the_same_gates_right(
    architecture: str, tiny_model_dirs: dict[str, Path]
) -> None:
    loaded = load_model(tiny_model_dirs[architecture])
    gates = torch.rand(loaded.num_layers, loaded.num_heads, generator=torch.Generator().manual_seed(0))
    with head_gates(loaded, gates):
        fresh = hidden_states(loaded)
    with head_gates(loaded, gates):
        remove = fail_inside_layer(loaded, layer=1)
        with pytest.raises(LayerFailure):
            hidden_states(loaded)
        remove()
        after_failure = hidden_states(loaded)
        again = hidden_states(loaded)
    torch.testing.assert_close(after_failure, fresh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, fresh, rtol=1e-5, atol=1e-5)
    assert (fresh - hidden_states(loaded)).abs().max() > 1e-4  # the gates matter, so a shift would show


def test_more_attention_calls_than_layers_in_one_pass_is_an_error(tiny_model_dirs: dict[str, Path]) -> None:
    # Layers called one by one, outside a forward pass of the model, are not counted as a new pass.
    loaded = load_model(tiny_model_dirs["bert"])
    hidden = torch.randn(1, 5, loaded.model.config.hidden_size)
    with head_gates(loaded, torch.ones(loaded.num_layers, loaded.num_heads)), torch.inference_mode():
        for _ in range(loaded.num_layers):
            loaded.model.encoder.layer[0](hidden)
        with pytest.raises(RuntimeError, match="more attention calls than that in one forward pass"):
            loaded.model.encoder.layer[0](hidden)
