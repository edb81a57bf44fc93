"""Patching and attribution patching at every patchable site and granularity, each checked against a
reference written here: one plain forward pass per patch with torch forward hooks on the Hugging Face
modules (named here, not through :mod:`bertology.models`), and gradients taken here, on the tiny Llama,
GPT-2 and BERT classifier, in both directions; and exact and attribution patching of the tiny BART's and
T5's stacked sites (the source swapped, the target prefix shared), whose decoder reads the target prefix
built here.

Tolerances: exact patching and the reference run the same float32 forward passes, batched differently
(several patches per pass, the layers below the patched one computed once, a decoder's shared prefix
cached): on the tiny models (hidden width 32 to 64, logits of order 1 to 10; the tiny T5's of order 100)
that reorders sums by some 1e-6 per logit (1e-7 of it), so 1e-5, or 1e-6 relative. Attribution compares
two autograd graphs of the same function (the patching code's and the reference's, which cuts the graph
at the site): the estimated change of the logit difference (the estimate less the target run's), which
is as small as 1e-5 (the tiny BART's last encoder layer) and agrees to some 2e-7, atol 1e-6 and rtol 1e-4.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.patching_reference import tiny_models_by_type
from transformers.utils import ModelOutput

from bertology import BertologyError
from bertology.interventions.circuit import circuit
from bertology.interventions.patch_grid import GRIDS, HEAD_SITES, PATCH_SITES
from bertology.interventions.patching import PatchingStudy, patch
from bertology.interventions.patching_pairs import PatchPair
from bertology.interventions.path_patching import path_patch, path_patch_each
from bertology.models.loading import LoadedModel

#: One word swapped: the clean and the corrupted text share their first three tokens (a decoder's cached
#: prefix) and differ at the fourth.
CLEAN, CORRUPTED = "The quick brown fox jumps over the lazy", "The quick brown dog jumps over the lazy"
PAIRS = {
    "llama": PatchPair(CLEAN, CORRUPTED, " the", " dog", None, None, 1),
    "gpt2": PatchPair(CLEAN, CORRUPTED, " the", " next", None, None, 1),  # one token each in its vocabulary
    "bert": PatchPair(CLEAN, CORRUPTED, None, None, "pos", "neg", 1),
    # the sources differ at their fourth token and have 9 tokens each, the prefix "it is" 4 with the
    # decoder start token; " the" and " in" are one token each in its vocabulary
    "bart": PatchPair("the cat sat", "the cot sat", " the", " in", None, None, 1, "it is"),
    # " in" and "to" are one token each in the tiny T5's vocabulary (the reference reads one answer token)
    "t5": PatchPair("the cot sat", "the dog sat", " in", "to", None, None, 1, "it is"),
}


@pytest.fixture(scope="module")
def models(tiny_model_dirs: dict[str, Path]) -> Callable[[str], LoadedModel]:
    return tiny_models_by_type(tiny_model_dirs)


# --- The reference: each site of a layer found by its Hugging Face module -------------------------------


@dataclass
class Slot:
    """A site inside one module call: the module's first input (``pre``) or its output's first tensor,
    features ``offset..offset + width`` of its last axis (GPT-2's fused query, key and value)."""

    module: torch.nn.Module
    pre: bool
    offset: int = 0
    width: int | None = None


def _layer(model: Any, model_type: str, layer: int) -> torch.nn.Module:
    return {
        "llama": lambda: model.model.layers[layer],
        "gpt2": lambda: model.transformer.h[layer],
        "bert": lambda: model.bert.encoder.layer[layer],
    }[model_type]()


#: The sites without layers: the token embeddings, the last hidden states (after Llama's and GPT-2's final
#: norm; BERT's encoder's output, which its pooler reads) and the model's logits.
LAYERLESS = {
    "llama": {"embed": "model.embed_tokens", "final": "model.norm", "logits": ""},
    "gpt2": {"embed": "transformer.wte", "final": "transformer.ln_f", "logits": ""},
    "bert": {"embed": "bert.embeddings.word_embeddings", "final": "bert.encoder", "logits": ""},
}


def _stack_slot(loaded: LoadedModel, site: str, layer: int) -> Slot:
    """Where the tiny BART's or T5's ``site`` (``stack:name``) of ``layer`` is: a layer's input or output,
    a projection's output (queries, keys, values) or the output projection's input (``z``) of the stack's
    attention (cross-attention: BART's decoder layer's ``encoder_attn``, T5's block's second sublayer's
    ``EncDecAttention``)."""
    stack, _, name = site.partition(":")
    t5 = loaded.model.config.model_type == "t5"
    model = loaded.model if t5 else loaded.model.model
    stacked = model.encoder if stack == "encoder" else model.decoder
    block = stacked.block[layer] if t5 else stacked.layers[layer]
    if name in ("resid_pre", "resid_post"):
        return Slot(block, name == "resid_pre")
    if t5:
        attention = block.layer[1].EncDecAttention if stack == "cross" else block.layer[0].SelfAttention
        parts = {"q": attention.q, "k": attention.k, "v": attention.v, "o": attention.o}
    else:
        attention = block.encoder_attn if stack == "cross" else block.self_attn
        parts = {"q": attention.q_proj, "k": attention.k_proj, "v": attention.v_proj, "o": attention.out_proj}
    if name == "z":
        return Slot(parts["o"], True)
    return Slot({**parts, "attn_out": attention}[name], False)


def _slot(loaded: LoadedModel, site: str, layer: int) -> Slot:
    """Where ``site`` of ``layer`` is, for the sites a module call holds whole (``layer`` unused for the
    sites without layers)."""
    if ":" in site:
        return _stack_slot(loaded, site, layer)
    model_type = loaded.model.config.model_type
    if site in LAYERLESS[model_type]:
        return Slot(loaded.model.get_submodule(LAYERLESS[model_type][site]), False)
    block = _layer(loaded.model, model_type, layer)
    hidden = loaded.model.config.hidden_size
    if site == "resid_pre":
        return Slot(block, True)
    if site == "resid_post":
        return Slot(block, False)
    if model_type == "llama":
        attention = block.self_attn
        modules = {"q": attention.q_proj, "k": attention.k_proj, "v": attention.v_proj}
        modules |= {"attn_out": attention, "mlp_out": block.mlp}
        return Slot(attention.o_proj, True) if site == "z" else Slot(modules[site], False)
    if model_type == "gpt2":
        if site in ("q", "k", "v"):
            return Slot(block.attn.c_attn, False, "qkv".index(site) * hidden, hidden)
        modules = {"attn_out": block.attn, "mlp_out": block.mlp}
        return Slot(block.attn.c_proj, True) if site == "z" else Slot(modules[site], False)
    attention = block.attention
    modules = {"q": attention.self.query, "k": attention.self.key, "v": attention.self.value}
    # post-norm: what attention adds is the output projection's result (before the add and norm), the
    # stream between the blocks the attention block's normalised output
    modules |= {"attn_out": attention.output.dense, "mlp_out": block.output.dense, "resid_mid": attention}
    return Slot(attention.output.dense, True) if site == "z" else Slot(modules[site], False)


def _first(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else value[0]


def _with_first(value: Any, tensor: torch.Tensor) -> Any:
    if isinstance(value, ModelOutput):  # a model's or an encoder's output: its first field
        value[next(iter(value.keys()))] = tensor
        return value
    return tensor if isinstance(value, torch.Tensor) else (tensor, *value[1:])


@contextmanager
def site_replaced(
    loaded: LoadedModel, site: str, layer: int, fn: Callable[[torch.Tensor], torch.Tensor]
) -> Iterator[None]:
    """Inside the block, ``site`` of ``layer`` ([batch, tokens, features]) becomes ``fn(site)`` in every
    forward pass, through plain forward hooks written here."""
    model_type = loaded.model.config.model_type
    with ExitStack() as stack:
        if site == "resid_mid" and model_type in ("llama", "gpt2"):
            # pre-norm: the stream between the blocks is the layer's input plus what attention adds
            block = _layer(loaded.model, model_type, layer)
            attention = block.self_attn if model_type == "llama" else block.attn
            entered: list[torch.Tensor] = []

            def enter(_: Any, args: tuple, kwargs: dict) -> None:
                entered[:] = [args[0] if args else kwargs["hidden_states"]]

            def mid(_: Any, _args: tuple, output: Any) -> Any:
                return _with_first(output, fn(entered[0] + _first(output)) - entered[0])

            stack.callback(block.register_forward_pre_hook(enter, with_kwargs=True).remove)
            stack.callback(attention.register_forward_hook(mid).remove)
            yield
            return
        slot = _slot(loaded, site, layer)

        def replaced(whole: torch.Tensor) -> torch.Tensor:
            if whole.dim() == 2:  # a classifier's logits [batch, labels]: one position
                return replaced(whole[:, None])[:, 0]
            end = whole.shape[-1] if slot.width is None else slot.offset + slot.width
            new = fn(whole[..., slot.offset : end])
            return torch.cat([whole[..., : slot.offset], new, whole[..., end:]], -1)

        if slot.pre:

            def before(_: Any, args: tuple, kwargs: dict) -> Any:
                if args:
                    return (replaced(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": replaced(kwargs["hidden_states"])}

            stack.callback(slot.module.register_forward_pre_hook(before, with_kwargs=True).remove)
        else:

            def after(_: Any, _args: tuple, output: Any) -> Any:
                return _with_first(output, replaced(_first(output)))

            stack.callback(slot.module.register_forward_hook(after).remove)
        yield


def score(loaded: LoadedModel, pair: PatchPair, text: str) -> torch.Tensor:
    """The logit difference of ``text`` by a plain forward pass: the answer's and the wrong token's logits
    at the last token (an encoder-decoder's: ``text`` the source, the decoder's input its start token and
    the pair's target), or the two labels'."""
    encoded = loaded.tokenizer([text], return_tensors="pt")
    if loaded.kind == "encoder-decoder":
        prefix = loaded.tokenizer(pair.target, add_special_tokens=False)["input_ids"]
        encoded["decoder_input_ids"] = torch.tensor([[loaded.model.config.decoder_start_token_id, *prefix]])
    logits = loaded.model(**encoded).logits[0]
    if loaded.kind != "encoder":
        ids = [
            loaded.tokenizer(word, add_special_tokens=False)["input_ids"][0]
            for word in (pair.answer, pair.wrong)
        ]
        return logits[-1, ids[0]] - logits[-1, ids[1]]
    label2id = loaded.model.config.label2id
    return logits[label2id[pair.label]] - logits[label2id[pair.wrong_label]]


def recorded(loaded: LoadedModel, pair: PatchPair, site: str, layer: int, text: str) -> torch.Tensor:
    """[tokens, features] ``site`` of ``layer`` in the pass of ``text``."""
    kept: list[torch.Tensor] = []
    with torch.no_grad(), site_replaced(loaded, site, layer, lambda x: kept.append(x.clone()) or x):
        score(loaded, pair, text)
    return kept[0][0]


def cell_mask(cell: dict[str, int], tokens: int, features: int, head_dim: int) -> torch.Tensor:
    """[tokens, features] bool: what the patch of ``cell`` (its axes) replaces."""
    mask = torch.ones(tokens, features, dtype=torch.bool)
    if "position" in cell:
        mask &= (torch.arange(tokens) == cell["position"])[:, None]
    if "head" in cell:
        mask &= (torch.arange(features) // head_dim == cell["head"])[None]
    return mask


def cells(grid: tuple[int, ...], axes: tuple[str, ...], swapped: int) -> list[dict[str, int]]:
    """The cells checked (the grid's ``axes`` of each): the first and the last layer and head, and the
    positions 0 (in a decoder's cached shared prefix; an encoder's class token), ``swapped`` (the token
    that differs) and the last, each layer with two of them."""
    sizes = dict(zip(axes, grid, strict=True))
    last = {axis: size - 1 for axis, size in sizes.items()}
    chosen = [
        {"layer": 0, "head": 0, "position": swapped},
        {"layer": 0, "head": last.get("head", 0), "position": 0},
        {"layer": last["layer"], "head": last.get("head", 0), "position": last.get("position", 0)},
        {"layer": last["layer"], "head": 0, "position": swapped},
    ]
    unique = {tuple((axis, cell[axis]) for axis in axes) for cell in chosen}
    return [dict(cell) for cell in sorted(unique)]


def site_gradient(loaded: LoadedModel, pair: PatchPair, site: str, layer: int, text: str) -> torch.Tensor:
    """[1, tokens, features] the gradient of the logit difference at ``site`` of ``layer`` in the pass of
    ``text``, the graph cut at the site."""
    leaf: list[torch.Tensor] = []
    with (
        torch.enable_grad(),
        site_replaced(
            loaded, site, layer, lambda x: leaf.append(x.detach().requires_grad_(True)) or leaf[-1]
        ),
    ):
        (gradient,) = torch.autograd.grad(score(loaded, pair, text), leaf[0])
    return gradient


def check_site(loaded: LoadedModel, pair: PatchPair, site: str, granularity: str, denoising: bool) -> bool:
    """Exact and attribution patching of ``site`` by ``granularity`` equal the references at :func:`cells`;
    whether some checked patch changes the logit difference, by 10x the tolerance."""
    study: PatchingStudy = patch(
        loaded,
        [pair],
        direction="denoising" if denoising else "noising",
        site=site,
        granularity=granularity,
        method="both",
    )
    assert study.exact is not None and study.attribution is not None
    source, target = (pair.clean, pair.corrupted) if denoising else (pair.corrupted, pair.clean)
    axes = GRIDS[granularity].axes
    head_dim = loaded.model.config.hidden_size // loaded.num_heads
    grid = study.exact.ld_patched.shape[:-1]
    # a site over an encoder-decoder's target prefix: the same tokens in both runs
    swapped = next((i for i, (a, b) in enumerate(zip(*study.tokens[0], strict=True)) if a != b), 1)
    with torch.no_grad():
        ld_target = float(score(loaded, pair, target))
    assert study.exact.ld_target[0] == pytest.approx(ld_target, abs=1e-5, rel=1e-6)
    moved = False
    checked = cells(grid, axes, swapped)
    for layer in sorted({cell["layer"] for cell in checked}):
        wanted = recorded(loaded, pair, site, layer, source)
        present = recorded(loaded, pair, site, layer, target)
        gradient = site_gradient(loaded, pair, site, layer, target)
        for cell in (cell for cell in checked if cell["layer"] == layer):
            mask = cell_mask(cell, *wanted.shape, head_dim)
            with (
                torch.no_grad(),
                site_replaced(
                    loaded, site, layer, lambda x, mask=mask, wanted=wanted: torch.where(mask, wanted, x)
                ),
            ):
                expected = float(score(loaded, pair, target))
            index = tuple(cell[axis] for axis in axes)
            found = study.exact.ld_patched[(*index, 0)]
            assert found == pytest.approx(expected, abs=1e-5, rel=1e-6), (site, granularity, cell)
            moved |= abs(expected - ld_target) > 1e-4
            # the estimated change of LD (the estimate less the target run's LD it was added to)
            change = float(((wanted - present) * gradient[0])[mask].sum())
            found = study.attribution.ld_patched[(*index, 0)] - study.attribution.ld_target[0]
            assert found == pytest.approx(change, abs=1e-6, rel=1e-4), (site, granularity, cell)
    return moved


#: Every site with each granularity it has an axis for (but a classifier's logits: no position axis).
SITE_GRIDS = [
    (site, granularity)
    for site in PATCH_SITES
    for granularity in GRIDS
    if site in HEAD_SITES or not GRIDS[granularity].per_head
]


def site_grids(model_type: str) -> list[tuple[str, str]]:
    """:data:`SITE_GRIDS` that ``model_type``'s tiny model has."""
    return [
        (site, granularity)
        for site, granularity in SITE_GRIDS
        if not (model_type == "bert" and site == "logits" and GRIDS[granularity].per_position)
    ]


#: The distinct ways a site is found and replaced, one each: a projection's output by head (Llama's
#: separate query; GPT-2's fused value, an offset into the fused output; BERT's value), an output projection's
#: input at one position, a module's whole output and a layer's input and output, and the stream between
#: the blocks (a pre-norm decoder's sum, a post-norm encoder's module output).
DISTINCT = {
    "llama": [("q", "head-position"), ("mlp_out", "layer"), ("resid_mid", "position")],
    "gpt2": [("v", "head"), ("z", "head-position"), ("resid_post", "position")],
    "bert": [("v", "head"), ("attn_out", "position"), ("resid_mid", "layer")],
}


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_distinct_sites_equal_a_hooked_pass_per_patch(
    model_type: str, direction: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    for site, granularity in DISTINCT[model_type]:
        assert check_site(loaded, PAIRS[model_type], site, granularity, direction == "denoising"), site


#: The tiny BART's and T5's stacks, one site each found and replaced differently: the encoder's head
#: outputs by head (its output projection's input), the decoder's layer input by (target) position
#: (attribution's gradient leaf at layer 0), cross-attention's head outputs by head and (target) position
#: and its values by (source) position.
STACKED = [
    ("encoder:z", "head"),
    ("decoder:resid_pre", "position"),
    ("cross:z", "head-position"),
    ("cross:v", "position"),
]


@pytest.mark.parametrize("model_type", ["bart", "t5"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_an_encoder_decoders_stacked_sites_equal_a_hooked_pass_per_patch(
    model_type: str, direction: str, models: Callable[[str], LoadedModel]
) -> None:
    """Exact patching and attribution's estimate at each of :data:`STACKED` (the gradient taken here by
    autograd at the hooked Hugging Face module)."""
    loaded = models(model_type)
    for site, granularity in STACKED:
        assert check_site(loaded, PAIRS[model_type], site, granularity, direction == "denoising"), site


def continued_ld(loaded: LoadedModel, pair: PatchPair, source: str) -> torch.Tensor:
    """The tiny BART's logit difference of answers of several tokens by plain passes: per answer, the
    decoder reads the start token, the pair's target and the answer but its last token, and the answer's
    log-probability is summed over its tokens; the answer's minus the wrong answer's."""
    encoded = loaded.tokenizer([source], return_tensors="pt")
    prefix = [loaded.model.config.decoder_start_token_id]
    prefix += loaded.tokenizer(pair.target, add_special_tokens=False)["input_ids"]
    scores = []
    for word in (pair.answer, pair.wrong):
        tokens = loaded.tokenizer(word, add_special_tokens=False)["input_ids"]
        decoder = torch.tensor([prefix + tokens[:-1]])
        logits = loaded.model(**encoded, decoder_input_ids=decoder).logits[0, -len(tokens) :]
        scores.append(torch.log_softmax(logits, -1)[torch.arange(len(tokens)), tokens].sum())
    return scores[0] - scores[1]


@pytest.mark.parametrize("site", ["encoder:z", "decoder:z"])
def test_an_encoder_decoders_answers_of_several_tokens_are_patched_at_the_texts_positions(
    site: str, models: Callable[[str], LoadedModel]
) -> None:
    """ " a" is two tokens, " in" one: each is read after the target prefix under teacher forcing, and a
    decoder head's patch covers the prefix's 4 positions only, never the answer's (the encoder's: the
    source's 9). Each head of the last layer, denoising, against plain passes hooked here; attribution's
    estimate against the gradient of those passes' logit difference at the site (both answers' passes)."""
    loaded = models("bart")
    pair = PatchPair("the cat sat", "the cot sat", " a", " in", None, None, 1, "it is")
    study = patch(loaded, [pair], site=site, granularity="head", method="both")
    assert study.exact is not None and study.attribution is not None
    with torch.no_grad():
        assert study.exact.ld_clean[0] == pytest.approx(
            float(continued_ld(loaded, pair, pair.clean)), abs=1e-5
        )
        assert study.exact.ld_corrupted[0] == pytest.approx(
            float(continued_ld(loaded, pair, pair.corrupted)), abs=1e-5
        )
    layer = study.exact.ld_patched.shape[0] - 1
    texts = 9 if site == "encoder:z" else 4
    kept: list[torch.Tensor] = []
    with torch.no_grad(), site_replaced(loaded, site, layer, lambda x: kept.append(x.clone()) or x):
        continued_ld(loaded, pair, pair.clean)
    wanted = kept[0][:, :texts]  # the texts' positions of the clean pass (the same in both answers' passes)
    leaves: list[torch.Tensor] = []
    with (
        torch.enable_grad(),
        site_replaced(
            loaded, site, layer, lambda x: leaves.append(x.detach().requires_grad_(True)) or leaves[-1]
        ),
    ):
        gradients = torch.autograd.grad(continued_ld(loaded, pair, pair.corrupted), leaves)
    moved = False
    for head in range(loaded.num_heads):
        mask = cell_mask({"head": head}, texts, wanted.shape[-1], 8)

        def swap(x: torch.Tensor, mask: torch.Tensor = mask) -> torch.Tensor:
            return torch.cat([torch.where(mask, wanted, x[:, :texts]), x[:, texts:]], 1)

        with torch.no_grad(), site_replaced(loaded, site, layer, swap):
            expected = float(continued_ld(loaded, pair, pair.corrupted))
        assert study.exact.ld_patched[layer, head, 0] == pytest.approx(expected, abs=1e-5), head
        moved |= abs(expected - study.exact.ld_corrupted[0]) > 1e-4
        change = sum(
            float(((wanted - leaf[:, :texts].detach()) * gradient[:, :texts])[0][mask].sum())
            for leaf, gradient in zip(leaves, gradients, strict=True)
        )
        found = study.attribution.ld_patched[layer, head, 0] - study.attribution.ld_corrupted[0]
        assert found == pytest.approx(change, abs=1e-6, rel=1e-4), head
    assert moved


#: The tiny Llama's grouped-query sites: keys and values by key/value head (2), queries and head outputs by
#: query head (4), each by head and by head and position.
GROUPED_QUERY = [("k", "head"), ("v", "head-position"), ("q", "head-position"), ("z", "head")]


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_grouped_query_keys_and_values_are_patched_per_key_value_head(
    direction: str, models: Callable[[str], LoadedModel]
) -> None:
    """The tiny Llama shares 2 key/value heads among 4 query heads: a ``k`` or ``v`` patch replaces one
    key/value head's 8 rows of k_proj's or v_proj's output (every query head that reads it), equal to the
    reference's hooked pass; ``q`` and ``z`` have the 4 query heads."""
    loaded = models("llama")
    config = loaded.model.config
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    for site, granularity in GROUPED_QUERY:
        assert check_site(loaded, PAIRS["llama"], site, granularity, direction == "denoising"), site
        study = patch(loaded, [PAIRS["llama"]], site=site, granularity="head", direction=direction)
        assert study.exact is not None and study.exact.ld_patched.shape == (2, 2 if site in "kv" else 4, 1)


#: The sites without layers, by whole site and by position, each once per model (a classifier's logits, one
#: row of labels per text, have no position axis).
LAYERLESS_GRIDS = {
    "llama": [("embed", "position"), ("final", "layer"), ("logits", "position")],
    "gpt2": [("embed", "layer"), ("final", "position"), ("logits", "position")],
    "bert": [("embed", "position"), ("final", "position"), ("logits", "layer")],
}


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_the_sites_without_layers_equal_a_hooked_pass_per_patch(
    model_type: str, direction: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    for site, granularity in LAYERLESS_GRIDS[model_type]:
        assert check_site(loaded, PAIRS[model_type], site, granularity, direction == "denoising"), site


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_patching_the_logits_the_metric_reads_restores_the_whole_answer(
    model_type: str, models: Callable[[str], LoadedModel]
) -> None:
    """The source's logits where the metric reads them (a decoder's last position, a classifier's only row)
    give the source's logit difference: effect 1 denoising, -1 noising; a decoder's logits at every other
    position are never read: the target's. Up to float32 batching (module docstring), 1e-5 on the logit
    difference."""
    loaded = models(model_type)
    granularity = "layer" if model_type == "bert" else "position"
    for direction, whole in (("denoising", 1.0), ("noising", -1.0)):
        study = patch(
            loaded,
            [PAIRS[model_type]],
            site="logits",
            granularity=granularity,
            direction=direction,
            method="both",
        )
        for result in study.results:
            ld = result.ld_patched.reshape(-1)  # one row: the site has no layers
            expected = np.full_like(ld, result.ld_target[0])
            expected[-1] = (result.ld_clean if direction == "denoising" else result.ld_corrupted)[0]
            np.testing.assert_allclose(ld, expected, atol=1e-5, err_msg=f"{result.method} {direction}")
            assert result.effect.reshape(-1)[-1] == pytest.approx(whole, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_every_site_and_granularity_equals_a_hooked_pass_per_patch(
    model_type: str, direction: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    moved = [
        check_site(loaded, PAIRS[model_type], site, granularity, direction == "denoising")
        for site, granularity in site_grids(model_type)
    ]
    # most sites' patches change the logit difference (not all: the tiny GPT-2's queries and keys barely
    # move its near-uniform attention, 16 of its 26 move)
    assert sum(moved) >= len(moved) // 2


def test_the_default_site_and_granularity_are_each_heads_output(models: Callable[[str], LoadedModel]) -> None:
    """``patch`` without a site or granularity gives z by head, today's numbers."""
    loaded = models("llama")
    default = patch(loaded, [PAIRS["llama"]])
    explicit = patch(loaded, [PAIRS["llama"]], site="z", granularity="head")
    assert default.exact is not None and explicit.exact is not None
    assert (default.exact.site, default.exact.granularity) == ("z", "head")
    np.testing.assert_array_equal(default.exact.ld_patched, explicit.exact.ld_patched)
    # the report's attention panels: the first pair's weights, as the model returns them (the same pass: 1e-6)
    for run, text in (("clean", CLEAN), ("corrupted", CORRUPTED)):
        with torch.no_grad():
            returned = loaded.model(**loaded.tokenizer([text], return_tensors="pt"), output_attentions=True)
        expected = torch.cat(returned.attentions).numpy()
        np.testing.assert_allclose(default.attention[run], expected, atol=1e-6)


@pytest.mark.parametrize(
    ("site", "granularity", "message"),
    [
        ("mlp", "layer", "There is no site 'mlp' to patch; the sites are embed, resid_pre, q, k, v, z"),
        ("mlp_out", "head", "The site 'mlp_out' has no head axis, so it cannot be patched by 'head'"),
        ("resid_pre", "head-position", "The site 'resid_pre' has no head axis"),
        ("final", "head", "The site 'final' has no head axis"),
        ("pattern", "head", "The 'pattern' site can be recorded but not patched"),
        ("z", "neuron", "Unknown patching granularity 'neuron'; choose one of head, head-position, layer"),
    ],
)
def test_a_site_or_granularity_that_does_not_fit_is_refused_in_one_sentence(
    site: str, granularity: str, message: str, models: Callable[[str], LoadedModel]
) -> None:
    with pytest.raises(BertologyError, match=message):
        patch(models("llama"), [PAIRS["llama"]], site=site, granularity=granularity)  # type: ignore[arg-type]


def test_a_classifiers_logits_by_position_are_refused_in_one_sentence(
    models: Callable[[str], LoadedModel],
) -> None:
    with pytest.raises(BertologyError, match="A classifier's logits have no position axis"):
        patch(models("bert"), [PAIRS["bert"]], site="logits", granularity="position")


def test_answers_for_a_model_without_a_language_model_head_are_refused(
    models: Callable[[str], LoadedModel],
) -> None:
    with pytest.raises(
        BertologyError, match=r"only a language model \(a decoder or an encoder-decoder\) predicts"
    ):
        patch(models("bert"), [PAIRS["llama"]], site="mlp_out", granularity="layer")


def test_a_t5s_encoder_output_patched_whole_restores_the_clean_run_and_its_decoder_input_nothing(
    models: Callable[[str], LoadedModel],
) -> None:
    """Known answers on the tiny T5 (relative position biases, a final encoder norm): the clean source's
    residual stream after any encoder layer, at every position, makes the rest of the run the clean one (LD
    the clean run's: effect 1), and the decoder's first layer input, the same target prefix in both runs,
    changes nothing (LD the corrupted run's)."""
    loaded = models("t5")
    pair = PatchPair("the cot sat", "the dog sat", " in", "a", None, None, 1, "it is")
    encoder = patch(loaded, [pair], site="encoder:resid_post", granularity="layer").exact
    decoder = patch(loaded, [pair], site="decoder:resid_pre", granularity="layer").exact
    assert encoder is not None and decoder is not None
    assert abs(encoder.ld_clean[0] - encoder.ld_corrupted[0]) > 1e-2
    np.testing.assert_allclose(encoder.ld_patched[:, 0], encoder.ld_clean[0], atol=1e-5)
    np.testing.assert_allclose(decoder.ld_patched[0], decoder.ld_corrupted, atol=1e-5)


def test_path_patching_and_circuits_refuse_an_encoder_decoder_in_one_sentence(
    models: Callable[[str], LoadedModel],
) -> None:
    bart = models("bart")
    message = "works on encoder and decoder models; .* is an encoder-decoder BART model[.]$"
    with pytest.raises(BertologyError, match="^Path patching " + message):
        path_patch(bart, [PAIRS["bart"]], [(0, 0)], [(1, 0, "q")])
    with pytest.raises(BertologyError, match="^Path patching " + message):
        path_patch_each(bart, [PAIRS["bart"]], [(1, 0, "q")])
    with pytest.raises(BertologyError, match="^Circuit discovery " + message):
        circuit(bart, [PAIRS["bart"]])


#: The tiny BART's pairs, the llama's with a target prefix, a classifier's on the BART.
WITH_TARGET = PatchPair(CLEAN, CORRUPTED, " the", " dog", None, None, 1, "it is")
UNLABELLED = PatchPair("the cat sat", "the cot sat", None, None, None, None, 1)


@pytest.mark.parametrize(
    ("model_type", "pair", "options", "message"),
    [
        (
            "llama",
            WITH_TARGET,
            {},
            "Line 1 gives a 'target', the target prefix of an encoder-decoder's pairs",
        ),
        ("bart", UNLABELLED, {"site": "encoder:z"}, "is an encoder-decoder: give 'answer' and 'wrong'"),
        (
            "bart",
            PAIRS["bart"],
            {},
            "is an encoder-decoder, whose sites name their stack: give one such as 'encoder:z'",
        ),
        (
            "llama",
            PAIRS["llama"],
            {"site": "decoder:z"},
            "has no encoder and decoder stacks; give the site without",
        ),
        (
            "bart",
            PAIRS["bart"],
            {"site": "cross:pattern"},
            "The 'cross:pattern' site can be recorded but not",
        ),
        (
            "bart",
            PAIRS["bart"],
            {"site": "cross:resid_pre"},
            "There is no site 'cross:resid_pre' to patch; an ",
        ),
        ("bart", PAIRS["bart"], {"site": "decoder:attn_out", "granularity": "head"}, "has no head axis"),
    ],
)
def test_pairs_or_sites_of_the_other_kind_of_model_are_refused_in_one_sentence(
    model_type: str,
    pair: PatchPair,
    options: dict[str, str],
    message: str,
    models: Callable[[str], LoadedModel],
) -> None:
    """A target prefix on a decoder, a classifier's pairs on an encoder-decoder, a site without its stack on
    an encoder-decoder (or with one on a decoder), pattern or a site a stack lacks."""
    with pytest.raises(BertologyError, match=message) as raised:
        patch(models(model_type), [pair], **options)  # type: ignore[arg-type]
    assert str(raised.value).count(". ") == 0, raised.value


# --- Ablation: a patch whose source is a constant -----------------------------------------------------

#: A pair of another token count than :data:`PAIRS`' (a second group of pairs: the mean spans both).
SHORT = {
    "llama": PatchPair("A quick fox jumps over", "A quick dog jumps over", " the", " dog", None, None, 2),
    "gpt2": PatchPair("A quick fox jumps over", "A quick dog jumps over", " the", " next", None, None, 2),
    "bert": PatchPair("A quick fox jumps over", "A quick dog jumps over", None, None, "pos", "neg", 2),
}

#: Per model, (site, granularity, ablation, direction) checked, the few that cover the distinct paths: both
#: ablations on each model, every granularity once (a whole site by position in the decoders, whose
#: shared prefix an ablation does not skip; by layer in the encoder; per head, and per head and position
#: in GPT-2's fused value and BERT's), the mean over two groups of pairs (Llama's heads) and the default
#: direction (``None``: noising, the clean run ablated) but once, a mean written into the corrupted run.
ABLATED = {
    "llama": [("z", "head", "mean", None), ("mlp_out", "position", "zero", None)],
    "gpt2": [("v", "head-position", "zero", None), ("resid_post", "position", "mean", "denoising")],
    "bert": [("v", "head-position", "mean", None), ("attn_out", "layer", "zero", None)],
}


def ablation_pairs(model_type: str, granularity: str) -> list[PatchPair]:
    """Two pairs: with a per-position granularity the pair and its reverse (the same token count), else
    the pair and :data:`SHORT`'s (two token counts)."""
    pair = PAIRS[model_type]
    if GRIDS[granularity].per_position:
        return [
            pair,
            PatchPair(pair.corrupted, pair.clean, pair.answer, pair.wrong, pair.label, pair.wrong_label, 2),
        ]
    return [pair, SHORT[model_type]]


def check_ablation(
    loaded: LoadedModel,
    pairs: list[PatchPair],
    site: str,
    granularity: str,
    ablation: str,
    direction: str | None,
) -> bool:
    """Exact and attribution patching with ``ablation`` equal a hooked pass per patch and pair that writes
    the constant, written here: 0, or the site's activation in each pair's source text recorded here and
    averaged over every position of every one of them; whether some checked patch moves the logit
    difference by 10x the tolerance."""
    study = patch(
        loaded,
        pairs,
        site=site,
        granularity=granularity,
        ablation=ablation,
        direction=direction,  # type: ignore[arg-type]
        method="both",
    )
    assert study.exact is not None and study.attribution is not None
    denoising = direction == "denoising"
    assert study.exact.direction == ("denoising" if denoising else "noising")
    assert study.exact.ablation == ablation
    axes = GRIDS[granularity].axes
    head_dim = loaded.model.config.hidden_size // loaded.num_heads
    grid = study.exact.ld_patched.shape[:-1]
    sources = [pair.clean if denoising else pair.corrupted for pair in pairs]
    moved = False
    for index, pair in enumerate(pairs):
        target = pair.corrupted if denoising else pair.clean
        with torch.no_grad():
            ld_target = float(score(loaded, pair, target))
        swapped = next(i for i, (a, b) in enumerate(zip(*study.tokens[index], strict=True)) if a != b)
        checked = cells(grid, axes, swapped)
        for layer in sorted({cell["layer"] for cell in checked}):
            present = recorded(loaded, pair, site, layer, target)
            if ablation == "zero":
                constant = torch.zeros(present.shape[-1])
            else:
                every = [
                    recorded(loaded, other, site, layer, text)
                    for other, text in zip(pairs, sources, strict=True)
                ]
                constant = torch.cat(every).double().mean(0).float()  # [features]: every position of each
            leaf: list[torch.Tensor] = []
            with (
                torch.enable_grad(),
                site_replaced(
                    loaded,
                    site,
                    layer,
                    lambda x, leaf=leaf: leaf.append(x.detach().requires_grad_(True)) or leaf[-1],
                ),
            ):
                (gradient,) = torch.autograd.grad(score(loaded, pair, target), leaf[0])
            for cell in (cell for cell in checked if cell["layer"] == layer):
                mask = cell_mask(cell, *present.shape, head_dim)
                with (
                    torch.no_grad(),
                    site_replaced(
                        loaded,
                        site,
                        layer,
                        lambda x, mask=mask, constant=constant: torch.where(mask, constant, x),
                    ),
                ):
                    expected = float(score(loaded, pair, target))
                at = (*(cell[axis] for axis in axes), index)
                assert study.exact.ld_patched[at] == pytest.approx(expected, abs=1e-5), (site, cell, index)
                estimate = ld_target + float(((constant - present) * gradient[0])[mask].sum())
                assert study.attribution.ld_patched[at] == pytest.approx(estimate, abs=1e-4, rel=1e-4)
                moved |= abs(expected - ld_target) > 1e-4
    return moved


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_zero_and_mean_ablation_equal_a_hook_that_writes_the_constant(
    model_type: str, models: Callable[[str], LoadedModel]
) -> None:
    loaded = models(model_type)
    for site, granularity, ablation, direction in ABLATED[model_type]:
        pairs = ablation_pairs(model_type, granularity)
        assert check_ablation(loaded, pairs, site, granularity, ablation, direction), (site, ablation)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"ablation": "resample"},
            "Unknown patching ablation 'resample'; choose one of counterfactual, zero, mean.",
        ),
        (
            {"ablation": "mean", "site": "mlp_out", "granularity": "head-position"},
            "The site 'mlp_out' has no head axis, so it cannot be patched by 'head-position'",
        ),
        ({"ablation": "zero", "site": "pattern"}, "The 'pattern' site can be recorded but not patched"),
    ],
)
def test_a_bad_ablation_is_refused_in_one_sentence(
    options: dict[str, str], message: str, models: Callable[[str], LoadedModel]
) -> None:
    with pytest.raises(BertologyError, match=message):
        patch(models("llama"), [PAIRS["llama"]], **options)  # type: ignore[arg-type]
