"""Circuits in post-norm encoders: every node's contribution carried through the LayerNorms between the
nodes (bertology's *norm-carried contributions*; MIB's graph is defined for pre-norm decoders only).

A post-norm encoder (BERT: ``h_l = LN(h_{l-1} + a_l)``, then ``LN(. + mlp_l)``) has no residual stream
that is the sum of its nodes' outputs. But a LayerNorm is affine once its scale is fixed:

    LN(x) = gamma * (x - mean(x)) / sigma + beta,

so in one run the stream at any point is exactly a sum of contributions:

- every node's output carried through each later LayerNorm by ``c <- gamma * (c - mean(c)) / sigma``
  (``mean`` over the model's width, ``sigma`` the scale of that run's stream at that norm, per position);
- a remainder that belongs to the ``input`` node: the embeddings, every ``beta`` and the attention output
  projections' biases, carried likewise. It is defined as the stream minus the other nodes' contributions,
  so the sum is exact. (An MLP's output keeps its own bias, as site ``mlp_out`` gives it, as in decoders.)

The masked pass (:func:`~bertology.interventions.circuit_pass.masked_pass`) gives a downstream node the input
``the stream this pass computes + sum over absent in-edges u of (R_u - C_u)``, ``C_u`` the upstream node's
contribution in this pass carried to the node's input point with this pass's ``sigma``\\ s, ``R_u`` its
contribution in the source (corrupted) run carried with the source run's ``sigma``\\ s (mean ablation: the
mean over rows and positions of the source runs' contributions at that point). So the full graph is the
plain target run (f = 1) and the empty graph gives every node the source run's input (f = 0). EAP and EAP-IG
score ``u -> v`` by ``(R_u - C_u) . dm/d(input_v)``, both carried to ``v``'s input point in the plain runs.

The input points: attention at layer ``l`` reads the stream entering the layer (``h_{l-1}``); the MLP reads
the attention block's normalised output; ``logits`` reads the last layer's output (the pooler and the
classifier follow). The norms are the two ``LayerNorm``\\ s of each layer the model type's
:class:`~bertology.models.model_types.Layout` names (``post_norms``): BERT, RoBERTa, XLM-RoBERTa, ELECTRA,
CamemBERT, ERNIE, Data2Vec-Text and MPNet. A pre-norm model (every decoder) has no norm between the
nodes: one stage, contributions are the nodes' outputs, the same code.

Memory: a masked pass carries two stacks of ``forward nodes x batch x pos x d_model`` floats (its own
contributions and the source run's); a plain run keeps each norm's ``sigma`` and output (``2 x layers x
batch x pos x d_model`` floats).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from bertology.errors import BertologyError
from bertology.interventions.circuit_graph import CircuitGraph
from bertology.interventions.pair_mean import text_sum
from bertology.models.anatomy import layer_modules, layout
from bertology.models.loading import LoadedModel

#: One plain run's norms, in forward order: each norm's scale ``sigma`` [batch, pos, 1] and its output
#: [batch, pos, d_model] (float).
NormRecord = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class NormPoint:
    """One LayerNorm between the graph's nodes: ``norm`` the module, ``done`` how many forward nodes (the
    first ones) come before it, ``reads`` the backward nodes that read the stream after it (up to the next
    norm)."""

    norm: nn.LayerNorm
    done: int
    reads: slice


@dataclass(frozen=True)
class Stages:
    """Where the graph's nodes read the stream: ``first`` the backward nodes before any norm, ``points`` the
    norms in forward order (none in a pre-norm model, where ``first`` is every backward node)."""

    first: slice
    points: tuple[NormPoint, ...]


def is_post_norm(loaded: LoadedModel) -> bool:
    """Whether ``loaded``'s layers normalise the stream after each block (BERT) rather than before (Llama)."""
    return not layout(loaded.model).mid_is_input


def circuit_stages(loaded: LoadedModel, graph: CircuitGraph) -> Stages:
    """The :class:`Stages` of ``loaded``'s model and ``graph``.

    Raises:
        BertologyError: a post-norm model whose norms or feed-forward input its layout does not name, or
            whose norms are no ``LayerNorm``.
    """
    if not is_post_norm(loaded):
        return Stages(slice(0, len(graph.downstream)), ())
    shape = layout(loaded.model)
    if shape.post_norms is None or shape.mlp_input is None:
        raise BertologyError(
            f"Circuits in encoders work for post-norm BERT, RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT, ERNIE, "
            f"Data2Vec-Text and MPNet models; {loaded.name} is a {loaded.model.config.model_type} model."
        )
    points = []
    for layer, module in enumerate(layer_modules(loaded.model)):
        attention_norm, output_norm = (module.get_submodule(path) for path in shape.post_norms)
        for norm in (attention_norm, output_norm):
            if not isinstance(norm, nn.LayerNorm):
                raise BertologyError(
                    f"{loaded.name}'s norm {type(norm).__name__} is no LayerNorm, which circuits in encoders "
                    "carry contributions through."
                )
        mlp = graph.mlp_input(layer)
        after = graph.mlp_input(layer + 1) if layer + 1 < graph.layers else graph.logits + 1
        points.append(NormPoint(attention_norm, graph.mlp_output(layer), slice(mlp, mlp + 1)))
        points.append(NormPoint(output_norm, graph.mlp_output(layer) + 1, slice(mlp + 1, after)))
    return Stages(slice(0, graph.per_layer - 1), tuple(points))


def norm_scale(norm: nn.LayerNorm, stream: torch.Tensor) -> torch.Tensor:
    """[batch, pos, 1] float: ``sigma`` of the LayerNorm ``norm`` on ``stream`` [batch, pos, d_model], the
    square root of the variance over the width plus ``eps``."""
    return torch.sqrt(stream.detach().float().var(-1, unbiased=False, keepdim=True) + norm.eps)


def carry(stack: torch.Tensor, point: NormPoint, scale: torch.Tensor, output: torch.Tensor) -> None:
    """In place, carry the contributions ``stack`` [forward nodes, batch, pos, d_model] through the norm of
    ``point``: nodes ``1 .. done - 1`` by ``gamma * (c - mean(c)) / scale`` (``scale`` [batch, pos, 1]),
    ``input`` (node 0) the norm's ``output`` [batch, pos, d_model] less them; the later nodes stay."""
    part = stack[1 : point.done]
    gamma = point.norm.weight.detach().float()
    part = gamma * (part - part.mean(-1, keepdim=True)) / scale
    stack[1 : point.done] = part
    stack[0] = output.float() - part.sum(0)


def carried(
    outputs: torch.Tensor, record: NormRecord, stages: Stages
) -> Iterator[tuple[slice, torch.Tensor]]:
    """A plain run's contributions at each stage: ``(reads, stack)``, ``stack`` [forward nodes, batch, pos,
    d_model] the run's node ``outputs`` carried through its norms (``record``) up to the stream the
    backward nodes ``reads`` read (nodes computed later: their outputs). The stack is one tensor changed in
    place from stage to stage (a copy of ``outputs`` where there are norms)."""
    stack = outputs.clone() if stages.points else outputs
    yield stages.first, stack
    for point, (scale, output) in zip(stages.points, record, strict=True):
        carry(stack, point, scale, output)
        yield point.reads, stack


def token_slice(run: tuple[torch.Tensor, NormRecord], tokens: slice) -> tuple[torch.Tensor, NormRecord]:
    """A plain run (its outputs [forward nodes, batch, pos, d_model] and norm record) at ``tokens`` of its
    batch's positions taken in order, row after row, as one row (outputs [forward nodes, 1, tokens,
    d_model], the record's [1, tokens, ...]; views where the tensors are contiguous)."""
    outputs, record = run
    return outputs.flatten(1, 2)[:, None, tokens], [
        (scale.flatten(0, 1)[None, tokens], output.flatten(0, 1)[None, tokens]) for scale, output in record
    ]


def stage_differences(
    source: tuple[torch.Tensor, NormRecord], target: tuple[torch.Tensor, NormRecord], stages: Stages
) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(reads, R - C)`` at each stage: the source run's contributions less the target run's, each run
    given as its (outputs, norm record), each carried with its own ``sigma``\\ s (EAP's activation
    difference), [forward nodes, batch, pos, d_model]."""
    for (reads, ahead), (_, behind) in zip(carried(*source, stages), carried(*target, stages), strict=True):
        yield reads, ahead - behind


@dataclass(frozen=True)
class SourceStacks:
    """What absent edges carry at each stage of a masked pass, iterated stage by stage: the source run's
    ``outputs`` [forward nodes, batch, pos, d_model] carried through its norms (``record``; counterfactual
    patching), or one stack [forward nodes, 1, 1, d_model] per stage (``means``: mean ablation)."""

    stages: Stages
    outputs: torch.Tensor | None = None
    record: NormRecord | None = None
    means: tuple[torch.Tensor, ...] | None = None
    sums: dict[tuple[tuple[int, int], ...], torch.Tensor] = field(
        default_factory=dict, compare=False, repr=False
    )
    buffers: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def workspace(self, name: str, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
        """A float tensor of ``shape`` kept under ``name`` for the next masked pass over these stacks (one
        pass at a time), zeros when made, then what the last pass wrote: a curve's passes write their
        differences into one buffer, not into fresh memory that the system must first map (some 0.1 plain
        passes for SmolLM2's 175 MB), and a row a pass does not write holds finite numbers."""
        buffer = self.buffers.get(name)
        if buffer is None or buffer.shape != shape or buffer.device != device:
            buffer = self.buffers[name] = torch.zeros(shape, dtype=torch.float32, device=device)
        return buffer

    def first_stage_sums(self, blocks: Sequence[slice]) -> torch.Tensor:
        """[blocks, batch or 1, pos or 1, d_model] the first stage's stack summed over each block of forward
        nodes, kept for the next call with the same blocks (a curve's masked passes share them)."""
        key = tuple((block.start, block.stop) for block in blocks)
        if key not in self.sums:
            stack = next(iter(self))
            self.sums[key] = torch.stack([stack[block].sum(0) for block in blocks])
        return self.sums[key]

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.means is not None:
            yield from self.means
            return
        assert self.outputs is not None and self.record is not None
        for _, stack in carried(self.outputs, self.record, self.stages):
            yield stack


def mean_stacks(
    sources: Sequence[tuple[torch.Tensor, NormRecord]], text_tokens: Sequence[int], stages: Stages
) -> SourceStacks:
    """Mean ablation's :class:`SourceStacks`: at each stage the contributions of every source run (its
    outputs and norm record, one per group) averaged over rows and the group's first ``text_tokens``
    positions, as :func:`~bertology.interventions.pair_mean.mean_over_texts` defines the mean."""
    sums: list[torch.Tensor] = []
    count = 0
    for (outputs, record), tokens in zip(sources, text_tokens, strict=True):
        for index, (_, stack) in enumerate(carried(outputs, record, stages)):
            total, vectors = text_sum(stack.permute(1, 2, 0, 3), tokens)
            if index == len(sums):
                sums.append(total)
            else:
                sums[index] = sums[index] + total
        count += vectors
    return SourceStacks(stages, means=tuple((total / count).float()[:, None, None] for total in sums))
