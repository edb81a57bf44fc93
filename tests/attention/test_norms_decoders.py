"""Norm-based weights of a decoder with grouped-query attention equal those of the same model with every
key/value head copied once per query head (plain multi-head attention, built here).

Tolerances: grouped-query attention against its multi-head copy (each key/value head repeated): the same
float32 numbers, except that the norms are summed over the copies' features in another order: atol 1e-6 for
the plain weights, 1e-5 for the norm-weighted ones and for a row's sum.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest

import bertology
from bertology.models.loading import LoadedModel, wrap_model

TEXT = "The quick brown fox jumps over the lazy dog."


def with_one_key_value_head_per_query_head(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` rebuilt with ``num_key_value_heads = num_attention_heads``: each k/v head's rows of k_proj
    and v_proj repeated for each query head that shares it (what the model's ``repeat_kv`` does)."""
    config = loaded.model.config
    groups = config.num_attention_heads // config.num_key_value_heads
    multi_head = copy.deepcopy(config)
    multi_head.num_key_value_heads = config.num_attention_heads
    rebuilt = type(loaded.model)(multi_head)
    state = loaded.model.state_dict()
    d = config.head_dim
    for name, tensor in state.items():
        if ".k_proj." in name or ".v_proj." in name:
            blocks = tensor.unflatten(0, (config.num_key_value_heads, d))
            state[name] = blocks.repeat_interleave(groups, dim=0).flatten(0, 1)
    rebuilt.load_state_dict(state)
    return wrap_model(rebuilt, loaded.tokenizer, "multi-head copy")


@pytest.mark.parametrize("model_type", ["llama", "gemma"])
def test_grouped_query_norm_weights_equal_the_multi_head_copy(
    model_type: str, loaded_types: Callable[[str], LoadedModel]
) -> None:
    loaded = loaded_types(model_type)
    assert loaded.model.config.num_key_value_heads < loaded.num_heads
    multi_head = with_one_key_value_head_per_query_head(loaded)
    grouped = bertology.capture(TEXT, model=loaded, weights="norm")
    multi = bertology.capture(TEXT, model=multi_head, weights="norm")
    plain = bertology.capture(TEXT, model=loaded)
    np.testing.assert_allclose(bertology.capture(TEXT, model=multi_head).probs, plain.probs, atol=1e-6)
    np.testing.assert_allclose(grouped.probs, multi.probs, atol=1e-5)
    assert np.abs(grouped.probs - plain.probs).max() > 1e-3  # the norms reweigh the attention
    np.testing.assert_allclose(grouped.probs.sum(-1), 1.0, atol=1e-5)
