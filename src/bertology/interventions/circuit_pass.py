"""Forward passes over a circuit's graph (:mod:`bertology.interventions.circuit_graph`): the nodes' outputs
of a plain run, and the masked pass that rebuilds every node's input from its in-edges.

A forward node's output, ``[batch, pos, d_model]``: ``input`` is what enters layer 0 (site ``resid_pre``
of layer 0); head ``h`` of layer ``l`` is its output ``z_h W_O^h`` (site ``z`` through the head's columns
of the output projection, without the projection's bias, as TransformerLens's ``hook_result``); the MLP is
site ``mlp_out``.

The masked pass is MIB's ``evaluate_graph`` (``eap/evaluate.py``): the model runs on the target input and
every backward node's input becomes ``input + sum over absent in-edges u of (replacement_u - current_u)``,
``current_u`` the upstream node's output in this same pass (its own inputs already rebuilt) and
``replacement_u`` its output in the source run (counterfactual patching, MIB's ``'patching'``) or its
mean (``'mean'``). A head's query, key and value inputs are rebuilt separately (sites ``q_input``,
``k_input``, ``v_input``), an MLP's through ``mlp_in``, ``logits``' through the last layer's output
(``resid_post``, before the final norm). With no edge absent the pass is the plain target run; with every
edge absent, under patching, every node sees the source run's inputs, so the logits are the source run's.

In a post-norm encoder the outputs are carried through each LayerNorm between the nodes, ``current_u`` with
this pass's scales and ``replacement_u`` with the source run's (:mod:`~bertology.interventions.circuit_norms`,
whose stages the pass steps through at each norm); an MLP's input is then site ``mlp_in``, the feed-forward
block's own input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.circuit_norms import (
    NormPoint,
    NormRecord,
    SourceStacks,
    carry,
    circuit_stages,
    norm_scale,
)
from bertology.models.anatomy import AttentionParts, attention_parts
from bertology.models.loading import LoadedModel
from bertology.models.sites import ModuleHook, Replacement, SiteRequest, hooking, replacing


def circuit_graph(loaded: LoadedModel) -> CircuitGraph:
    """The graph of ``loaded``'s model."""
    parts = attention_parts(loaded.model)
    return CircuitGraph(
        len(parts), parts[0].heads, parts[0].key_value_heads, int(loaded.model.config.hidden_size)
    )


def head_outputs(parts: AttentionParts, z: torch.Tensor) -> torch.Tensor:
    """[batch, pos, heads, d_model] float: each head's output ``z_h W_O^h`` from ``z`` [batch, pos, heads,
    head_dim] of the layer of attention ``parts`` (the output projection's bias left out)."""
    weight = parts.output_weight()  # [d_model, heads * head_dim]
    per_head = weight.unflatten(1, (z.shape[2], z.shape[3]))
    return torch.einsum("bphe,dhe->bphd", z.float(), per_head.float())


@dataclass
class GradientPoint:
    """Where a pass with gradients takes the gradient of some backward nodes' inputs: at ``tensor``, the
    inputs themselves ([batch, pos, nodes, d_model]) or, for a layer's query, key or value inputs (``site``:
    the layer and ``q_input``, ``k_input`` or ``v_input``), the output of the projection that computes the
    heads' features ([batch, pos, outputs]), from whose gradient and the layer's input ``layer_input``
    ([batch, pos, d_model]) :class:`~bertology.models.sites.HeadInputGradientSum` takes the inputs'."""

    tensor: torch.Tensor
    site: tuple[int, str] | None = None
    layer_input: torch.Tensor | None = None


@dataclass
class _Pass:
    """What one pass knows: the graph, what absent edges carry (``sources``, one stack per stage, the
    current one ``replacement`` ``[batch or 1, pos or 1, forward nodes, d_model]``) and ``absent``
    [forward nodes, backward nodes] float (1: the edge takes the replacement) of a masked pass, whether to
    keep the forward nodes' outputs (``outputs``: [batch, pos, forward nodes, d_model], the first ``done``
    of them known) and, in a pass with gradients, where the gradient of each backward node's input is
    taken, by its first backward index (``inputs``), and each layer's input (``layer_inputs``).

    A masked pass keeps, instead of the outputs, each forward node's ``replacement - output``
    (``differences``, [forward nodes, batch, pos, d_model], node-major so that a sum over nodes is one
    matrix product), their running sum over the nodes so far (``total``, [batch, pos, d_model]) and the
    change of the current layer's backward nodes (``layer_change``: the layer, the forward nodes summed and
    [nodes, batch, pos, d_model], computed at the layer's first rebuilt input from one read of the
    differences). A masked pass through norms (``carries``, set when the pass starts) keeps its outputs
    too, carried through each norm as contributions, and sums the differences again after it; a plain pass
    keeps its norms' scales and outputs (``norms``)."""

    graph: CircuitGraph
    sources: Iterator[torch.Tensor] | None
    absent: torch.Tensor | None
    record: bool = True
    outputs: torch.Tensor | None = None
    done: int = 0
    differences: torch.Tensor | None = None
    total: torch.Tensor | None = None
    layer_change: tuple[int, int, torch.Tensor] | None = None
    inputs: dict[int, GradientPoint] | None = None
    layer_inputs: dict[int, torch.Tensor] | None = None
    norms: NormRecord | None = None
    carries: bool = field(default=False, init=False)
    replacement: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.sources is not None:
            self.replacement = next(self.sources)

    def add(self, output: torch.Tensor) -> None:
        """Keep the next forward nodes' outputs ``output`` [batch, pos, nodes, d_model] (in a masked pass,
        their differences ``replacement - output``)."""
        if not self.record:
            return
        nodes = slice(self.done, self.done + output.shape[2])
        self.done = nodes.stop
        if self.replacement is None or self.carries:
            if self.outputs is None:
                batch, pos, _, width = output.shape
                shape = (batch, pos, len(self.graph.upstream), width)
                self.outputs = torch.empty(shape, dtype=torch.float32, device=output.device)
            self.outputs[:, :, nodes] = output
            if self.replacement is None:
                return
        difference = self.replacement[:, :, nodes] - output
        if self.differences is None:
            batch, pos, _, width = output.shape
            shape = (len(self.graph.upstream), batch, pos, width)
            self.differences = torch.empty(shape, dtype=torch.float32, device=output.device)
        self.differences[nodes] = difference.permute(2, 0, 1, 3)
        summed = difference.sum(2)
        self.total = summed if self.total is None else self.total + summed

    def absent_sum(self, backward: slice) -> torch.Tensor:
        """[nodes, batch, pos, d_model] the sum of ``replacement_u - current_u`` over the absent in-edges
        from the forward nodes done so far, for backward nodes ``backward``: per node over its absent
        edges where they are fewer than its kept ones, else the running sum less the kept edges' (the
        same sum; fewer products either way), one matrix product over the rows that weigh anything."""
        assert self.absent is not None and self.differences is not None and self.total is not None
        done = self.done
        real = torch.as_tensor(self.graph.real[:done, backward], device=self.absent.device)
        absent = self.absent[:done, backward]
        kept = real.float() - absent
        few_absent = absent.sum(0) <= kept.sum(0)
        weights = torch.where(few_absent, absent, kept)
        rows = weights.any(1).nonzero()[:, 0]
        flat = self.differences[:done].flatten(1)
        if len(rows) < done // 2:
            weights, flat = weights[rows], flat[rows]
        product = (weights.T @ flat).view(-1, *self.differences.shape[1:])
        if bool(few_absent.all()):
            return product
        return torch.where(few_absent[:, None, None, None], product, self.total - product)

    def normalised(self, point: NormPoint, stream: torch.Tensor, output: torch.Tensor) -> None:
        """The norm of ``point`` took ``stream`` to ``output`` ([batch, pos, d_model]): keep its scale and
        output (a plain pass), or carry this pass's contributions through it with its scale, step the
        replacement to the next stage and sum the differences again (a masked pass)."""
        scale = norm_scale(point.norm, stream)
        if self.norms is not None:
            self.norms.append((scale, output.detach().float()))
        if self.replacement is None or not self.carries:
            return
        assert self.sources is not None and self.outputs is not None and self.differences is not None
        carry(self.outputs, point, scale, output.detach())
        self.replacement = next(self.sources)
        difference = self.replacement[:, :, : self.done] - self.outputs[:, :, : self.done]
        self.differences[: self.done] = difference.permute(2, 0, 1, 3)
        self.total = difference.sum(2)
        self.layer_change = None  # the layer's changes so far were summed before this norm

    def rebuilt(self, tensor: torch.Tensor, backward: slice) -> torch.Tensor:
        """``tensor`` [batch, pos, nodes, d_model], the inputs of backward nodes ``backward`` as the model
        computed them, with the absent in-edges' differences ``replacement_u - current_u`` added. A
        layer's query, key and value inputs and its MLP's in-edges from earlier layers are summed at once
        (at the layer's first rebuilt input); the MLP's in-edges from its own layer's heads when it runs."""
        graph = self.graph
        if self.absent is not None and self.differences is not None:
            assert self.done == int(graph.feeds[backward.start])
            layer = backward.start // graph.per_layer
            first = layer * graph.per_layer
            if self.layer_change is None or self.layer_change[0] != layer:
                nodes = slice(first, min(first + graph.per_layer, len(graph.downstream)))
                self.layer_change = (layer, self.done, self.absent_sum(nodes))
            _, summed, changes = self.layer_change
            change = changes[backward.start - first : backward.stop - first]
            if summed < self.done:  # an MLP's in-edges from its own layer's heads
                weights = self.absent[summed : self.done, backward]
                change = change + torch.einsum("un,ubpd->nbpd", weights, self.differences[summed : self.done])
            tensor = tensor + change.permute(1, 2, 0, 3).to(tensor.dtype)
        if self.inputs is not None:
            self.inputs[backward.start] = GradientPoint(tensor)
        return tensor


def _replacements(
    loaded: LoadedModel, state: _Pass, embedding: torch.Tensor | None, leaf: bool
) -> dict[SiteRequest, Replacement]:
    """The site functions of one masked pass (see :func:`masked_pass`)."""
    graph = state.graph
    parts = attention_parts(loaded.model)

    def first(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        if embedding is not None:
            tensor = embedding.to(tensor.dtype)
        if leaf:
            tensor = tensor.detach().requires_grad_(True)
        state.add(tensor.detach().float()[:, :, None])
        return layer_input(tensor, layer)

    def layer_input(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        if state.layer_inputs is not None:
            state.layer_inputs[layer] = tensor.detach()
        return tensor

    def heads(z: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        with torch.no_grad():
            state.add(head_outputs(parts[layer], z))
        return z

    def mlp(output: torch.Tensor, _layer: int | None) -> torch.Tensor:
        state.add(output.detach().float()[:, :, None])
        return output

    def head_input(letter: str) -> Replacement:
        def rebuild(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
            assert layer is not None
            return state.rebuilt(tensor, graph.head_inputs(layer, letter))

        return rebuild

    def mlp_input(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        index = graph.mlp_input(layer)
        return state.rebuilt(tensor[:, :, None], slice(index, index + 1))[:, :, 0]

    def logits_input(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        return state.rebuilt(tensor[:, :, None], slice(graph.logits, graph.logits + 1))[:, :, 0]

    functions: dict[SiteRequest, Replacement] = {("resid_pre", 0): first}
    if state.record:
        functions |= {"z": heads, "mlp_out": mlp}
    # a node's input is replaced where it changes (some in-edge absent) or is kept for its gradient
    changes = None if state.absent is None else state.absent.any(0).cpu().numpy()
    for layer in range(graph.layers):
        if state.inputs is not None and layer:
            functions["resid_pre", layer] = layer_input
        for letter in "qkv":
            if changes is not None and changes[graph.head_inputs(layer, letter)].any():
                functions[f"{letter}_input", layer] = head_input(letter)
        if state.inputs is not None or (changes is not None and changes[graph.mlp_input(layer)]):
            functions["mlp_in", layer] = mlp_input
    if state.inputs is not None or (changes is not None and changes[graph.logits]):
        functions["resid_post", graph.layers - 1] = logits_input
    return functions


@contextmanager
def _masked(
    loaded: LoadedModel,
    state: _Pass,
    embedding: torch.Tensor | None = None,
    leaf: bool = False,
) -> Iterator[_Pass]:
    points = circuit_stages(loaded, state.graph).points if state.record else ()
    state.carries = state.sources is not None and bool(points)

    def on_norm(point: NormPoint) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            state.normalised(point, args[0] if args else next(iter(kwargs.values())), output)

        return hook

    with (
        hooking(after=[(point.norm, on_norm(point)) for point in points]),
        replacing(loaded.model, _replacements(loaded, state, embedding, leaf)),
    ):
        yield state


def node_outputs(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, NormRecord]:
    """One plain pass on ``inputs``: ([batch, pos, forward nodes, d_model] float the forward nodes'
    outputs, the logits, the norms between the nodes: their scales and outputs)."""
    state = _Pass(circuit_graph(loaded), None, None, norms=[])
    with torch.no_grad(), _masked(loaded, state):
        logits = loaded.model(**inputs).logits
    assert state.outputs is not None and state.norms is not None
    return state.outputs, logits, state.norms


def masked_pass(
    loaded: LoadedModel,
    inputs: dict[str, torch.Tensor],
    replacement: SourceStacks,
    absent: torch.Tensor,
) -> torch.Tensor:
    """The logits of the masked pass (module docstring) on ``inputs``: ``replacement`` what absent edges
    carry, stage by stage ([batch or 1, pos or 1, forward nodes, d_model] each), ``absent`` [forward nodes,
    backward nodes] (1 where the edge takes the replacement; only real edges are read)."""
    graph = circuit_graph(loaded)
    real = torch.as_tensor(graph.real, device=absent.device)
    absent = absent.float() * real
    state = _Pass(graph, iter(replacement), absent, record=bool(absent.any()))
    with torch.no_grad(), _masked(loaded, state):
        return loaded.model(**inputs).logits


def _projection_points(loaded: LoadedModel, state: _Pass) -> list[tuple[torch.nn.Module, ModuleHook]]:
    """Hooks that keep, in a pass with gradients, each layer's query, key and value projections' outputs as
    where the gradient of its heads' inputs is taken (no per-head copies of the layer's input: see
    :class:`~bertology.models.sites.HeadInputGradientSum`); the outputs are left as they are."""
    graph = state.graph

    def keep(layer: int, letter: str) -> ModuleHook:
        def hook(_module: torch.nn.Module, _args: tuple, _kwargs: dict, output: torch.Tensor) -> None:
            assert state.inputs is not None and state.layer_inputs is not None
            point = GradientPoint(output, (layer, f"{letter}_input"), state.layer_inputs[layer])
            state.inputs[graph.head_inputs(layer, letter).start] = point

        return hook

    return [
        (projection.linear, keep(layer, letter))
        for layer, parts in enumerate(attention_parts(loaded.model))
        for letter, projection in zip("qkv", (parts.query, parts.key, parts.value), strict=True)
    ]


def gradient_pass(
    loaded: LoadedModel,
    inputs: dict[str, torch.Tensor],
    embedding: torch.Tensor | None = None,
    record: bool = False,
) -> tuple[torch.Tensor, dict[int, GradientPoint], tuple[torch.Tensor, NormRecord] | None]:
    """A pass with gradients on ``inputs`` (the ``input`` node's output replaced by ``embedding`` where
    given, EAP-IG's interpolation): (the logits, where the gradient of every backward node's input is
    taken, by its first backward index, and with ``record`` the
    forward nodes' outputs and the norms as :func:`node_outputs` gives them, else ``None``)."""
    norms: NormRecord | None = [] if record else None
    state = _Pass(circuit_graph(loaded), None, None, record=record, inputs={}, layer_inputs={}, norms=norms)
    with (
        torch.enable_grad(),
        hooking(after=_projection_points(loaded, state)),
        _masked(loaded, state, embedding, leaf=True),
    ):
        logits = loaded.model(**inputs).logits
    assert state.inputs is not None
    if not record:
        return logits, state.inputs, None
    assert state.outputs is not None and state.norms is not None
    return logits, state.inputs, (state.outputs, state.norms)
