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

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.errors import BertologyError
from bertology.interventions.ablation import sweep_outputs
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
    loss_patched: [gate rows, heads] ``L`` of the corrupted pairs with that head patched. stacks: each gate
    row's ``(stack, layer)``. tokens: target tokens averaged over.
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
    clean: TargetLossTask, corrupted: SourceTargets, *, batch_size: int = 8
) -> TargetPatching:
    """Patch every head of ``clean``'s encoder-decoder, in turn, from the clean pairs into the corrupted
    ones (``corrupted``: the same targets, each source of its clean one's token count) and measure the
    target's loss (see the module docstring).

    Raises:
        BertologyError: pairs that do not match.
    """
    _require_matching(clean.data, corrupted)
    task = TargetLossTask(clean.loaded, corrupted)
    baseline, patched = sweep_outputs(
        task, task.parts, batch_size=batch_size, replacement=CleanOutputs(clean), reuse_lower_layers=False
    )
    shape = (clean.loaded.gate_layers, clean.loaded.num_heads)
    losses = np.array([task.ratio(parts) for parts in patched]).reshape(shape)
    stacks = row_stacks(clean.loaded)
    assert stacks is not None, "a TargetLossTask's model is an encoder-decoder"
    return TargetPatching(
        clean.evaluate(batch_size=batch_size), task.ratio(baseline), losses, stacks, int(baseline[:, 1].sum())
    )
