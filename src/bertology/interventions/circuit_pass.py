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
from dataclasses import dataclass

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
from bertology.models.anatomy import attention_parts
from bertology.models.loading import LoadedModel
from bertology.models.sites import Replacement, SiteRequest, hooking, replacing


def circuit_graph(loaded: LoadedModel) -> CircuitGraph:
    """The graph of ``loaded``'s model."""
    parts = attention_parts(loaded.model)
    return CircuitGraph(
        len(parts), parts[0].heads, parts[0].key_value_heads, int(loaded.model.config.hidden_size)
    )


def head_outputs(loaded: LoadedModel, layer: int, z: torch.Tensor) -> torch.Tensor:
    """[batch, pos, heads, d_model] float: each head's output ``z_h W_O^h`` from ``z`` [batch, pos, heads,
    head_dim] (the output projection's bias left out)."""
    weight = attention_parts(loaded.model)[layer].output_weight()  # [d_model, heads * head_dim]
    per_head = weight.unflatten(1, (z.shape[2], z.shape[3]))
    return torch.einsum("bphe,dhe->bphd", z.float(), per_head.float())


@dataclass
class _Pass:
    """What one masked pass knows: the graph, what absent edges carry (``sources``, one stack per stage,
    the current one ``replacement`` ``[batch or 1, pos or 1, forward nodes, d_model]``), ``absent``
    [forward nodes, backward nodes] float (1: the edge takes the replacement), whether to keep the nodes'
    outputs (``outputs``: [batch, pos, forward nodes, d_model], the first ``done`` of them known; in a
    masked pass carried through the norms passed, as contributions) and, when kept, each backward node's
    rebuilt input by its first backward index (``inputs``). A plain pass keeps its norms' scales and
    outputs (``norms``)."""

    graph: CircuitGraph
    sources: Iterator[torch.Tensor] | None
    absent: torch.Tensor | None
    record: bool = True
    outputs: torch.Tensor | None = None
    done: int = 0
    differences: torch.Tensor | None = None
    inputs: dict[int, torch.Tensor] | None = None
    norms: NormRecord | None = None
    replacement: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.sources is not None:
            self.replacement = next(self.sources)

    def add(self, output: torch.Tensor) -> None:
        """Keep the next forward nodes' outputs ``output`` [batch, pos, nodes, d_model] (and, in a masked
        pass, the running sum of ``replacement - output`` over the nodes so far)."""
        if not self.record:
            return
        if self.outputs is None:
            batch, pos, _, width = output.shape
            shape = (batch, pos, len(self.graph.upstream), width)
            self.outputs = torch.empty(shape, dtype=torch.float32, device=output.device)
        nodes = slice(self.done, self.done + output.shape[2])
        self.outputs[:, :, nodes] = output
        if self.replacement is not None:
            difference = (self.replacement[:, :, nodes] - output).sum(2)
            self.differences = difference if self.differences is None else self.differences + difference
        self.done = nodes.stop

    def normalised(self, point: NormPoint, stream: torch.Tensor, output: torch.Tensor) -> None:
        """The norm of ``point`` took ``stream`` to ``output`` ([batch, pos, d_model]): keep its scale and
        output (a plain pass), or carry this pass's contributions through it with its scale, step the
        replacement to the next stage and sum the differences again (a masked pass)."""
        scale = norm_scale(point.norm, stream)
        if self.norms is not None:
            self.norms.append((scale, output.detach().float()))
        if self.sources is None or self.outputs is None:
            return
        carry(self.outputs, point, scale, output.detach())
        self.replacement = next(self.sources)
        done = slice(0, self.done)
        self.differences = (self.replacement[:, :, done] - self.outputs[:, :, done]).sum(2)

    def rebuilt(self, tensor: torch.Tensor, backward: slice) -> torch.Tensor:
        """``tensor`` [batch, pos, nodes, d_model], the inputs of backward nodes ``backward`` as the model
        computed them, with the absent in-edges' differences ``replacement_u - current_u`` added: summed
        over the absent edges where they are fewer than the kept ones, else the running sum over every
        upstream node less the kept edges' (the same sum; fewer products either way)."""
        feeds = int(self.graph.feeds[backward.start])
        if self.absent is not None and self.replacement is not None and self.outputs is not None:
            assert self.done == feeds and self.differences is not None
            absent = self.absent[:feeds, backward]
            kept = 1 - absent
            few_absent = bool(absent.sum() <= kept.sum())
            weights = absent if few_absent else kept
            rows = weights.any(1).nonzero()[:, 0]
            change = torch.zeros_like(tensor, dtype=torch.float32)
            if len(rows):
                difference = self.replacement[:, :, rows] - self.outputs[:, :, rows]
                change = torch.einsum("bpud,un->bpnd", difference, weights[rows])
            if not few_absent:
                change = self.differences[:, :, None] - change
            tensor = tensor + change.to(tensor.dtype)
        if self.inputs is not None:
            self.inputs[backward.start] = tensor
        return tensor


def _replacements(
    loaded: LoadedModel, state: _Pass, embedding: torch.Tensor | None, leaf: bool
) -> dict[SiteRequest, Replacement]:
    """The site functions of one masked pass (see :func:`masked_pass`)."""
    graph = state.graph

    def first(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        if embedding is not None:
            tensor = embedding.to(tensor.dtype)
        if leaf:
            tensor = tensor.detach().requires_grad_(True)
        state.add(tensor.detach().float()[:, :, None])
        return tensor

    def heads(z: torch.Tensor, layer: int | None) -> torch.Tensor:
        assert layer is not None
        state.add(head_outputs(loaded, layer, z.detach()))
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
        for letter in "qkv":
            nodes = graph.head_inputs(layer, letter)
            if state.inputs is not None or (changes is not None and changes[nodes].any()):
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
    state = _Pass(graph, iter(replacement), absent.float() * real)
    with torch.no_grad(), _masked(loaded, state):
        return loaded.model(**inputs).logits


def gradient_pass(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], embedding: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """A pass with gradients on ``inputs`` (the ``input`` node's output replaced by ``embedding`` where
    given, EAP-IG's interpolation): (the logits, every backward node's input ``[batch, pos, nodes,
    d_model]`` by its first backward index), to take the metric's gradient at."""
    state = _Pass(circuit_graph(loaded), None, None, record=False, inputs={})
    with torch.enable_grad(), _masked(loaded, state, embedding, leaf=True):
        logits = loaded.model(**inputs).logits
    assert state.inputs is not None
    return logits, state.inputs
