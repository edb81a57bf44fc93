"""Activation patching and attribution patching at any site of :data:`~bertology.models.sites.SITES`.

Two inputs of the same token count: a clean one, on which the model does the task, and a corrupted one,
on which it does not. The metric is, per pair, the logit difference ``LD`` by default, or the probability
difference or the KL divergence from the clean run's distribution
(:mod:`bertology.interventions.patching_metrics`; below ``LD`` stands for whichever). Patching puts
activations of one run (the source) into the other (the target) and reads ``LD``:

- denoising (the default): clean activations into the corrupted run; noising: corrupted into clean.
- site: which tensor of each layer is patched (:mod:`bertology.models.sites`); by default ``z``, each
  head's output (its slice of the input of the layer's output projection, where
  :mod:`bertology.interventions.gates` acts).
- granularity (:data:`~bertology.interventions.patch_grid.GRIDS`): ``head``, one head of a per-head site
  at every position; ``head-position``, one head at one position; ``layer``, the whole site at every
  position; ``position``, the whole site at one position. Answers of several tokens are run appended to
  the texts: a patch acts at the texts' positions only, never at the answer's. The sites without layers
  (``embed``, ``final``, ``logits``) have one layer row; a classifier's ``logits`` ([batch, labels]) no
  position axis. Patching ``logits`` at the last position (or as a whole) puts the source's metric in
  place: effect 1 (denoising) or -1 (noising), a known answer.

The effect of a patch, ``LD`` averaged over the pairs first (Heimersheim and Nanda 2024):

    denoising: (mean LD_patched - mean LD_corrupted) / (mean LD_clean - mean LD_corrupted)
    noising:   (mean LD_patched - mean LD_clean)     / (mean LD_clean - mean LD_corrupted)

so 1 (denoising) is a patch that restores the whole clean behaviour and -1 (noising) one that removes it.

Ablation is a patch whose source is a constant (as in TransformerLens, where an ablation is a hook that
writes a fixed value): ``ablation="zero"`` writes 0, ``"mean"`` the source run's activation averaged
over every position of every pair's texts (:mod:`bertology.interventions.pair_mean`, the same mean as
``bertology circuit --ablation mean``), in place of the site in the target run, at every site and
granularity; ``"counterfactual"`` (the default) is patching as above. An ablation's default direction is
``noising``: the clean run loses the site's information, and the effect (-1: all of the clean behaviour
lost) is that of removing it. Its exact passes run every position (the constant differs from the target
run's activations in the shared prefix too).

Exact patching runs, for each layer ``l``, the target's layers ``l..L-1`` only (the layers below a patch
are those of the target run, computed once: :mod:`bertology.interventions.partial`), with many patches
side by side in one batch (copy ``k`` of the pairs carries patch ``k``), and in a causal decoder only at
the positions from the first one where a pair's clean and corrupted tokens differ: before it both runs,
and so every patched run, have the same activations, whose keys and values come from one cached pass of
the target run's first positions (:class:`TargetPass`).

An encoder-decoder (BART, T5) is patched at its stacked sites (``encoder:z``, ``decoder:resid_pre``,
``cross:z``, ...: :data:`~bertology.models.sites.STACK_SITES`, but ``pattern``), by either method, on pairs
of a clean and a corrupted *source* with one target prefix both runs' decoder reads, the answers the next
target token(s) after it (:mod:`~bertology.interventions.patching_pairs`); an encoder site's positions are
the source's, the others' the target prefix's (cross-attention's keys and values: the source's). Its
patched passes run the whole model (the two stacks are not one list of layers to start part-way through;
no shared prefix is cached: every patched run has the same target tokens but not the same encoder output)
except at a decoder or cross-attention site, where the encoder's output is the target run's, computed once,
and a pass runs the decoder alone (:class:`TargetPass`).

Attribution patching (Nanda 2023, "Attribution Patching"; Kramar et al. 2024, AtP) estimates every
patch at once from the gradient at the target run: "attribution patching ... uses a first-order Taylor
approximation: (clean_act - corrupted_act) · d metric / d corrupted_act" for denoising, i.e.

    LD_patched ≈ LD_target + (a_source - a_target) · ∂LD/∂a |_(target run)

summed over the patched activation's features (and positions). One forward pass of each input and one
backward pass. With an ablation ``a_source`` is its constant (0 or the mean): the same first-order
estimate of the ablation, as rough as the constant is far from ``a_target``. The gradient is taken at
the site's tensors in a pass whose leaves are layer 0's input (or the embeddings), an encoder-decoder's
of each stack (``encoder:resid_pre`` and ``decoder:resid_pre`` 0), so that no weight's gradient is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.interventions.data import eval_mode
from bertology.interventions.pair_mean import mean_over_texts
from bertology.interventions.partial import (
    LayerInputs,
    Prefix,
    logits_from_layer,
    record_layer_inputs,
    run_prefix,
    tiled,
)
from bertology.interventions.patch_grid import GRIDS, PatchGrid, patch_grid
from bertology.interventions.patching_metrics import Scorer, patching_metric
from bertology.interventions.patching_pairs import (
    EncodedPairs,
    PairGroup,
    PatchPair,
    encode_pairs,
    read_pairs,
)
from bertology.models.anatomy import (
    AttentionParts,
    attention_parts,
    has_stacks,
    layer_modules,
    shares_layers,
    stack_parts,
)
from bertology.models.loading import LoadedModel
from bertology.models.sites import recording, replacing, site_of
from bertology.options import (
    PATCH_ABLATIONS,
    PATCH_DIRECTIONS,
    PATCH_METHODS,
    PatchAblation,
    PatchDirection,
    PatchGranularity,
    PatchMethod,
    PatchMetric,
)
from bertology.progress import Progress


@dataclass(frozen=True)
class Patch:
    """What one patch replaces of its site at ``layer``: ``heads`` [heads] bool (the site's heads) and
    ``positions`` [tokens] bool (those heads at those positions; ``[True]``: at every position of inputs of
    any length), or for the whole site ``heads`` ``None``."""

    layer: int
    heads: torch.Tensor | None
    positions: torch.Tensor

    def at(self, tokens: int) -> torch.Tensor:
        """[tokens] bool: the positions patched in texts of ``tokens`` tokens."""
        return self.positions.expand(tokens)

    def in_group(self, group: PairGroup, site: str = "z") -> torch.Tensor:
        """[rows' positions] bool: the positions of ``site`` patched in ``group``'s input rows (a
        several-token answer's appended positions never; :meth:`PairGroup.span`)."""
        texts, rows = group.span(site)
        return torch.nn.functional.pad(self.at(texts), (0, rows - texts))


def grid_patches(
    layers: int, heads: int, tokens: int, granularity: PatchGranularity
) -> tuple[list[Patch], tuple[int, ...]]:
    """Every patch of ``granularity`` (``heads``: the site's) and the shape of their grid, the sizes of its
    axes (:data:`~bertology.interventions.patch_grid.GRIDS`: ``[layers, heads]``, ``[layers, heads,
    tokens]``, ``[layers]`` or ``[layers, tokens]``), patches in that grid's row-major order."""
    axes = GRIDS[granularity].axes
    grid = grid_shape(layers, heads, tokens, granularity)
    every = torch.ones(1, dtype=torch.bool)
    patches = []
    for cell in np.ndindex(*grid):
        at = dict(zip(axes, cell, strict=True))
        heads_of = _one_hot(at["head"], heads) if "head" in at else None
        where = _one_hot(at["position"], tokens) if "position" in at else every
        patches.append(Patch(at["layer"], heads_of, where))
    return patches, grid


def grid_shape(layers: int, heads: int, tokens: int, granularity: PatchGranularity) -> tuple[int, ...]:
    """The sizes of ``granularity``'s axes (``heads``: the site's)."""
    sizes = {"layer": layers, "head": heads, "position": tokens}
    return tuple(sizes[axis] for axis in GRIDS[granularity].axes)


def _one_hot(index: int, size: int) -> torch.Tensor:
    mask = torch.zeros(size, dtype=torch.bool)
    mask[index] = True
    return mask


@dataclass
class GroupRuns:
    """What the clean and the corrupted pass gave one :class:`PairGroup` (``b`` pairs of ``t`` tokens).

    heads: per run (``"clean"``, ``"corrupted"``), per layer [rows, t, heads * head_dim] the input of the
    output projection (``rows``: the group's input rows). layers: per run, what entered each layer
    (:class:`LayerInputs`). ld: per run, [b] the metric. score: the metric bound to the group.
    site: the site patched; activations: per run, per layer [rows, t, features] its tensor, the axes
    after the position flattened (for ``z``, ``heads`` itself). constant: an ablation's value, per layer
    [1, 1, features] (0 or the mean), written in place of the source run's activations; ``None``:
    counterfactual patching.
    """

    heads: dict[str, list[torch.Tensor]]
    layers: dict[str, LayerInputs]
    ld: dict[str, torch.Tensor]
    score: Scorer
    site: str = "z"
    activations: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    constant: list[torch.Tensor] | None = None

    def carried(self, source: str, layer: int, start: int = 0) -> torch.Tensor:
        """What a patch at ``layer`` writes: [rows, t - start, features] the ``source`` run's activations
        at positions ``start..``, or the ablation's constant [1, 1, features]."""
        if self.constant is not None:
            return self.constant[layer]
        return self.activations[source][layer][:, start:]


def _site_parts(loaded: LoadedModel, site: str) -> list[AttentionParts]:
    """The attention of each layer of ``site``'s stack (an encoder-decoder's) or of the model."""
    stack = site.rpartition(":")[0]
    return stack_parts(loaded.model, stack) if stack else attention_parts(loaded.model)


def _site_layers(loaded: LoadedModel, site: str) -> list[int | None]:
    """The layers of ``site`` (of its stack): every layer's number, or ``[None]`` for a site without
    layers."""
    if not site_of(site).per_layer:
        return [None]
    stack = site.rpartition(":")[0]
    return list(range(len(_site_parts(loaded, site) if stack else layer_modules(loaded.model))))


def _by_position(tensor: torch.Tensor) -> torch.Tensor:
    """A site's tensor as [b, t, features], the axes after the position flattened; a classifier's logits
    [b, labels] as one position, [b, 1, labels]."""
    return tensor[:, None] if tensor.dim() == 2 else tensor.flatten(2)


@contextmanager
def _recording_sites(loaded: LoadedModel, into: dict[str, list[torch.Tensor]]) -> Iterator[None]:
    """Inside the block a forward pass's tensors of the sites named by ``into``'s keys, per layer
    (:func:`_site_layers`) [b, t, features] (:func:`_by_position`), are appended to ``into`` when the
    block ends."""
    with recording(loaded.model, list(into)) as cache:
        yield
    for name, tensors in into.items():
        tensors.extend(_by_position(cache[name, layer]) for layer in _site_layers(loaded, name))


def _passed(loaded: LoadedModel, inputs: dict[str, Any]) -> LayerInputs:
    """One pass of ``inputs``: what entered each layer (:func:`record_layer_inputs`), or for an
    encoder-decoder, whose patched passes run the whole model (:class:`TargetPass`), its logits only."""
    if not has_stacks(loaded.model):
        return record_layer_inputs(loaded, inputs)
    return LayerInputs([], [], [], loaded.model(**inputs).logits)


def _resolve_labels(group: PairGroup, clean: torch.Tensor, corrupted: torch.Tensor) -> None:
    """A classifier's pairs without labels take the clean (``answer``) and corrupted (``wrong``) input's
    predicted labels."""
    group.answer = torch.where(group.answer < 0, clean.argmax(-1), group.answer)
    group.wrong = torch.where(group.wrong < 0, corrupted.argmax(-1), group.wrong)


def run_group(
    loaded: LoadedModel,
    group: PairGroup,
    runs: Sequence[str] = ("clean", "corrupted"),
    metric: PatchMetric = "logit-diff",
    site: str = "z",
) -> GroupRuns:
    """The passes ``runs`` (``"clean"``, ``"corrupted"``) of ``group``: head outputs, the tensors of
    ``site``, layer inputs and, once the labels are known (a language model's, a classifier's given or,
    with both runs, predicted) and, for ``kl``, the clean run's distribution, the ``metric``."""
    heads: dict[str, list[torch.Tensor]] = {}
    activations: dict[str, list[torch.Tensor]] = {}
    layers: dict[str, LayerInputs] = {}
    stacked = has_stacks(loaded.model)
    for run in runs:
        # an encoder-decoder has no unstacked z (path patching, which reads it, takes no encoder-decoder)
        recorded: dict[str, list[torch.Tensor]] = {site: []} if stacked else {"z": [], site: []}
        with _recording_sites(loaded, recorded):
            layers[run] = _passed(loaded, getattr(group, run))
        heads[run], activations[run] = recorded.get("z", []), recorded[site]
    if not group.language_model and len(layers) == 2:
        _resolve_labels(group, layers["clean"].logits, layers["corrupted"].logits)
    score = Scorer(patching_metric(metric), group)
    if "clean" in layers:
        score.know_clean(layers["clean"].logits)
    labelled = bool((group.answer >= 0).all() and (group.wrong >= 0).all())
    known = labelled and (score.clean is not None or score.metric.name != "kl")
    ld = {run: score(layers[run].logits) for run in layers} if known else {}
    return GroupRuns(heads, layers, ld, score, site, activations)


def _replacing(target: torch.Tensor, source: torch.Tensor, mask: torch.Tensor, copies: int) -> torch.Tensor:
    """``target`` [copies * b, t, f] with, in copy ``k``, the features ``mask[k]`` ([t, f] bool) taken from
    ``source`` [b, t, f]."""
    shaped = target.unflatten(0, (copies, -1))
    return torch.where(mask[:, None], source[None].to(target.dtype), shaped).flatten(0, 1)


def _masks(patches: Sequence[Patch], head_dim: int, group: PairGroup, site: str) -> torch.Tensor:
    """[patches, tokens, features] bool: per patch, the features of ``site`` it replaces in ``group``'s
    inputs (a head's ``head_dim`` features at its positions; for the whole site every feature, as a
    [patches, tokens, 1] mask)."""
    rows = []
    for patch in patches:
        positions = patch.in_group(group, site)[:, None]
        rows.append(positions if patch.heads is None else positions & patch.heads.repeat_interleave(head_dim))
    return torch.stack(rows)


def shared_prefix(group: PairGroup) -> int:
    """The number of leading positions at which every pair of ``group`` has the same clean and corrupted
    token, at most ``prompt_tokens - 1`` (the texts' last position, the first whose logits are read, is
    always run)."""
    differs = (group.clean["input_ids"] != group.corrupted["input_ids"]).any(0)  # [t]
    first = int(differs.nonzero()[0]) if bool(differs.any()) else group.tokens
    return min(first, group.prompt_tokens - 1)


@dataclass
class TargetPass:
    """What every patched pass of one group starts from: the target run at positions ``start..t-1``.

    start: the first position run. 0 (every position) unless the model is a causal decoder whose pairs
    share their first ``start`` tokens (:func:`shared_prefix`): the activations at those positions are
    then the same in the clean, the corrupted and every patched run (a patch there puts in what is already
    there), so a patched pass runs the later positions only, reading the earlier ones' keys and values from
    ``prefix`` (one pass of the target's first ``start`` positions).
    inputs: the model's inputs of positions ``start..``. layers: what entered each layer at those positions
    in the target run (hidden states [b, t - start, hidden] and the layers' other arguments).

    An encoder-decoder's patched passes run the whole model (its two stacks are not one list of layers
    to start part-way through: ``layers`` holds the logits only) but for a site in the decoder (its own
    attention or cross-attention): the encoder's output is then the target run's, ``encoded`` [b, source
    tokens, hidden], computed once, and a patched pass runs the decoder alone.
    """

    start: int
    inputs: dict[str, Any]
    layers: LayerInputs
    prefix: Prefix | None = None
    encoded: torch.Tensor | None = None

    def logits(self, loaded: LoadedModel, layer: int, copies: int) -> torch.Tensor:
        """The logits of a pass from ``layer`` (its site patched by the caller's hooks) of ``copies``
        copies of the batch side by side."""
        if not has_stacks(loaded.model):
            inputs, recorded = self.tiled(layer, copies)
            gates = torch.ones(loaded.num_layers, loaded.num_heads)
            return logits_from_layer(loaded, inputs, recorded, layer, gates)
        batch = self.inputs["input_ids"].shape[0]
        inputs = tiled(self.inputs, copies, batch)
        if self.encoded is not None:
            inputs["encoder_outputs"] = (tiled(self.encoded, copies, batch),)
        return loaded.model(**inputs).logits

    def tiled(self, layer: int, copies: int) -> tuple[dict[str, Any], LayerInputs]:
        """The inputs and layer inputs of a pass from ``layer`` with ``copies`` copies of the batch.

        With a prefix the layers get a copy of its keys and values of their own to grow. From layer 0 the
        model's forward runs them with its inputs' cache; from a later layer it runs none of them
        (:func:`~bertology.interventions.partial.logits_from_layer`) and its inputs' cache, the kept one,
        only gives the positions' numbers and the size of the mask."""
        batch = self.layers.hidden[layer].shape[0]
        if self.prefix is None:
            return tiled(self.inputs, copies, batch), self.layers.tiled(layer, copies)
        own = self.prefix.copy(copies)
        inputs = tiled(self.inputs, copies, batch, own if layer == 0 else self.prefix.cache)
        return inputs, self.layers.tiled(layer, copies, own)


def target_pass(
    loaded: LoadedModel, group: PairGroup, runs: GroupRuns, target: str, skip_shared_prefix: bool = True
) -> TargetPass:
    """The :class:`TargetPass` of ``group``'s ``target`` run (``"clean"`` or ``"corrupted"``): from the
    first position after the pairs' shared prefix where the model is a causal decoder whose forward takes
    a key/value cache and ``skip_shared_prefix``; from position 0 otherwise (an encoder, an
    encoder-decoder, pairs that differ at their first token)."""
    inputs = getattr(group, target)
    if has_stacks(loaded.model):
        encoded = None
        if not runs.site.startswith("encoder:"):
            encoder = loaded.model.get_encoder()
            encoded = encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])[0]
        return TargetPass(0, inputs, runs.layers[target], encoded=encoded)
    start = shared_prefix(group) if skip_shared_prefix else 0
    prefix = run_prefix(loaded, inputs, start) if start > 0 else None
    if prefix is None:
        return TargetPass(0, inputs, runs.layers[target])
    later = prefix.after(inputs, prefix.copy())
    return TargetPass(start, later, record_layer_inputs(loaded, later), prefix)


def _exact_layer(
    loaded: LoadedModel,
    group: PairGroup,
    runs: GroupRuns,
    begin: TargetPass,
    patches: Sequence[Patch],
    source: str,
) -> torch.Tensor:
    """[patches, b] ``LD`` with each of ``patches`` (all at one layer) in the target run, side by side, at
    the positions ``begin.start..`` (what a patch puts in at an earlier position is already there)."""
    layer, copies = patches[0].layer, len(patches)
    head_dim = 1 if patches[0].heads is None else _site_parts(loaded, runs.site)[layer].head_dim
    positions = runs.activations[source][layer].shape[1]
    mask = _masks(patches, head_dim, group, runs.site)
    # from begin.start on; logits cover the last positions only (a decoder's logits_to_keep, a classifier's
    # one row per text)
    mask = mask[:, max(begin.start, mask.shape[1] - positions) :].to(loaded.device)
    replacement = runs.carried(source, layer, positions - mask.shape[1])

    def patched(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        # a per-head site is [b, t, heads, head_dim]; the masks and replacements are [.., t, features]
        flat = _by_position(tensor)
        return _replacing(flat, replacement, mask, copies).view(tensor.shape)

    # a site without layers is patched in a pass of the whole model (layer 0 on)
    at = layer if site_of(runs.site).per_layer else None
    with replacing(loaded.model, {(runs.site, at): patched}):
        logits = begin.logits(loaded, layer, copies)
    return runs.score(logits, copies).unflatten(0, (copies, len(group.rows)))


def exact_patching(
    loaded: LoadedModel,
    group: PairGroup,
    runs: GroupRuns,
    patches: Sequence[Patch],
    *,
    direction: PatchDirection = "denoising",
    patches_per_pass: int = 16,
    skip_shared_prefix: bool = True,
    on_patches_done: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """[patches, b] ``LD`` of ``group`` with each patch alone (``direction``: which run is patched),
    ``patches_per_pass`` patches side by side in one pass of layers ``l..`` (all patches of a pass share
    their layer ``l``), at the positions after the pairs' shared prefix in a causal decoder
    (:class:`TargetPass`; ``skip_shared_prefix=False``: at every position, as for an encoder). A patch
    only at positions of the shared prefix changes nothing: its ``LD`` is the target run's, without a
    pass."""
    source, target = roles(direction)
    begin = target_pass(loaded, group, runs, target, skip_shared_prefix)
    results = torch.empty(len(patches), len(group.rows))
    by_layer: dict[int, list[int]] = {}
    unchanged = []
    for index, patch in enumerate(patches):
        if bool(patch.in_group(group, runs.site)[begin.start :].any()):
            by_layer.setdefault(patch.layer, []).append(index)
        else:
            unchanged.append(index)
    if unchanged:
        results[unchanged] = runs.ld[target].cpu()
        if on_patches_done is not None:
            on_patches_done(len(unchanged))
    for indices in by_layer.values():
        for start in range(0, len(indices), patches_per_pass):
            chosen = indices[start : start + patches_per_pass]
            ld = _exact_layer(loaded, group, runs, begin, [patches[i] for i in chosen], source)
            results[chosen] = ld.cpu()
            if on_patches_done is not None:
                on_patches_done(len(chosen))
    return results


def roles(direction: PatchDirection) -> tuple[str, str]:
    """(source, target) runs of ``direction``."""
    return ("clean", "corrupted") if direction == "denoising" else ("corrupted", "clean")


def attribution_patching(
    loaded: LoadedModel,
    group: PairGroup,
    runs: GroupRuns,
    granularity: PatchGranularity,
    direction: PatchDirection,
) -> torch.Tensor:
    """[b, *grid] the first-order estimate of ``LD_patched - LD_target`` for every patch of
    ``granularity`` at ``runs.site`` (module docstring): ``grid`` is the sizes of the granularity's axes
    (:func:`grid_patches`; tokens: the texts'). One forward and one backward pass of the target input
    (``runs`` needs only the source's pass); the target's ``LD`` (and the source's, once a classifier's
    labels are known from both) are put into ``runs.ld``."""
    source, target = roles(direction)
    site = runs.site
    axes = GRIDS[granularity].axes
    kept: dict[int | None, torch.Tensor] = {}

    def keep(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        kept[layer] = tensor  # what the model goes on with: gradients are taken at it
        return tensor

    def leaf(name: str) -> Callable[[torch.Tensor, int | None], torch.Tensor]:
        """What cuts layer 0's input (or the embeddings) of ``name`` from the graph of the weights (and
        keeps it when it is the site patched)."""

        def cut(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
            tensor = tensor.detach().requires_grad_(True)
            return keep(tensor, layer) if name == site else tensor

        return cut

    # the leaves: the embeddings, or layer 0's input of the model or of each stack of an encoder-decoder
    if site == "embed":
        starts: list[tuple[str, int | None]] = [("embed", None)]
    else:
        stacks = ("encoder:", "decoder:") if has_stacks(loaded.model) else ("",)
        starts = [(f"{stack}resid_pre", 0) for stack in stacks]
    functions = {site: keep} | {start: leaf(start[0]) for start in starts}
    with torch.enable_grad(), replacing(loaded.model, functions):
        logits = loaded.model(**getattr(group, target)).logits
        found = {source: runs.layers[source].logits, target: logits.detach()}
        if not group.language_model:
            _resolve_labels(group, found["clean"], found["corrupted"])
        runs.score.know_clean(found["clean"])
        ld = runs.score(logits)
        activations = [kept[layer] for layer in sorted(kept)]
        gradients = [_by_position(gradient) for gradient in torch.autograd.grad(ld.sum(), activations)]
    activations = [_by_position(activation) for activation in activations]
    runs.ld[target] = ld.detach()
    runs.ld[source] = runs.score(runs.layers[source].logits)
    pairs, (prompt, tokens) = len(group.rows), group.span(site)
    estimates = []
    carried = [runs.carried(source, layer) for layer in range(len(activations))]
    for activation, gradient, replacement in zip(activations, gradients, carried, strict=True):
        change = (replacement.float() - activation.detach().float()) * gradient.float()  # [rows, t, features]
        # logits cover the last positions only (as in _exact_layer)
        change = torch.nn.functional.pad(change, (0, 0, tokens - change.shape[1], 0))
        # [b, prompt, features]: a pair's rows summed (its answer's and its wrong answer's, where there
        # are two), at the texts' positions only
        change = change[:, :prompt].unflatten(0, (-1, pairs)).sum(0)
        # [b, prompt, cells]: summed over each head's features, or over all of them
        cells = (
            change.unflatten(-1, (_site_heads(loaded, site), -1)) if "head" in axes else change[..., None, :]
        )
        cells = cells.sum(-1)
        cells = cells if "position" in axes else cells.sum(1, keepdim=True)  # [b, positions, cells]
        estimates.append(cells.transpose(1, 2).reshape(cells.shape[0], -1))  # [b, cells x positions]
    estimate = torch.stack(estimates, dim=1)  # [b, layers, ...]
    return estimate.reshape(estimate.shape[0], *_grid_shape(loaded, site, granularity, prompt)).cpu()


def _site_heads(loaded: LoadedModel, site: str) -> int:
    """How many heads ``site`` has: the key/value heads for ``k`` and ``v``, else the model's (an
    encoder-decoder's: its stack's)."""
    parts = _site_parts(loaded, site)[0]
    if site.rpartition(":")[2] in ("k", "v"):
        return parts.key_value_heads
    return parts.heads if ":" in site else loaded.num_heads


def _grid_shape(
    loaded: LoadedModel, site: str, granularity: PatchGranularity, tokens: int
) -> tuple[int, ...]:
    """The sizes of ``granularity``'s axes at ``site`` for texts of ``tokens`` tokens."""
    return grid_shape(len(_site_layers(loaded, site)), _site_heads(loaded, site), tokens, granularity)


@dataclass
class PatchingResult:
    """``LD`` (the ``metric``'s value) of every pair, clean, corrupted and with each patch of ``site``
    (exact or estimated by attribution; ``ablation``: what the patches wrote, module docstring).

    ld_clean, ld_corrupted: [pairs]. ld_patched: [*grid, pairs] (``grid``: the sizes of the
    granularity's axes, :attr:`axes`: [layers, heads] for ``head``, [layers, heads, tokens] for
    ``head-position``, [layers] for ``layer``, [layers, tokens] for ``position``).
    """

    method: Literal["exact", "attribution"]
    direction: PatchDirection
    granularity: PatchGranularity
    ld_clean: np.ndarray
    ld_corrupted: np.ndarray
    ld_patched: np.ndarray
    metric: PatchMetric = "logit-diff"
    site: str = "z"
    ablation: PatchAblation = "counterfactual"

    @property
    def grid(self) -> PatchGrid:
        """The record of the granularity: the names of the grid's axes."""
        return GRIDS[self.granularity]

    @property
    def ld_target(self) -> np.ndarray:
        """[pairs] ``LD`` of the run patched (the corrupted one when denoising)."""
        return self.ld_corrupted if self.direction == "denoising" else self.ld_clean

    @property
    def effect(self) -> np.ndarray:
        """[*grid] the effect of each patch, ``LD`` averaged over pairs first (module docstring)."""
        gap = self.ld_clean.mean() - self.ld_corrupted.mean()
        return (self.ld_patched.mean(-1) - self.ld_target.mean()) / gap

    @property
    def effect_per_pair(self) -> np.ndarray:
        """[*grid, pairs] each pair's own ``(LD_patched - LD_target) / (LD_clean - LD_corrupted)``."""
        return (self.ld_patched - self.ld_target) / (self.ld_clean - self.ld_corrupted)


def largest(effect: np.ndarray, count: int) -> np.ndarray:
    """[min(count, size)] flat indices into ``effect`` (any shape) of its ``count`` largest values by
    absolute size, largest first (ties in index order): the patches that matter whichever their sign, so
    under noising the most negative ones."""
    return np.argsort(-np.abs(effect.ravel()), kind="stable")[:count]


@dataclass
class PatchingStudy:
    """What :func:`patch` found: ``exact`` and/or ``attribution`` results of the same patches, the pairs
    and their tokens at the site's positions (per pair, clean and corrupted; an encoder-decoder's target
    prefix twice at a site over the target), the answer or label names, and ``attention``: the
    first pair's attention weights, ``{"clean": ..., "corrupted": ...}`` each [layers, heads, tokens,
    tokens] (rows the queries) on the texts' tokens (empty for an encoder-decoder)."""

    model_name: str
    pairs: list[PatchPair]
    tokens: list[tuple[list[str], list[str]]]
    language_model: bool
    exact: PatchingResult | None = None
    attribution: PatchingResult | None = None
    labels: list[tuple[str, str]] = field(default_factory=list)
    attention: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def results(self) -> list[PatchingResult]:
        return [result for result in (self.exact, self.attribution) if result is not None]

    def agreement(self, top: int = 10) -> dict[str, float] | None:
        """With both methods: the Pearson correlation of their effects over every patch, and the share of
        the ``top`` patches by absolute exact effect (:func:`largest`, the set a report shows) that are
        among attribution's ``top`` by absolute estimate; ``None`` otherwise."""
        if self.exact is None or self.attribution is None:
            return None
        exact, estimate = self.exact.effect.ravel(), self.attribution.effect.ravel()
        top = min(top, exact.size)
        chosen = set(largest(exact, top).tolist())
        found = set(largest(estimate, top).tolist())
        return {
            "pearson": float(np.corrcoef(exact, estimate)[0, 1]),
            "top_k": top,
            "top_k_agreement": len(chosen & found) / top,
        }


def check_options(
    loaded: LoadedModel | None,
    direction: str,
    granularity: str,
    method: str,
    metric: str = "logit-diff",
    site: str = "z",
    ablation: str = "counterfactual",
) -> None:
    """Refuse an unknown direction, site, granularity (or one ``site`` has no axis for), method, metric or
    ablation, or, of a model (``loaded``; ``None``: the options only, before a model is loaded), one whose
    layers share their weights, a classifier's logits (no position axis) by position, or a site without its
    stack for an encoder-decoder (or with one for another model).

    Raises:
        BertologyError: as said.
    """
    patching_metric(metric)
    patch_grid(site, granularity)
    stacked = ":" in site
    if loaded is not None and stacked != has_stacks(loaded.model):
        raise BertologyError(
            f"{loaded.name} is an encoder-decoder, whose sites name their stack: give one such as "
            f"'encoder:{site}'."
            if not stacked
            else f"{loaded.name} has no encoder and decoder stacks; give the site without its stack, "
            f"{site.rpartition(':')[2]!r}."
        )
    for value, allowed, name in (
        (direction, PATCH_DIRECTIONS, "direction"),
        (method, PATCH_METHODS, "method"),
        (ablation, PATCH_ABLATIONS, "ablation"),
    ):
        if value not in allowed:
            raise BertologyError(f"Unknown patching {name} {value!r}; choose one of {', '.join(allowed)}.")
    if loaded is not None and shares_layers(loaded.model):
        raise BertologyError(
            f"{loaded.name} shares one layer's weights across layers; patch a model without."
        )
    if (
        loaded is not None
        and site == "logits"
        and loaded.kind != "decoder"
        and GRIDS[granularity].per_position
    ):
        raise BertologyError(
            f"A classifier's logits have no position axis (one row of labels per text), so they cannot be "
            f"patched by {granularity!r}; choose layer (every label)."
        )


def load_pairs(
    loaded: LoadedModel, pairs: Sequence[PatchPair] | str | Path, prepend_bos: bool = False
) -> tuple[list[PatchPair], EncodedPairs]:
    """``pairs`` (or the pairs of the file at that path) and their encoding for ``loaded`` (see
    :func:`~bertology.interventions.patching_pairs.encode_pairs`)."""
    chosen = read_pairs(pairs) if isinstance(pairs, str | Path) else list(pairs)
    if not chosen:
        raise BertologyError("There are no pairs to patch.")
    return chosen, encode_pairs(loaded, chosen, prepend_bos)


def default_direction(ablation: str, direction: PatchDirection | None = None) -> PatchDirection:
    """``direction``, or where ``None`` the default: ``noising`` for an ablation (the clean run loses the
    site's information), ``denoising`` for counterfactual patching."""
    if direction is not None:
        return direction
    return "denoising" if ablation == "counterfactual" else "noising"


def mean_constant(
    loaded: LoadedModel, groups: Sequence[PairGroup], site: str, source: str
) -> list[torch.Tensor]:
    """Per layer [1, 1, features]: ``site``'s activation in the ``source`` run averaged over every pair
    and every position of its texts (:func:`~bertology.interventions.pair_mean.mean_over_texts`), one
    pass of each group's source input."""
    per_group = []
    for group in groups:
        recorded: dict[str, list[torch.Tensor]] = {site: []}
        with _recording_sites(loaded, recorded):
            loaded.model(**getattr(group, source))
        per_group.append(recorded[site])
    tokens = [group.span(site)[0] for group in groups]
    return [mean_over_texts(layer, tokens)[None, None] for layer in zip(*per_group, strict=True)]


def patch(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    *,
    direction: PatchDirection | None = None,
    site: str = "z",
    granularity: PatchGranularity = "head",
    method: PatchMethod = "exact",
    metric: PatchMetric = "logit-diff",
    ablation: PatchAblation = "counterfactual",
    prepend_bos: bool = False,
    patches_per_pass: int = 16,
    on_progress: Progress | None = None,
) -> PatchingStudy:
    """Patch ``site`` (:data:`~bertology.interventions.patch_grid.PATCH_SITES`) of every layer of
    ``loaded`` on ``pairs`` (:class:`PatchPair` or a pairs file:
    :mod:`~bertology.interventions.patching_pairs`) by ``granularity``: each head, each head at each
    position, the whole site, or the whole site at each position
    (:data:`~bertology.interventions.patch_grid.GRIDS`). An encoder-decoder's ``site`` names its stack
    (``encoder:z``, ``cross:v``) and its pairs are sources with a shared target prefix (module docstring).

    method: ``exact`` (one patched pass per patch, ``patches_per_pass`` side by side), ``attribution``
        (the first-order estimate) or ``both``.
    metric: ``logit-diff``, ``prob-diff`` or ``kl``
        (:mod:`~bertology.interventions.patching_metrics`).
    ablation: what a patch writes in the target run: the source run's activations (``counterfactual``,
        the default), 0 (``zero``) or the source run's mean over every pair and position of its texts
        (``mean``, :mod:`~bertology.interventions.pair_mean`).
    direction: ``denoising`` (clean into the corrupted run) or ``noising``; by default ``denoising``, and
        ``noising`` with an ablation (the clean run ablated).
    prepend_bos: a language model's texts with the tokenizer's BOS token first (TransformerLens's
        default; off, the texts as the tokenizer writes them).
    on_progress: told the patches done (exact), out of patches x groups of pairs of one token count.

    Raises:
        BertologyError: an unknown option, a granularity ``site`` has no axis for, pairs that the model
            cannot read (see :func:`~bertology.interventions.patching_pairs.encode_pairs`), a
            per-position granularity on pairs of different token counts, a model that shares its
            layers, or a site without its stack for an encoder-decoder (with one for another model).
    """
    direction = default_direction(ablation, direction)
    check_options(loaded, direction, granularity, method, metric, site, ablation)
    chosen, encoded = load_pairs(loaded, pairs, prepend_bos)
    tokens = encoded.positions(site)
    if GRIDS[granularity].per_position and tokens is None:
        raise BertologyError(
            f"--granularity {granularity} compares positions, so every pair needs the same token count; "
            f"these pairs have {sorted({group.span(site)[0] for group in encoded.groups})}."
        )
    patches, grid = grid_patches(
        len(_site_layers(loaded, site)), _site_heads(loaded, site), tokens or 1, granularity
    )
    count = len(chosen)
    ld = {run: np.zeros(count) for run in ("clean", "corrupted")}
    exact = np.zeros((len(patches), count)) if method != "attribution" else None
    estimate = np.zeros((count, *grid)) if method != "exact" else None
    total, done = len(patches) * len(encoded.groups), 0

    def advance(step: int) -> None:
        nonlocal done
        done += step
        if on_progress is not None:
            on_progress(done, total)

    source = roles(direction)[0]
    with torch.inference_mode(False), torch.no_grad(), eval_mode(loaded):
        mean = mean_constant(loaded, encoded.groups, site, source) if ablation == "mean" else None
        for group in encoded.groups:
            runs = run_group(
                loaded,
                group,
                ("clean", "corrupted") if exact is not None else (source,),
                metric,
                site,
            )
            if ablation == "zero":
                runs.constant = [torch.zeros_like(tensor[:1, :1]) for tensor in runs.activations[source]]
            elif ablation == "mean":
                runs.constant = mean
            if exact is not None:
                exact[:, group.rows] = (
                    exact_patching(
                        loaded,
                        group,
                        runs,
                        patches,
                        direction=direction,
                        patches_per_pass=patches_per_pass,
                        skip_shared_prefix=ablation == "counterfactual",
                        on_patches_done=advance,
                    )
                    .double()
                    .numpy()
                )
            change = None
            if estimate is not None:
                change = attribution_patching(loaded, group, runs, granularity, direction).double().numpy()
            for run in ld:
                ld[run][group.rows] = runs.ld[run].cpu().double().numpy()
            if estimate is not None and change is not None:
                target = ld[roles(direction)[1]][group.rows]
                estimate[group.rows] = change + target.reshape(-1, *([1] * len(grid)))
    base = {
        "direction": direction,
        "granularity": granularity,
        "ld_clean": ld["clean"],
        "ld_corrupted": ld["corrupted"],
        "metric": metric,
        "site": site,
        "ablation": ablation,
    }
    study = PatchingStudy(
        loaded.name,
        chosen,
        encoded.tokens_at(site),
        encoded.language_model,
        labels=_label_names(loaded, encoded),
        attention={} if has_stacks(loaded.model) else _first_pair_attention(loaded, encoded),
    )
    if exact is not None:
        study.exact = PatchingResult("exact", ld_patched=exact.reshape(*grid, count), **base)  # type: ignore[arg-type]
    if estimate is not None:
        study.attribution = PatchingResult(
            "attribution",
            ld_patched=np.moveaxis(estimate, 0, -1),
            **base,  # type: ignore[arg-type]
        )
    return study


def _first_pair_attention(loaded: LoadedModel, encoded: EncodedPairs) -> dict[str, np.ndarray]:
    """The first pair's attention weights on its clean and its corrupted texts, [layers, heads, tokens,
    tokens] each (one pass of each, the answer's tokens left out)."""
    group = next(group for group in encoded.groups if 0 in group.rows)
    row = int(np.flatnonzero(group.rows == 0)[0])
    found = {}
    for run in ("clean", "corrupted"):
        inputs = {
            name: value[row : row + 1, : group.prompt_tokens] if isinstance(value, torch.Tensor) else value
            for name, value in getattr(group, run).items()
        }
        with torch.no_grad(), eval_mode(loaded), recording(loaded.model, ["pattern"]) as cache:
            loaded.model(**inputs)
        found[run] = cache.stack("pattern")[:, 0].float().cpu().numpy()
    return found


def _label_names(loaded: LoadedModel, encoded: EncodedPairs) -> list[tuple[str, str]]:
    """Per pair, the answer and wrong tokens (a language model) or label names (a classifier)."""
    names: list[tuple[str, str]] = [("", "")] * len(encoded)
    for group in encoded.groups:
        if encoded.language_model:
            for row, (answer, wrong) in zip(group.rows, group.answer_tokens(), strict=True):
                names[row] = (loaded.tokenizer.decode(answer), loaded.tokenizer.decode(wrong))
            continue
        id2label = loaded.model.config.id2label
        for row, label, wrong_label in zip(
            group.rows, group.answer.tolist(), group.wrong.tolist(), strict=True
        ):
            names[row] = (str(id2label[label]), str(id2label[wrong_label]))
    return names
