"""What a removed head's output becomes: zero, its mean over a reference set, or its output on another
input of the set (mean and resample ablation).

A head's output is its slice of the input of its layer's output projection (``[tokens, head_dim]``, the
site of :mod:`~bertology.interventions.gates`). Removing a head with gate 0 sets it to 0 (zero ablation,
Michel et al. 2019), which moves the layer's output off anything the model saw in training; the usual
replacements keep it on the data's distribution:

- ``zero``: 0 (the default; exactly the plain gate).
- ``mean``: the head's mean output over the reference set (the inputs scored: the dev set, or the corpus
  segments). Per position when every input of the set has the same number of tokens (the mean at
  position ``t`` over the inputs), else one vector per head: the mean over every real token of every input
  (padding excluded).
- ``resample``: the head's output on another input of the set, the same for every head. Input ``i`` takes
  input ``j``'s outputs, ``j`` drawn (seeded, once per input, in input order) uniformly among the other
  inputs with at least as many tokens, or among all other inputs when none is that long; position ``t``
  takes ``j``'s output at ``t``, and positions past ``j``'s last token (only where ``j`` is shorter) take
  ``j``'s mean output over its tokens.

:class:`HeadReplacement` gives, for one batch, the per-layer replacement that
:func:`~bertology.interventions.gates.head_gates` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.interventions.data import eval_mode
from bertology.interventions.gates import record_head_outputs
from bertology.models.loading import LoadedModel
from bertology.options import ABLATION_KINDS

#: A model's input tensors for one batch ([batch, tokens] each, with ``attention_mask``).
Inputs = dict[str, torch.Tensor]


class HeadReplacement(Protocol):
    """The replacement of every head's output for a batch of the reference set.

    kind: one of :data:`~bertology.options.ABLATION_KINDS`. description: one sentence saying what it is
    (for reports). Called with a batch's ``inputs`` and ``rows`` (the inputs' positions in the set): per layer
    ``[batch or 1, tokens or 1, heads * head_dim]`` on the model's device, or ``None`` for zero.
    """

    kind: str
    description: str

    def __call__(self, inputs: Inputs, rows: np.ndarray) -> list[torch.Tensor] | None: ...


@dataclass(frozen=True)
class ZeroReplacement:
    """Zero ablation: a removed head's output is 0 (the plain gate)."""

    kind: str = "zero"
    description: str = "zero: a removed head's output is set to 0"

    def __call__(self, inputs: Inputs, rows: np.ndarray) -> None:
        return None


def _fit_width(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` [batch, tokens, features] cut or zero-padded on the right to ``width`` tokens."""
    if values.shape[1] >= width:
        return values[:, :width]
    return torch.nn.functional.pad(values, (0, 0, 0, width - values.shape[1]))


@dataclass(frozen=True)
class MeanReplacement:
    """Mean ablation: per layer, ``means`` ``[1, positions, heads * head_dim]`` (per position) or
    ``[1, 1, heads * head_dim]`` (over positions), averaged over ``inputs`` inputs."""

    means: list[torch.Tensor]
    per_position: bool
    inputs: int
    kind: str = "mean"

    @property
    def description(self) -> str:
        where = "at each position" if self.per_position else "over all tokens (the inputs' lengths differ)"
        return f"mean: a removed head's output is its mean over the {self.inputs} inputs scored, {where}"

    def __call__(self, inputs: Inputs, rows: np.ndarray) -> list[torch.Tensor]:
        if not self.per_position:
            return self.means
        width = inputs["attention_mask"].shape[1]
        return [_fit_width(mean, width) for mean in self.means]


def mean_replacement(loaded: LoadedModel, reference: Iterable[tuple[Inputs, np.ndarray]]) -> MeanReplacement:
    """Every head's mean output over the batches of ``reference`` (inputs, rows), one pass each in eval
    mode, summed in float64 (see the module docstring for per position or over positions).

    Raises:
        BertologyError: an empty reference set.
    """
    sums: list[torch.Tensor] = []  # per layer [positions, features] float64
    counts = torch.zeros(0, dtype=torch.float64)  # [positions] inputs reaching each position
    lengths: set[int] = set()
    with torch.no_grad(), eval_mode(loaded):
        for inputs, _ in reference:
            mask = inputs["attention_mask"].cpu().double()  # [batch, tokens]
            lengths |= {int(length) for length in mask.sum(1)}
            outputs = record_head_outputs(loaded, inputs)
            width = mask.shape[1]
            if width > len(counts):
                counts = torch.nn.functional.pad(counts, (0, width - len(counts)))
                sums = [torch.nn.functional.pad(total, (0, 0, 0, width - total.shape[0])) for total in sums]
            counts[:width] += mask.sum(0)
            for layer, output in enumerate(outputs):
                batch_sum = torch.einsum("bt,btf->tf", mask, output.cpu().double())
                if layer == len(sums):
                    sums.append(torch.zeros(len(counts), output.shape[-1], dtype=torch.float64))
                sums[layer][:width] += batch_sum
    if not lengths:
        raise BertologyError("Mean ablation needs at least one input to average over.")
    per_position = len(lengths) == 1
    if per_position:
        width = lengths.pop()
        means = [(total[:width] / counts[:width, None])[None] for total in sums]
    else:
        means = [(total.sum(0) / counts.sum())[None, None] for total in sums]
    dtype = loaded.model.dtype
    return MeanReplacement(
        [mean.to(loaded.device, dtype) for mean in means], per_position, int(counts[0].item())
    )


def resample_sources(lengths: Sequence[int], seed: int) -> np.ndarray:
    """[inputs] for each input the other input whose head outputs replace its own: drawn with
    ``numpy.random.default_rng(seed)``, in input order, uniformly among the other inputs with at least as
    many tokens (``lengths``), else among all the others.

    Raises:
        BertologyError: fewer than two inputs.
    """
    counts = np.asarray(lengths)
    if len(counts) < 2:
        raise BertologyError("Resample ablation needs at least two inputs (each takes another's outputs).")
    rng = np.random.default_rng(seed)
    sources = np.empty(len(counts), dtype=np.int64)
    others = np.ones(len(counts), dtype=bool)
    for row, length in enumerate(counts):
        others[row] = False
        longer = np.flatnonzero(others & (counts >= length))
        sources[row] = rng.choice(longer if len(longer) else np.flatnonzero(others))
        others[row] = True
    return sources


@dataclass(frozen=True)
class ResampleReplacement:
    """Resample ablation: input ``i``'s heads take their outputs on input ``sources[i]`` (recorded by one
    extra forward pass of the sources per batch); ``inputs_of(rows)`` encodes inputs ``rows`` of the set as
    one batch."""

    loaded: LoadedModel = field(repr=False)
    sources: np.ndarray
    inputs_of: Callable[[np.ndarray], Inputs] = field(repr=False)
    seed: int
    kind: str = "resample"

    @property
    def description(self) -> str:
        return (
            f"resample: a removed head's output is its output on another of the {len(self.sources)} inputs "
            f"scored (seed {self.seed}), one at least as long where there is one; positions past its end "
            "take its mean over its tokens"
        )

    def __call__(self, inputs: Inputs, rows: np.ndarray) -> list[torch.Tensor]:
        source_inputs = self.inputs_of(self.sources[rows])
        mask = source_inputs["attention_mask"]  # [batch, source tokens]
        width = inputs["attention_mask"].shape[1]
        positions = torch.arange(width, device=mask.device)[None, :]
        inside = positions < mask.sum(1, keepdim=True)  # [batch, width]: within the source
        weights = (mask / mask.sum(1, keepdim=True))[..., None]  # [batch, source tokens, 1]
        with torch.no_grad(), eval_mode(self.loaded):
            outputs = record_head_outputs(self.loaded, source_inputs)
        replaced = []
        for output in outputs:
            mean = (output * weights.to(output.dtype)).sum(1, keepdim=True)  # [batch, 1, features]
            replaced.append(torch.where(inside[..., None], _fit_width(output, width), mean))
        return replaced


#: Batches of a reference set: ``batches(rows, size)`` yields, ``size`` inputs at a time, the model's inputs
#: and their rows (positions in the set) for the inputs ``rows`` of the set (``None``: every input, in order).
BatchesOf = Callable[[np.ndarray | None, int], Iterable[tuple[Inputs, np.ndarray]]]


def head_replacement(
    loaded: LoadedModel,
    ablation: str | HeadReplacement,
    *,
    batches: BatchesOf,
    lengths: Callable[[], Sequence[int]],
    seed: int = 0,
    batch_size: int = 32,
) -> HeadReplacement:
    """The replacement of a removed head's output for ``loaded`` with a reference set: ``ablation``
    ``"zero"``, ``"mean"`` (over ``batches(None, batch_size)``) or ``"resample"`` (seeded by ``seed``;
    the sources' outputs recomputed as one batch ``batches(rows, len(rows))``), or a replacement already
    built (returned as it is). ``lengths()``: every input's token count.

    Raises:
        BertologyError: an unknown kind, or a set too small for it.
    """
    if not isinstance(ablation, str):
        return ablation
    if ablation == "zero":
        return ZeroReplacement()
    if ablation == "mean":
        return mean_replacement(loaded, batches(None, batch_size))

    def inputs_of(rows: np.ndarray) -> Inputs:
        inputs, _ = next(iter(batches(rows, len(rows))))
        return inputs

    if ablation == "resample":
        return ResampleReplacement(loaded, resample_sources(lengths(), seed), inputs_of, seed)
    raise BertologyError(f"The ablation must be one of {', '.join(ABLATION_KINDS)}, not {ablation!r}.")
