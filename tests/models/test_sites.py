"""Every site of every model type equals a plain forward hook on the Hugging Face module written out here
(independently of the layouts in :mod:`bertology.models.model_types`), on the tiny models; replacing a site
with the identity changes no logit; a replaced head output equals the head gates' removal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support.tiny_models import SINGLE_STACK_TYPES, tiny_language_model

import bertology
from bertology.errors import BertologyError
from bertology.models import hook
from bertology.models.anatomy import attention_parts, layer_modules
from bertology.models.sites import (
    SITES,
    head_input_gradients,
    hook_gates,
    hooking,
    recording,
    replacing,
    skipping,
)

_BERT = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "z": "attention.output.dense",
    "attn_out": "attention.output.dense",
    "resid_mid": "attention",
    "mlp_out": "output.dense",
}
_LLAMA = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "z": "self_attn.o_proj",
    "attn_out": "self_attn.o_proj",
    "resid_mid": "post_attention_layernorm",
    "mlp_out": "mlp",
}
_GEMMA2 = {
    **_LLAMA,
    "attn_out": "post_attention_layernorm",
    "resid_mid": "pre_feedforward_layernorm",
    "mlp_out": "post_feedforward_layernorm",
}
_NOMIC = {**_LLAMA, "resid_mid": "post_attention_layernorm"}
_ALBERT = {
    "q": "albert_layers.0.attention.query",
    "k": "albert_layers.0.attention.key",
    "v": "albert_layers.0.attention.value",
    "z": "albert_layers.0.attention.dense",
    "attn_out": "albert_layers.0.attention.dense",
    "resid_mid": "albert_layers.0.attention",
    "mlp_out": "albert_layers.0.ffn_output",
}
_DISTILBERT = {
    "q": "attention.q_lin",
    "k": "attention.k_lin",
    "v": "attention.v_lin",
    "z": "attention.out_lin",
    "attn_out": "attention.out_lin",
    "resid_mid": "sa_layer_norm",
    "mlp_out": "ffn",
}
_MPNET = {
    "q": "attention.attn.q",
    "k": "attention.attn.k",
    "v": "attention.attn.v",
    "z": "attention.attn.o",
    "attn_out": "attention.attn.o",
    "resid_mid": "attention",
    "mlp_out": "output.dense",
}
_DEBERTA = {
    **_BERT,
    "q": "attention.self.in_proj",
    "k": "attention.self.in_proj",
    "v": "attention.self.in_proj",
}
_DEBERTA_V2 = {
    **_BERT,
    "q": "attention.self.query_proj",
    "k": "attention.self.key_proj",
    "v": "attention.self.value_proj",
}
_MODERNBERT = {
    "q": "attn.Wqkv",
    "k": "attn.Wqkv",
    "v": "attn.Wqkv",
    "z": "attn.Wo",
    "attn_out": "attn.Wo",
    "resid_mid": "mlp_norm",
    "mlp_out": "mlp",
}
_GPT2 = {
    "q": "attn.c_attn",
    "k": "attn.c_attn",
    "v": "attn.c_attn",
    "z": "attn.c_proj",
    "attn_out": "attn.c_proj",
    "resid_mid": "ln_2",
    "mlp_out": "mlp",
}
#: Per model type: the module (from a layer) of each per-layer site; the sites read from a module's input.
MODULES: dict[str, dict[str, str]] = {
    **dict.fromkeys(
        ("bert", "roberta", "xlm-roberta", "electra", "camembert", "ernie", "data2vec-text", "xmod",
         "roc_bert", "xlm-roberta-xl", "mobilebert", "megatron-bert", "roformer"), _BERT,
    ),
    "albert": _ALBERT, "distilbert": _DISTILBERT, "modernbert": _MODERNBERT, "nomic_bert": _NOMIC,
    "gte": _NOMIC, "deberta": _DEBERTA, "deberta-v2": _DEBERTA_V2, "mpnet": _MPNET, "gpt2": _GPT2,
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma"), _LLAMA),
    "gemma2": _GEMMA2, "gemma3_text": _GEMMA2,
}  # fmt: skip
PRE_NORM = ("modernbert", "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")


def _reads_input(model_type: str, site: str) -> bool:
    return site == "z" or (site == "resid_mid" and model_type in PRE_NORM)


def _first(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else value[0]


def _heads(model_type: str, model: torch.nn.Module, layer: torch.nn.Module, site: str, out: torch.Tensor):
    """The per-head [batch, pos, head, d_head] tensor of ``site`` from its projection's output ``out``."""
    config = model.config
    heads = config.num_attention_heads if hasattr(config, "num_attention_heads") else config.n_heads
    if model_type == "gpt2":
        return out.split(config.n_embd, dim=-1)["qkv".index(site)].unflatten(-1, (heads, -1))
    if model_type == "modernbert":
        return out.unflatten(-1, (3, heads, -1))[:, :, "qkv".index(site)]
    if model_type == "deberta":
        per_head = out.unflatten(-1, (heads, -1)).chunk(3, dim=-1)["qkv".index(site)]
        bias = {"q": "q_bias", "v": "v_bias"}.get(site)
        attention = layer.attention.self
        return per_head if bias is None else per_head + getattr(attention, bias).view(heads, -1)
    return out.unflatten(-1, (-1, getattr(config, "head_dim", None) or out.shape[-1] // heads))


def _reference(
    model_type: str, model: torch.nn.Module, inputs: dict
) -> dict[tuple[str, int | None], torch.Tensor]:
    """Every site of ``model`` on ``inputs`` from plain forward hooks on the modules of :data:`MODULES`."""
    base = model.base_model
    layers = list(layer_modules(model))
    batch = inputs["input_ids"].shape[0]
    calls: dict[tuple[int, bool], list[Any]] = {}
    handles = []

    def keep(module: torch.nn.Module, is_input: bool) -> None:
        slot = (id(module), is_input)
        if slot in calls:
            return
        calls[slot] = []
        if is_input:
            handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs: calls[slot].append(args[0] if args else kwargs["hidden_states"]),
                with_kwargs=True,
            ))  # fmt: skip
        else:
            # DeBERTa-v2 also runs its shared projections on the relative positions, a batch of 1
            handles.append(module.register_forward_hook(
                lambda _m, _a, out: calls[slot].append(_first(out)) if _first(out).shape[0] == batch else None
            ))  # fmt: skip

    embeddings = next(
        base.get_submodule(path)
        for path in ("embeddings.word_embeddings", "embed_tokens", "wte", "embeddings.tok_embeddings")
        if hasattr(base, path.split(".")[0]) and _has(base, path)
    )
    keep(embeddings, False)
    sites = MODULES[model_type]
    for layer in layers:
        keep(layer, True)
        keep(layer, False)
        for site, path in sites.items():
            keep(layer.get_submodule(path), _reads_input(model_type, site))
    try:
        with torch.no_grad():
            output = model(**inputs, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()

    def call(module: torch.nn.Module, is_input: bool, layer: int) -> torch.Tensor:
        # ALBERT: the shared module's call i is layer i
        earlier = [other for other in layers[:layer] if other is layers[layer]]
        return calls[id(module), is_input][len(earlier)]

    reference = {("embed", None): calls[id(embeddings), False][0], ("final", None): output.last_hidden_state}
    for index, layer in enumerate(layers):
        reference["resid_pre", index] = call(layer, True, index)
        reference["resid_post", index] = call(layer, False, index)
        reference["pattern", index] = output.attentions[index]
        for site, path in sites.items():
            tensor = call(layer.get_submodule(path), _reads_input(model_type, site), index)
            if site in ("q", "k", "v"):
                tensor = _heads(model_type, model, layer, site, tensor)
            if site == "z":
                tensor = tensor.unflatten(-1, (reference["q", index].shape[2], -1))
            reference[site, index] = tensor
    return reference


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _inputs(loaded: bertology.LoadedModel) -> dict:
    encoded = loaded.tokenizer(
        ["The quick brown fox jumps.", "She said that the committee would publish."],
        return_tensors="pt", padding=True,
    )  # fmt: skip
    return {key: value for key, value in encoded.items() if key in ("input_ids", "attention_mask")}


@pytest.mark.parametrize("model_type", SINGLE_STACK_TYPES)
def test_every_site_equals_a_hook_on_its_module(
    model_type: str, loaded_types: Callable[[str], bertology.LoadedModel]
) -> None:
    loaded = loaded_types(model_type)
    inputs = _inputs(loaded)
    cache = bertology.trace(loaded.model, inputs)
    reference = _reference(model_type, loaded.model, inputs)
    layers = len(layer_modules(loaded.model))
    assert set(cache) == {(name, layer) for name, layer in reference}
    assert len(cache) == 2 + layers * (len(SITES) - 3)  # embed, final; no logits in a base model
    for key, expected in reference.items():
        assert cache[key].shape == expected.shape, key
        # the same tensors from one forward pass, except "pattern" (output_attentions of a second pass)
        # and the per-head views: equal up to float32 reblocking, far below 1e-6 on these small values
        torch.testing.assert_close(cache[key], expected, rtol=0, atol=1e-6, msg=f"{model_type} {key}")


def test_ungrouped_keys_repeat_each_key_value_head_for_its_query_heads(
    loaded_types: Callable[[str], bertology.LoadedModel],
) -> None:
    """The tiny Gemma: 4 query heads share 1 key/value head."""
    loaded = loaded_types("gemma")
    inputs = _inputs(loaded)
    grouped = bertology.trace(loaded.model, inputs, sites=[("k", 1), ("v", 1), ("q", 1)])
    ungrouped = bertology.trace(loaded.model, inputs, sites=[("k", 1), ("v", 1)], ungroup=True)
    assert grouped["k", 1].shape[2] == 1 and grouped["q", 1].shape[2] == 4
    for name in ("k", "v"):
        assert ungrouped[name, 1].shape == grouped["q", 1].shape
        for head in range(4):
            torch.testing.assert_close(
                ungrouped[name, 1][:, :, head], grouped[name, 1][:, :, 0], rtol=0, atol=0
            )


@pytest.fixture(scope="module")
def llama(tiny_model_dirs: dict[str, Path]) -> bertology.LoadedModel:
    return tiny_language_model(tiny_model_dirs["llama"])


def test_ungrouped_keys_and_values_equal_the_projections_repeated_per_query_head(
    llama: bertology.LoadedModel,
) -> None:
    """The tiny Llama: 4 query heads of 8 dimensions share 2 key/value heads; ``ungroup`` gives query head
    ``h`` key/value head ``h // 2`` (as transformers' ``repeat_kv``), here from plain hooks on k_proj and
    v_proj: the same tensors, exactly."""
    config = llama.model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    inputs = _inputs(llama)
    kept: dict[str, torch.Tensor] = {}
    attention = llama.model.model.layers[1].self_attn
    handles = [
        module.register_forward_hook(lambda _m, _a, output, name=name: kept.__setitem__(name, output))
        for name, module in (("k", attention.k_proj), ("v", attention.v_proj))
    ]
    try:
        cache = bertology.trace(llama.model, inputs, sites=[("k", 1), ("v", 1)], ungroup=True)
    finally:
        for handle in handles:
            handle.remove()
    for name in ("k", "v"):
        per_key_value_head = kept[name].unflatten(-1, (2, 8))
        expected = per_key_value_head[:, :, [0, 0, 1, 1]]
        torch.testing.assert_close(cache[name, 1], expected, rtol=0, atol=0)


def test_replacing_every_site_with_itself_changes_no_logit(llama: bertology.LoadedModel) -> None:
    inputs = _inputs(llama)
    with torch.no_grad():
        plain = llama.model(**inputs).logits
        every = {name: (lambda tensor, _layer: tensor.clone()) for name in SITES if name != "pattern"}
        with replacing(llama.model, every):
            replaced = llama.model(**inputs).logits
    cache = bertology.trace(llama.model, inputs, sites=["logits"])
    torch.testing.assert_close(cache["logits"], plain, rtol=0, atol=0)
    # replacing with a clone reruns the same float32 pass: equal but for the hooks' copies, within 1e-6
    torch.testing.assert_close(replaced, plain, rtol=0, atol=1e-6)


def test_a_replaced_head_output_equals_the_gates_removing_it(llama: bertology.LoadedModel) -> None:
    inputs = _inputs(llama)

    def without_head_2(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        return torch.cat([tensor[:, :, :2], torch.zeros_like(tensor[:, :, 2:3]), tensor[:, :, 3:]], dim=2)

    hook_gates(llama.model)
    gates = torch.ones(2, 4)
    gates[1, 2] = 0
    with torch.no_grad():
        with hook.gating(gates):
            gated = llama.model(**inputs).logits
        with replacing(llama.model, {("z", 1): without_head_2}):
            replaced = llama.model(**inputs).logits
        plain = llama.model(**inputs).logits
    # a zeroed head output against gate 0: the same products by 0 in another place of the float32 pass
    torch.testing.assert_close(replaced, gated, rtol=0, atol=1e-6)
    assert (replaced - plain).abs().max() > 1e-3


def test_a_replaced_residual_stream_between_the_blocks_is_what_the_next_block_reads(
    llama: bertology.LoadedModel,
) -> None:
    """Llama is pre-norm: resid_mid is replaced through attn_out; the feed-forward block's norm then reads
    exactly the replacement, and the layer's output is it plus the feed-forward block's output."""
    inputs = _inputs(llama)
    doubled = {("resid_mid", 0): lambda tensor, _layer: tensor * 2}
    kept = [("resid_mid", 0), ("mlp_out", 0), ("resid_post", 0)]
    with torch.no_grad(), replacing(llama.model, doubled), recording(llama.model, kept) as replaced:
        llama.model(**inputs)
    plain = bertology.trace(llama.model, inputs, sites=[("resid_mid", 0)])
    # resid_mid doubled through a pre-norm model is put back as fn(pre + out) - pre: float32 rounding of
    # a difference of sums of order 1 to 10, within 1e-5
    torch.testing.assert_close(replaced["resid_mid", 0], plain["resid_mid", 0] * 2, rtol=0, atol=1e-5)
    # the block's own float32 sum, added again here: one rounding, within 1e-6
    torch.testing.assert_close(
        replaced["resid_post", 0], replaced["resid_mid", 0] + replaced["mlp_out", 0], rtol=0, atol=1e-6
    )


def test_unknown_sites_layers_and_replaced_patterns_are_refused(llama: bertology.LoadedModel) -> None:
    with pytest.raises(BertologyError, match="There is no site 'hook_z'"):
        bertology.trace(llama.model, _inputs(llama), sites=["hook_z"])
    with pytest.raises(BertologyError, match="layers 0 to 1; layer 2"):
        bertology.trace(llama.model, _inputs(llama), sites=[("z", 2)])
    with (
        pytest.raises(BertologyError, match="recorded but not replaced"),
        replacing(llama.model, {"pattern": print}),
    ):
        pass


def test_a_module_site_is_every_call_of_the_module_at_that_path(
    loaded_types: Callable[[str], bertology.LoadedModel],
) -> None:
    """ALBERT's one shared layer calls its activation function once per layer: ``consume`` is handed its
    input and its output at every call, in call order, as a plain hook on the module sees them; the
    cache keeps the last call's."""
    loaded = loaded_types("albert")
    inputs = _inputs(loaded)
    path = next(name for name, module in loaded.model.named_modules() if name.endswith(".activation"))
    plain: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = loaded.model.get_submodule(path).register_forward_hook(
        lambda _m, args, output: plain.append((args[0], output))
    )
    with torch.no_grad():
        loaded.model(**inputs)
    handle.remove()
    sites = [("module_input", path), ("module", path)]
    consumed: list[tuple[Any, torch.Tensor]] = []
    with torch.no_grad():
        with recording(loaded.model, sites, consume=lambda key, tensor: consumed.append((key, tensor))):
            loaded.model(**inputs)
        with recording(loaded.model, sites) as cache:
            loaded.model(**inputs)
    layers = len(layer_modules(loaded.model))
    assert len(plain) == layers > 1
    assert [key for key, _ in consumed] == [("module_input", path), ("module", path)] * layers
    for call, (entering, leaving) in enumerate(plain):
        torch.testing.assert_close(consumed[2 * call][1], entering, rtol=0, atol=0)
        torch.testing.assert_close(consumed[2 * call + 1][1], leaving, rtol=0, atol=0)
    torch.testing.assert_close(cache["module", path], plain[-1][1], rtol=0, atol=0)
    torch.testing.assert_close(cache["module_input", path], plain[-1][0], rtol=0, atol=0)


def test_hooks_of_a_block_go_when_it_ends_with_an_error(llama: bertology.LoadedModel) -> None:
    embeddings = llama.model.get_input_embeddings()
    calls: list[str] = []
    hooks = hooking(
        before=[(embeddings, lambda *_: calls.append("input"))],
        after=[(embeddings, lambda *_: calls.append("output"))],
    )
    with pytest.raises(ZeroDivisionError), hooks, torch.no_grad():
        llama.model(**_inputs(llama))
        _ = 1 / 0
    assert calls == ["input", "output"]
    with torch.no_grad():
        llama.model(**_inputs(llama))
    assert calls == ["input", "output"]


def test_a_skipped_layer_returns_what_it_is_given_and_its_forward_comes_back(
    llama: bertology.LoadedModel,
) -> None:
    """Skipping layer 1 of the tiny Llama: its attention never runs, the layer returns the function of its
    input (here the input itself, so the logits are the final norm and head of layer 0's output), hooks on
    the layer module still run, and after the block (one ending with an error too) the layer runs again; a
    forward set on the module itself (as accelerate sets one) is put back."""
    layer = layer_modules(llama.model)[1]
    inputs = _inputs(llama)
    with torch.no_grad():
        plain = llama.model(**inputs).logits
        kept = recording(llama.model, [("resid_post", 0), ("resid_post", 1)])
        with kept as cache, skipping(llama.model, {1: lambda hidden: hidden}):
            skipped = llama.model(**inputs).logits
        final = llama.model.get_output_embeddings()(llama.model.model.norm(cache["resid_post", 0]))
    torch.testing.assert_close(cache["resid_post", 1], cache["resid_post", 0], rtol=0, atol=0)
    torch.testing.assert_close(skipped, final, rtol=1e-5, atol=1e-5)
    assert (skipped - plain).abs().max() > 1e-3
    calls: list[int] = []
    own = layer.forward
    layer.forward = lambda *args, **kwargs: (calls.append(1), own(*args, **kwargs))[1]
    try:
        with pytest.raises(ZeroDivisionError), torch.no_grad(), skipping(llama.model, {1: lambda h: h}):
            llama.model(**inputs)
            _ = 1 / 0
        assert not calls
        with torch.no_grad():
            torch.testing.assert_close(llama.model(**inputs).logits, plain, rtol=0, atol=0)
        assert calls == [1]
    finally:
        del layer.forward


def test_module_paths_and_consumed_patterns_are_refused(llama: bertology.LoadedModel) -> None:
    with pytest.raises(BertologyError, match=r"the path of one of the model's modules, not 'model\.nowhere'"):
        bertology.trace(llama.model, _inputs(llama), sites=[("module", "model.nowhere")])
    with (
        pytest.raises(BertologyError, match="cannot be consumed"),
        recording(llama.model, ["pattern"], consume=print),
    ):
        pass


def _gradients_at(
    loaded: bertology.LoadedModel, inputs: dict, direction: torch.Tensor, names: list[str]
) -> dict[tuple[str, int], torch.Tensor]:
    """The gradient of the last position's logits along ``direction`` at sites ``names`` of every layer,
    each site replaced by a clone of itself."""
    kept: dict[tuple[str, int], torch.Tensor] = {}

    def keep(name: str) -> Callable[[torch.Tensor, int | None], torch.Tensor]:
        def clone(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
            assert layer is not None
            kept[name, layer] = tensor.clone()
            return kept[name, layer]

        return clone

    with torch.enable_grad(), replacing(loaded.model, {name: keep(name) for name in names}):
        metric = loaded.model(**inputs).logits[:, -1] @ direction
        found = torch.autograd.grad(metric.sum(), list(kept.values()))
    return {key: gradient.detach() for key, gradient in zip(kept, found, strict=True)}


def _projection_gradients(
    loaded: bertology.LoadedModel, inputs: dict, direction: torch.Tensor
) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's query, key and value projection's output (the linear layer's) and the gradient there of
    the last position's logits along ``direction``, by letter and layer (GPT-2's one projection under
    each letter)."""
    outputs: dict[tuple[str, int], torch.Tensor] = {}

    def keep(letter: str, layer: int) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _args: tuple, _kwargs: dict, output: torch.Tensor) -> None:
            outputs[letter, layer] = output

        return hook

    hooks = [
        (projection.linear, keep(letter, layer))
        for layer, parts in enumerate(attention_parts(loaded.model))
        for letter, projection in zip("qkv", (parts.query, parts.key, parts.value), strict=True)
    ]
    with torch.enable_grad(), hooking(after=hooks):
        metric = loaded.model(**inputs).logits[:, -1] @ direction
        found = torch.autograd.grad(metric.sum(), list(outputs.values()))
    return {key: (outputs[key].detach(), gradient) for key, gradient in zip(outputs, found, strict=True)}


# llama: an RMSNorm, by the formula's route; qwen2: the same with the projections' biases; gpt2: a
# LayerNorm, by torch.func's, its three projections one layer
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gpt2"])
def test_head_input_gradients_equal_back_propagation_through_the_per_head_copies(
    tiny_model_dirs: dict[str, Path], model_type: str
) -> None:
    """The gradient at each head's query, key and value input copy, from the gradient at the projection's
    output: as autograd finds it through the copies that ``replacing`` makes; over two passes (two
    directions of the logits), the mean of the two."""
    loaded = tiny_language_model(tiny_model_dirs[model_type])
    inputs = _inputs(loaded)
    torch.manual_seed(0)
    with torch.no_grad():  # biases that matter (qwen2's projections start with zero biases)
        for module in loaded.model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_()
    directions = torch.randn(2, loaded.model.config.vocab_size)
    through_copies = [_gradients_at(loaded, inputs, d, ["q_input", "k_input", "v_input"]) for d in directions]
    at_outputs = [_projection_gradients(loaded, inputs, d) for d in directions]
    streams = bertology.trace(loaded.model, inputs, sites=["resid_pre"])
    new_sum = head_input_gradients(loaded.model)
    for layer in range(len(layer_modules(loaded.model))):
        for letter in "qkv":
            expected = [found[f"{letter}_input", layer] for found in through_copies]
            largest = max(float(one.abs().max()) for one in expected)
            assert largest > 1e-4, (layer, letter)
            for passes in (1, 2):
                summed = new_sum(layer, f"{letter}_input")
                for found in at_outputs[:passes]:
                    summed.add(streams["resid_pre", layer], *found[letter, layer])
                batch, pos, heads, width = expected[0].shape
                written, some = torch.empty(heads, batch * pos, width), torch.empty(heads, 2, width)
                summed.write(written)
                summed.write(some, slice(pos - 1, pos + 1))  # positions of two rows
                mean = sum(expected[:passes]) / passes
                # float32 sums in another order (the copies' pass folds an RMSNorm's weight into the
                # projection and scales after it): within 3e-5 of the largest gradient
                found = written.view(heads, batch, pos, width).permute(1, 2, 0, 3)
                torch.testing.assert_close(found, mean, rtol=0, atol=3e-5 * largest)
                torch.testing.assert_close(some, written[:, pos - 1 : pos + 1], rtol=0, atol=1e-6 * largest)
            # the projection's output in a lower precision (a bfloat16 model's): its rows computed again
            low = new_sum(layer, f"{letter}_input")
            output, gradient = at_outputs[0][letter, layer]
            low.add(streams["resid_pre", layer], output.bfloat16(), gradient)
            found = torch.empty(heads, batch * pos, width)
            low.write(found)
            expected_one = expected[0].permute(2, 0, 1, 3).flatten(1, 2)
            torch.testing.assert_close(found, expected_one, rtol=0, atol=3e-5 * largest)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_the_shared_head_input_is_every_heads_copy_changed_alike(
    tiny_model_dirs: dict[str, Path], model_type: str
) -> None:
    """Replacing ``qkv_input`` (the norm's input before attention, read by every head's queries, keys and
    values) by ``x + delta`` gives the logits of giving each head's own query, key and value copy
    ``x + delta``, which are recomputed head by head through the norm; the residual stream keeps ``x``."""
    loaded = tiny_language_model(tiny_model_dirs[model_type])
    inputs = _inputs(loaded)
    delta = torch.randn(int(loaded.model.config.hidden_size), generator=torch.Generator().manual_seed(0))

    def moved(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        return tensor + delta

    with torch.no_grad():
        plain = loaded.model(**inputs).logits
        with replacing(loaded.model, {("qkv_input", 1): moved}):
            shared = loaded.model(**inputs).logits
        with replacing(loaded.model, {(f"{letter}_input", 1): moved for letter in "qkv"}):
            per_head = loaded.model(**inputs).logits
        with replacing(loaded.model, {("resid_pre", 1): moved}):
            whole_stream = loaded.model(**inputs).logits
    assert (shared - plain).abs().max() > 1e-2
    assert (shared - whole_stream).abs().max() > 1e-2
    torch.testing.assert_close(shared, per_head, rtol=0, atol=1e-5)


def test_the_shared_head_input_of_a_post_norm_layer_is_refused(tiny_model_dirs: dict[str, Path]) -> None:
    loaded = bertology.load_model(str(tiny_model_dirs["bert"]))
    with (
        pytest.raises(BertologyError, match=r"qkv_input.*pre-norm"),
        replacing(loaded.model, {"qkv_input": lambda t, _l: t}),
    ):
        loaded.model(**_inputs(loaded))
