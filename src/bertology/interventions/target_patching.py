"""Activation patching of an encoder-decoder's heads (BART, T5) in all three stacks, measured by the
target's loss (:mod:`~bertology.interventions.target_loss`).

Pairs of a clean and a corrupted source with one target (each clean source of the same token count as
its corrupted one). Denoising, as :mod:`~bertology.interventions.patching` for encoders and decoders: the
corrupted run with one head's output (its slice of the input of its output projection, at every position)
taken from the clean run, every head of every stack in turn (encoder, decoder and cross-attention). With
``L`` the target's mean cross-entropy over all pairs (nats per target token):

    effect = (L_patched - L_corrupted) / (L_clean - L_corrupted)

1 where the patch restores the clean loss, 0 where it changes nothing. A patch is the single-head sweep
of :func:`~bertology.interventions.ablation.sweep_outputs` on the corrupted pairs whose removed head takes
its clean output (:class:`CleanOutputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.errors import BertologyError
from bertology.interventions.ablation import sweep_outputs
from bertology.interventions.curves import Head
from bertology.interventions.gates import record_head_outputs, row_stacks
from bertology.interventions.target_loss import SourceTargets, TargetLossTask
from bertology.interventions.task import Inputs
from bertology.models.heads import head_columns


@dataclass(frozen=True)
class CleanOutputs:
    """A :class:`~bertology.interventions.replacement.HeadReplacement` that gives every head its output on
    the clean pairs of the same rows (``clean``'s)."""

    clean: TargetLossTask
    kind: str = "patch"
    description: str = "A patched head's output is its output on the clean source (denoising)."

    def __call__(self, inputs: Inputs, rows: np.ndarray) -> list[torch.Tensor]:
        return record_head_outputs(self.clean.loaded, self.clean.inputs_of(rows))


@dataclass
class TargetPatching:
    """Every head's patching effect on the target's loss.

    loss_clean, loss_corrupted: ``L`` of the clean and the corrupted pairs (nats per target token).
    loss_patched: [gate rows, heads] ``L`` of the corrupted pairs with that head patched (NaN for heads not
    patched). stacks: each gate row's ``(stack, layer)``. tokens: target tokens averaged over.
    """

    loss_clean: float
    loss_corrupted: float
    loss_patched: np.ndarray
    stacks: list[tuple[str, int]]
    tokens: int

    @property
    def effect(self) -> np.ndarray:
        """[gate rows, heads] ``(L_patched - L_corrupted) / (L_clean - L_corrupted)``."""
        return (self.loss_patched - self.loss_corrupted) / (self.loss_clean - self.loss_corrupted)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``stack``, ``layer``, ``head`` (0-based), ``loss`` (patched) and ``effect``."""
        return pd.DataFrame(
            {
                **head_columns(*self.loss_patched.shape, self.stacks),
                "loss": self.loss_patched.ravel(),
                "effect": self.effect.ravel(),
            }
        )


def _require_matching(clean: SourceTargets, corrupted: SourceTargets) -> None:
    if len(clean) != len(corrupted):
        raise BertologyError(f"There are {len(clean)} clean pairs but {len(corrupted)} corrupted ones.")
    for index, (a, b) in enumerate(zip(clean.sources, corrupted.sources, strict=True)):
        if len(a) != len(b):
            raise BertologyError(
                f"Pair {index}'s clean source has {len(a)} tokens and its corrupted one {len(b)}: a head's "
                "output is patched position by position, so they need the same number."
            )
    for index, (a, b) in enumerate(zip(clean.labels, corrupted.labels, strict=True)):
        if not np.array_equal(a, b):
            raise BertologyError(f"Pair {index}'s clean and corrupted targets differ; give them one target.")


def patch_target_loss(
    clean: TargetLossTask,
    corrupted: SourceTargets,
    *,
    heads: Sequence[Head] | None = None,
    batch_size: int = 8,
) -> TargetPatching:
    """Patch every head of ``clean``'s encoder-decoder (``heads``: only those ``(gate row, head)``), in
    turn, from the clean pairs into the corrupted ones (``corrupted``: the same targets, each source of its
    clean one's token count) and measure the target's loss (see the module docstring).

    Raises:
        BertologyError: pairs that do not match.
    """
    _require_matching(clean.data, corrupted)
    task = TargetLossTask(clean.loaded, corrupted)
    loaded = clean.loaded
    sweep = list(np.ndindex(loaded.gate_layers, loaded.num_heads)) if heads is None else list(heads)
    baseline, patched = sweep_outputs(
        task, task.parts, heads=sweep, batch_size=batch_size, replacement=CleanOutputs(clean)
    )
    losses = np.full((loaded.gate_layers, loaded.num_heads), np.nan)
    for (row, head), parts in zip(sweep, patched, strict=True):
        losses[row, head] = task.ratio(parts)
    stacks = row_stacks(loaded)
    assert stacks is not None, "a TargetLossTask's model is an encoder-decoder"
    return TargetPatching(
        clean.evaluate(batch_size=batch_size), task.ratio(baseline), losses, stacks, int(baseline[:, 1].sum())
    )
