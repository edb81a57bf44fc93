"""Forward passes over a circuit's graph (:mod:`bertology.interventions.circuit_graph`): the nodes' outputs
of a plain run, and the masked pass that rebuilds every node's input from its in-edges.

A forward node's output, ``[batch, pos, d_model]`` (kept node-major, ``[forward nodes, batch, pos,
d_model]``, so that a sum over nodes is one matrix product): ``input`` is what enters layer 0 (site
``resid_pre`` of layer 0); head ``h`` of layer ``l`` is its output ``z_h W_O^h`` (site ``z`` through the
head's columns of the output projection, without the projection's bias, as TransformerLens's
``hook_result``); the MLP is site ``mlp_out``.

The masked pass is MIB's ``evaluate_graph`` (``eap/evaluate.py``): the model runs on the target input and
every backward node's input becomes ``input + sum over absent in-edges u of (replacement_u - current_u)``,
``current_u`` the upstream node's output in this same pass (its own inputs already rebuilt) and
``replacement_u`` its output in the source run (counterfactual patching, MIB's ``'patching'``) or its
mean (``'mean'``). A head's query, key and value inputs are rebuilt separately (sites ``q_input``,
``k_input``, ``v_input``), an MLP's through ``mlp_in``, ``logits``' through the last layer's output
(``resid_post``, before the final norm). With no edge absent the pass is the plain target run; with every
edge absent, under patching, every node sees the source run's inputs, so the logits are the source run's.

The same sums, computed with less work (each tested against a masked pass written with plain hooks):

- nodes whose in-edges are absent in the same pattern get one input (query, key and value inputs that all
  share one are site ``qkv_input``, read by the model's own projections; otherwise the inputs of a letter
  are rebuilt head by head);
- a pattern with more absent in-edges than kept ones is the running total of ``replacement_u -
  current_u`` less the kept edges' (the total of a layer's heads taken from the attention's output);
- a pass is planned before it runs, so a head whose difference no sum reads is never computed, and a layer
  none of whose nodes has a kept out-edge does not run at all (:func:`~bertology.models.sites.skipping`):
  its nodes output nothing, so each of their out-edges, all absent, carries its whole replacement;
- a sum with few non-zero weights is a sparse matrix product, and up to
  :data:`~bertology.interventions.circuit_sums.BLOCK_LAYERS` layers with
  dense ones share one larger product.

In a post-norm encoder the outputs are carried through each LayerNorm between the nodes, ``current_u`` with
this pass's scales and ``replacement_u`` with the source run's (:mod:`~bertology.interventions.circuit_norms`,
whose stages the pass steps through at each norm); an MLP's input is then site ``mlp_in``, the feed-forward
block's own input.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
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
from bertology.interventions.circuit_sums import (
    EdgeWeights,
    dense_blocks,
    edge_weights,
    own_weights,
    weighted_sum,
)
from bertology.models.anatomy import AttentionParts, attention_parts, layer_modules
from bertology.models.loading import LoadedModel
from bertology.models.sites import (
    ModuleHook,
    Replacement,
    SiteRequest,
    hooking,
    replacing,
    returns_hidden_states,
    skipping,
)


def circuit_graph(loaded: LoadedModel) -> CircuitGraph:
    """The graph of ``loaded``'s model."""
    parts = attention_parts(loaded.model)
    return CircuitGraph(
        len(parts), parts[0].heads, parts[0].key_value_heads, int(loaded.model.config.hidden_size)
    )


def head_outputs(parts: AttentionParts, z: torch.Tensor) -> torch.Tensor:
    """[heads, batch, pos, d_model] float: each head's output ``z_h W_O^h`` from ``z`` [batch, pos, heads,
    head_dim] of the layer of attention ``parts`` (the output projection's bias left out), one batched
    product over the heads."""
    rows, per_head = _head_factors(parts, z)
    return torch.bmm(rows, per_head).view(z.shape[2], z.shape[0], z.shape[1], -1)


def _head_factors(parts: AttentionParts, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two factors of :func:`head_outputs`: [heads, batch * pos, head_dim] ``z`` head-major and
    [heads, head_dim, d_model] each head's columns of the output projection, transposed (float)."""
    batch, pos, heads, head_dim = z.shape
    weight = parts.output_weight().float()  # [d_model, heads * head_dim]
    per_head = weight.unflatten(1, (heads, head_dim)).permute(1, 2, 0)
    return z.float().permute(2, 0, 1, 3).reshape(heads, batch * pos, head_dim), per_head


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


@dataclass(frozen=True)
class _LayerChange:
    """What a masked pass adds to one layer's backward nodes' inputs, from one read of the differences:
    ``changes`` [distinct, batch, pos, d_model], one per distinct pattern of absent in-edges among the
    layer's nodes, ``which`` the row of ``changes`` of each node (from the layer's first), ``summed`` how
    many forward nodes were summed (an MLP adds its own layer's heads when it runs)."""

    layer: int
    summed: int
    changes: torch.Tensor
    which: list[int]


@dataclass
class _Pass:
    """What one pass knows: the graph, what absent edges carry (``sources``, one stack per stage, the
    current one ``replacement`` ``[forward nodes, batch or 1, pos or 1, d_model]``) and ``absent``
    [forward nodes, backward nodes] float (1: the edge takes the replacement) of a masked pass (``changes``
    [backward nodes] bool: which have an absent in-edge), whether to
    keep the forward nodes' outputs (``outputs``: [forward nodes, batch, pos, d_model], the first ``done``
    of them known) and, in a pass with gradients, where the gradient of each backward node's input is
    taken, by its first backward index (``inputs``), and each layer's input (``layer_inputs``).

    A masked pass keeps, instead of the outputs, each forward node's ``replacement - output``
    (``differences``, [forward nodes, batch, pos, d_model], in the source stacks' workspace), their running
    sum over the nodes so far (``total``, [batch, pos, d_model]) and the current layer's
    :class:`_LayerChange`. Without norms between the nodes it is planned (:meth:`plan`): only the
    differences some sum reads are computed, a layer's heads entering the total through its attention's
    output. A masked pass through norms (``carries``, set when the pass starts) keeps its outputs too,
    carried through each norm as contributions, and sums the differences again after it; a plain pass keeps
    its norms' scales and outputs (``norms``)."""

    graph: CircuitGraph
    stacks: SourceStacks | None
    absent: torch.Tensor | None
    record: bool = True
    outputs: torch.Tensor | None = None
    done: int = 0
    differences: torch.Tensor | None = None
    total: torch.Tensor | None = None
    layer_change: _LayerChange | None = None
    inputs: dict[int, GradientPoint] | None = None
    layer_inputs: dict[int, torch.Tensor] | None = None
    norms: NormRecord | None = None
    carries: bool = field(default=False, init=False)
    sources: Iterator[torch.Tensor] | None = field(default=None, init=False)
    replacement: torch.Tensor | None = field(default=None, init=False)
    plans: dict[int, EdgeWeights] = field(default_factory=dict, init=False)
    needed: np.ndarray | None = field(default=None, init=False)
    head_sums: torch.Tensor | None = field(default=None, init=False)
    layer_heads: torch.Tensor | None = field(default=None, init=False)
    shared: dict[int, int] = field(default_factory=dict, init=False)
    changes: np.ndarray | None = field(default=None, init=False)
    blocks: dict[int, list[int]] = field(default_factory=dict, init=False)
    partial: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict, init=False)
    skipped: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.stacks is not None:
            self.sources = iter(self.stacks)
            self.replacement = next(self.sources)
        if self.absent is not None:
            self.changes = self.absent.any(0).cpu().numpy()

    def plan(self, can_skip: bool) -> None:
        """Before a masked pass without norms between the nodes: find each changed layer's
        :class:`EdgeWeights` and which forward nodes' differences any of them reads (:attr:`needed`). The
        heads of a layer that no weight reads are not computed: the running total takes their sum from the
        attention's output (:meth:`attended`) and each layer's heads' replacements summed
        (:attr:`head_sums`, [layers, batch or 1, pos or 1, d_model]). With ``can_skip``, the layers none of
        whose nodes has a kept out-edge (:attr:`skipped`) will not run at all (:meth:`skip`)."""
        assert self.absent is not None and self.stacks is not None and self.changes is not None
        graph, absent, changes = self.graph, self.absent, self.changes
        if can_skip:
            real = torch.as_tensor(graph.real, device=absent.device)
            read = (real & (absent == 0)).any(1).cpu().numpy()  # [forward nodes]: a kept out-edge
            # after ``input`` the forward nodes are layer by layer, its heads then its MLP
            by_layer = read[1:].reshape(graph.layers, graph.heads + 1).any(1)
            self.skipped = np.flatnonzero(~by_layer).tolist()
        needed = np.zeros(len(graph.upstream), dtype=bool)
        for layer in range(graph.layers + 1):
            first = layer * graph.per_layer
            nodes = slice(first, min(first + graph.per_layer, len(graph.downstream)))
            if not changes[nodes].any() or layer in self.skipped:
                continue
            # the layer's changes are summed at its first rebuilt input: a head's, else the MLP's
            mlp = graph.mlp_input(layer) if layer < graph.layers else None
            opens = first if mlp is None or changes[first:mlp].any() else mlp
            self.plans[layer] = edges = edge_weights(graph, absent, nodes, int(graph.feeds[opens]))
            needed[: edges.rows] |= edges.weights.any(0).cpu().numpy()
            if mlp is not None and edges.rows < graph.feeds[mlp]:  # the MLP's in-edges from its own heads
                own = slice(edges.rows, int(graph.feeds[mlp]))
                needed[own] |= own_weights(absent[own, mlp])[0].cpu().numpy() > 0
        self.needed = needed
        self.blocks = dense_blocks(self.plans)
        heads = [slice(graph.head_output(layer, 0), graph.mlp_output(layer)) for layer in range(graph.layers)]
        self.head_sums = self.stacks.first_stage_sums(heads)

    def head_input_sites(self, layer: int) -> tuple[bool, list[str]]:
        """How the query, key and value inputs of ``layer`` are rebuilt: (whether the model's own
        projections read one changed input, site ``qkv_input``, with the change of the pattern of absent
        in-edges most of them share, found in a planned pass; the letters of the inputs rebuilt head by
        head, ``q``, ``k``, ``v``, where some head's input differs)."""
        assert self.changes is not None
        graph, first, changes = self.graph, layer * self.graph.per_layer, self.changes
        changed = [letter for letter in "qkv" if changes[graph.head_inputs(layer, letter)].any()]
        edges = self.plans.get(layer)
        if edges is None or edges.rows != graph.feeds[first]:  # no plan, or no head input changes
            return False, changed
        inputs = edges.which[: graph.per_layer - 1]
        shared = max(set(inputs), key=inputs.count)
        if not (bool(edges.weights[shared].any()) or shared in edges.from_total):
            return False, changed  # most inputs do not change

        def differs(letter: str) -> bool:
            nodes = graph.head_inputs(layer, letter)
            return any(pattern != shared for pattern in inputs[nodes.start - first : nodes.stop - first])

        self.shared[layer] = shared
        return True, [letter for letter in "qkv" if differs(letter)]

    def add(self, output: torch.Tensor) -> None:
        """Keep the next forward nodes' outputs ``output`` [nodes, batch, pos, d_model] (in a masked pass,
        their differences ``replacement - output``)."""
        if not self.record:
            return
        nodes = slice(self.done, self.done + output.shape[0])
        self.done = nodes.stop
        shape = (len(self.graph.upstream), *output.shape[1:])
        if self.replacement is None or self.carries:
            if self.outputs is None:
                self.outputs = self._buffer("outputs", shape, output.device)
            self.outputs[nodes] = output
            if self.replacement is None:
                return
        if self.differences is None:
            self.differences = self._buffer("differences", shape, output.device)
        difference = torch.sub(self.replacement[nodes], output, out=self.differences[nodes])
        summed = difference.sum(0)
        self.total = summed if self.total is None else self.total.add_(summed)

    def _buffer(self, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """A new float tensor of ``shape`` (a plain run's outputs are kept), or a masked pass's
        :meth:`~bertology.interventions.circuit_norms.SourceStacks.workspace`."""
        if self.stacks is None:
            return torch.empty(shape, dtype=torch.float32, device=device)
        return self.stacks.workspace(name, shape, device)

    def add_heads(self, parts: AttentionParts, z: torch.Tensor) -> None:
        """Keep the next forward nodes, the heads of attention ``parts``, from their features ``z`` [batch,
        pos, heads, head_dim]: as :meth:`add` their outputs (:func:`head_outputs`; a plain pass's written
        in place by one batched product) or, in a masked pass that keeps no outputs, ``replacement -
        output`` written by one fused batched product."""
        if not self.record:
            return
        if self.replacement is None and self.outputs is not None:  # a plain pass: written in place
            nodes = slice(self.done, self.done + z.shape[2])
            self.done = nodes.stop
            rows, per_head = _head_factors(parts, z)
            torch.bmm(rows, per_head, out=self.outputs[nodes].flatten(1, 2))
            return
        if self.replacement is None or self.carries or self.differences is None:
            self.add(head_outputs(parts, z))
            return
        nodes = slice(self.done, self.done + z.shape[2])
        self.done = nodes.stop
        assert self.needed is not None, "a masked pass without norms is planned"
        read = self.needed[nodes]
        if not read.any():
            return  # the running total takes the heads' sum from the attention output (attended)
        rows, per_head = _head_factors(parts, z)
        difference = self.differences[nodes]
        if read.all():
            torch.baddbmm(
                self.replacement[nodes].flatten(1, 2), rows, per_head, alpha=-1, out=difference.flatten(1, 2)
            )
        else:
            index = torch.as_tensor(read.nonzero()[0], device=z.device)
            outputs = torch.bmm(rows[index], per_head[index]).view(len(index), *difference.shape[1:])
            difference[index] = self.replacement[nodes][index] - outputs

    def attended(self, layer: int, output: torch.Tensor, bias: torch.Tensor | None) -> None:
        """A planned masked pass: the attention of ``layer`` gave ``output`` [batch, pos, d_model] (its
        heads' outputs summed, plus the output projection's ``bias``): the running total gains the heads'
        ``replacement - output`` summed (kept as :attr:`layer_heads`, [batch, pos, d_model]), whether or not
        their differences were computed."""
        assert self.total is not None and self.head_sums is not None
        self.layer_heads = self.head_sums[layer] - output.detach().float()
        if bias is not None:
            self.layer_heads += bias.detach().float()
        self.total.add_(self.layer_heads)

    def skip(self, layer: int, stream: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``layer`` of a planned masked pass does not run (:attr:`skipped`): each of its nodes outputs
        nothing, so its difference is its replacement, which the running total gains; the layer returns its
        input ``stream`` [batch, pos, d_model] plus its attention output projection's ``bias``, what the
        layer adds to the stream whatever its nodes compute."""
        assert self.differences is not None and self.total is not None and self.head_sums is not None
        assert self.replacement is not None
        nodes = slice(self.graph.head_output(layer, 0), self.graph.mlp_output(layer) + 1)
        assert self.done == nodes.start
        self.differences[nodes] = self.replacement[nodes]
        self.done = nodes.stop
        self.total.add_(self.head_sums[layer]).add_(self.replacement[nodes.stop - 1])
        return stream if bias is None else stream + bias.detach().to(stream.dtype)

    def absent_sum(self, backward: slice) -> tuple[torch.Tensor, list[int]]:
        """The sums of ``replacement_u - current_u`` over the absent in-edges from the forward nodes done so
        far of backward nodes ``backward`` (a layer's): ([distinct, batch, pos, d_model] one per distinct
        pattern of in-edges, the column of each node), by its
        :class:`~bertology.interventions.circuit_sums.EdgeWeights` (planned, or found now). A planned layer
        that opens a block (:data:`~bertology.interventions.circuit_sums.BLOCK_LAYERS`) sums the rows done
        so far for every layer of the block at once, a larger and faster matrix product; the block's later
        layers then add only the rows done since."""
        assert self.absent is not None and self.differences is not None and self.total is not None
        layer = backward.start // self.graph.per_layer
        edges = self.plans.get(layer) or edge_weights(self.graph, self.absent, backward, self.done)
        assert edges.rows == self.done
        if layer in self.partial:
            start, product = self.partial.pop(layer)
            product += self.weighted_sum(edges.weights[:, start:], start)
        elif layer in self.blocks:
            together = [self.plans[member].weights[:, : self.done] for member in self.blocks[layer]]
            sums = self.weighted_sum(torch.cat(together), 0).split([len(part) for part in together])
            product = sums[0]
            self.partial |= {
                member: (self.done, part)
                for member, part in zip(self.blocks[layer][1:], sums[1:], strict=True)
            }
        else:
            product = self.weighted_sum(edges.weights, 0)
        product = product.view(-1, *self.differences.shape[1:])
        for column in edges.from_total:
            torch.sub(self.total, product[column], out=product[column])
        return product, edges.which

    def weighted_sum(self, weights: torch.Tensor, start: int) -> torch.Tensor:
        """[columns, batch * pos * d_model] ``weights`` [columns, rows] times the differences of forward
        nodes ``start`` to ``start + rows`` (:func:`~bertology.interventions.circuit_sums.weighted_sum`;
        the rows of heads no weight reads were not computed in this pass: they hold an earlier pass's
        differences, or the zeros the workspace was made with)."""
        assert self.differences is not None
        stop = start + weights.shape[1]
        return weighted_sum(weights, self.differences[start:stop].flatten(1))

    def own_heads_sum(self, summed: int, mlp: int) -> torch.Tensor:
        """[batch, pos, d_model] the sum of ``replacement_u - current_u`` over the absent in-edges of the
        MLP (backward node ``mlp``) from its own layer's heads (forward nodes ``summed`` on), by
        :func:`~bertology.interventions.circuit_sums.own_weights`."""
        assert self.differences is not None and self.absent is not None and self.layer_heads is not None
        weights, from_heads = own_weights(self.absent[summed : self.done, mlp])
        rows = weights.nonzero()[:, 0]
        part = weights[rows] @ self.differences[rows + summed].flatten(1)
        part = part.view(self.differences.shape[1:])
        return self.layer_heads - part if from_heads else part

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
        done = slice(0, self.done)
        self.total = torch.sub(self.replacement[done], self.outputs[done], out=self.differences[done]).sum(0)
        self.layer_change = None  # the layer's changes so far were summed before this norm

    def _layer_change(self, layer: int) -> _LayerChange:
        """The :class:`_LayerChange` of ``layer``, summed now if this is the layer's first rebuilt input."""
        change, first = self.layer_change, layer * self.graph.per_layer
        if change is None or change.layer != layer:
            nodes = slice(first, min(first + self.graph.per_layer, len(self.graph.downstream)))
            change = self.layer_change = _LayerChange(layer, self.done, *self.absent_sum(nodes))
        return change

    def shared_input(self, tensor: torch.Tensor, layer: int) -> torch.Tensor:
        """[batch, pos, d_model] the query, key and value input of ``layer`` as the model computed it
        (``tensor``) plus the change of the pattern of absent in-edges most of them share
        (:meth:`head_input_sites`)."""
        assert self.done == int(self.graph.feeds[layer * self.graph.per_layer])
        return tensor + self._layer_change(layer).changes[self.shared[layer]].to(tensor.dtype)

    def rebuilt(self, tensor: torch.Tensor, backward: slice) -> torch.Tensor:
        """``tensor`` [batch, pos, nodes, d_model], the inputs of backward nodes ``backward`` as the model
        computed them (one input for all), with the absent in-edges' differences ``replacement_u -
        current_u`` added. A layer's query, key and value inputs and its MLP's in-edges from earlier
        layers are summed at once (at the layer's first rebuilt input); the MLP's in-edges from its own
        layer's heads when it runs. Nodes with one pattern of absent edges get one tensor broadcast over
        them (stride 0), which :func:`~bertology.models.sites.replacing` projects once."""
        graph = self.graph
        if self.absent is not None and self.differences is not None:
            assert self.done == int(graph.feeds[backward.start])
            layer = backward.start // graph.per_layer
            first = layer * graph.per_layer
            change = self._layer_change(layer)
            which = change.which[backward.start - first : backward.stop - first]
            base = tensor[:, :, 0]
            if len(set(which)) == 1:
                shared = base + change.changes[which[0]].to(base.dtype)
                if change.summed < self.done:  # an MLP's in-edges from its own layer's heads
                    shared += self.own_heads_sum(change.summed, backward.start).to(base.dtype)
                tensor = shared[:, :, None].expand_as(tensor)
            else:  # [nodes, batch, pos, d_model], written row by row (an index of the changes is slower)
                stacked = self._buffer(f"inputs of {len(which)}", (len(which), *base.shape), base.device)
                for row, pattern in enumerate(which):
                    torch.add(base, change.changes[pattern], out=stacked[row])
                tensor = stacked.permute(1, 2, 0, 3).to(tensor.dtype)
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
        state.add(tensor.detach().float()[None])
        return layer_input(tensor, layer)

    def layer_input(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        if state.layer_inputs is not None:
            state.layer_inputs[layer] = tensor.detach()
        return tensor

    def heads(z: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        with torch.no_grad():
            state.add_heads(parts[layer], z)
        return z

    def mlp(output: torch.Tensor, _layer: int | None) -> torch.Tensor:
        state.add(output.detach().float()[None])
        return output

    def head_input(letter: str) -> Replacement:
        def rebuild(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
            assert layer is not None
            return state.rebuilt(tensor, graph.head_inputs(layer, letter))

        return rebuild

    def every_head_input(tensor: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        return state.shared_input(tensor, layer)

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
    changes = state.changes
    for layer in range(graph.layers):
        if state.inputs is not None and layer:
            functions["resid_pre", layer] = layer_input
        if state.absent is not None:
            shared, split = state.head_input_sites(layer)
            if shared:
                functions["qkv_input", layer] = every_head_input
            functions |= {(f"{letter}_input", layer): head_input(letter) for letter in split}
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

    def on_attention(layer: int, parts: AttentionParts) -> Callable[..., None]:
        bias = getattr(parts.output, "bias", None)

        def hook(_module: torch.nn.Module, _args: tuple, _kwargs: dict, output: torch.Tensor) -> None:
            state.attended(layer, output, bias)

        return hook

    def on_norm(point: NormPoint) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> None:
            state.normalised(point, args[0] if args else next(iter(kwargs.values())), output)

        return hook

    after = [(point.norm, on_norm(point)) for point in points]
    skips: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}
    if state.sources is not None and state.record and not state.carries:
        state.plan(can_skip=returns_hidden_states(layer_modules(loaded.model)[0]))
        parts = attention_parts(loaded.model)
        after += [(part.output, on_attention(layer, part)) for layer, part in enumerate(parts)]
        skips = {
            layer: partial(state.skip, layer, bias=getattr(parts[layer].output, "bias", None))
            for layer in state.skipped
        }
    with (
        hooking(after=after),
        replacing(loaded.model, _replacements(loaded, state, embedding, leaf)),
        skipping(loaded.model, skips),
    ):
        yield state


def node_outputs(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, NormRecord]:
    """One plain pass on ``inputs``: ([forward nodes, batch, pos, d_model] float the forward nodes'
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
    carry, stage by stage ([forward nodes, batch or 1, pos or 1, d_model] each), ``absent`` [forward nodes,
    backward nodes] (1 where the edge takes the replacement; only real edges are read)."""
    graph = circuit_graph(loaded)
    real = torch.as_tensor(graph.real, device=absent.device)
    absent = absent.float() * real
    state = _Pass(graph, replacement, absent, record=bool(absent.any()))
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
