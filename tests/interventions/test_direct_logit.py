"""Direct logit attribution and next-token saliency of decoder language models, on tiny random decoders.

Tolerances: the target logit read again from the model, abs 1e-6 (the same float32 pass); the heads' and
other terms' contributions summed against it, abs 1e-5 (about 20 float32 terms of order 1); one head's
contribution recomputed here as o_proj's slice times z, abs 1e-5 (a float32 dot product over the hidden
width); a probability from the same softmax, rel 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import bertology
from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions import direct_logit_attribution, explain
from bertology.models.loading import LoadedModel

PROMPT = "the quick brown fox jumps over"


@pytest.fixture(scope="module")
def language_models(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    """``load(model_type)``: the tiny decoder of that type with a seeded language-modelling head."""
    cache: dict[str, LoadedModel] = {}

    def load(model_type: str) -> LoadedModel:
        if model_type not in cache:
            torch.manual_seed(0)
            cache[model_type] = bertology.load_model(tiny_model_dirs[model_type], language_model=True)
        return cache[model_type]

    return load


def prompt_inputs(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    return loaded.model_inputs(encode(loaded.tokenizer, [PROMPT], max_length=loaded.max_length))


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_the_terms_sum_to_the_logit(language_models: Callable[[str], LoadedModel], model_type: str) -> None:
    loaded = language_models(model_type)
    inputs = prompt_inputs(loaded)
    with torch.no_grad():
        logits = loaded.model(**inputs).logits[0, -1]
    for target in (int(logits.argmax()), 7):
        result = direct_logit_attribution(loaded, inputs, target)
        assert result.heads.shape == (loaded.num_layers, loaded.num_heads)
        assert result.logit == pytest.approx(float(logits[target]), abs=1e-6)
        assert result.total == pytest.approx(result.logit, abs=1e-5)
        assert np.abs(result.heads).max() > 1e-3  # the heads do contribute


def test_each_head_equals_its_attention_times_values(language_models: Callable[[str], LoadedModel]) -> None:
    """Head h of layer l, computed from the model's own attention probabilities and value vectors (grouped
    query: value head h // groups) through o_proj's columns, read along the frozen-scale unembedding row."""
    loaded = language_models("mistral")  # 4 query heads on 2 key/value heads
    inputs, target = prompt_inputs(loaded), 11
    final: list[torch.Tensor] = []
    base = loaded.model.base_model
    handle = base.norm.register_forward_pre_hook(lambda _m, args: final.append(args[0][0, -1]))
    with torch.no_grad():
        output = loaded.model(**inputs, output_attentions=True, output_hidden_states=True)
    handle.remove()
    norm, x = base.norm, final[0]
    direction = (
        norm.weight
        * loaded.model.lm_head.weight[target]
        / torch.sqrt(x.pow(2).mean() + norm.variance_epsilon)
    )
    result = direct_logit_attribution(loaded, inputs, target)
    for layer_index, layer in enumerate(base.layers):
        attention = layer.self_attn
        groups, dim = attention.num_key_value_groups, attention.head_dim
        with torch.no_grad():
            values = attention.v_proj(layer.input_layernorm(output.hidden_states[layer_index]))[0]
            for head in range(loaded.num_heads):
                probs = output.attentions[layer_index][0, head, -1]  # [n]: the last token's row
                slot = head // groups
                z = probs @ values[:, slot * dim : (slot + 1) * dim]
                out = attention.o_proj.weight[:, head * dim : (head + 1) * dim] @ z
                expected = float(out @ direction)
                assert result.heads[layer_index, head] == pytest.approx(expected, abs=1e-5)


def test_integrated_gradients_complete_on_a_decoder(language_models: Callable[[str], LoadedModel]) -> None:
    loaded = language_models("llama")
    explanation = explain(loaded, PROMPT, methods=["integrated-gradients", "input-x-gradient"], steps=30)
    assert explanation.special[0] and explanation.tokens[0] == "<s>"  # the BOS, kept by the baseline
    change = explanation.logit - explanation.baseline_logit
    assert abs(change) > 0.05
    assert abs(explanation.completeness_gap) < 1e-4 * max(1.0, abs(change))
    assert explanation.attributions["integrated-gradients"][0] == 0.0
    assert explanation.heads is not None and explanation.heads.total == pytest.approx(
        explanation.logit, abs=1e-5
    )
    assert explanation.label == explanation.predicted


def test_a_given_target_token(language_models: Callable[[str], LoadedModel]) -> None:
    loaded = language_models("llama")
    token = loaded.tokenizer.convert_ids_to_tokens(9)
    by_text = explain(loaded, PROMPT, target=token, methods=["gradient"])
    by_id = explain(loaded, PROMPT, target=9, methods=["gradient"])
    inputs = prompt_inputs(loaded)
    with torch.no_grad():
        probabilities = torch.softmax(loaded.model(**inputs).logits[0, -1], -1)
    assert by_text.probability == pytest.approx(float(probabilities[9]), rel=1e-5)
    np.testing.assert_allclose(by_text.attributions["gradient"], by_id.attributions["gradient"])
    with pytest.raises(BertologyError, match="not one"):
        explain(loaded, PROMPT, target="quick brown fox", methods=["gradient"])


def test_refusals(
    loaded_types: Callable[[str], LoadedModel], language_models: Callable[[str], LoadedModel]
) -> None:
    with pytest.raises(BertologyError, match="language_model=True"):
        explain(loaded_types("llama"), PROMPT, methods=["gradient"])  # the bare decoder has no logits
    with pytest.raises(BertologyError, match="decoders llama"):
        explain(language_models("gemma"), PROMPT, methods=["gradient"])  # norms after attention
    with pytest.raises(BertologyError, match="pair"):
        explain(language_models("llama"), PROMPT, "a second text", methods=["gradient"])
