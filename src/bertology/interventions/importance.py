"""Head importance scores of Michel et al. (2019), "Are Sixteen Heads Really Better than One?".

Each head gets a gate ``ξ_h`` (1 = as trained). Its importance is the expected magnitude of the loss's
sensitivity to the gate, over the examples ``x`` of a data set:

    I_h = E_x | ∂L(x) / ∂ξ_h |

with ``L(x)`` the task's loss of example ``x`` (:meth:`~bertology.interventions.task.Task.loss`): the
cross-entropy of the gold label for a classifier, the mean next-token cross-entropy of the sequence for a
language model. Each example has its own gates (``[batch, layers, heads]``),
so one backward pass of a batch gives every example's own gradient and the absolute value is taken per
example, as in the formula (the paper's released code takes it per batch). As in the paper, scores are
then normalised per layer by their L2 norm: ``I_h / ||I_layer||_2``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.interventions.curves import Head, lowest_first
from bertology.interventions.data import eval_mode
from bertology.interventions.gates import head_gates, row_stacks
from bertology.interventions.task import IMPORTANCE_BATCH, Task
from bertology.models.heads import head_columns
from bertology.progress import Progress


@dataclass
class HeadImportance:
    """Michel et al.'s importance of every head.

    raw: [layers, heads] mean over examples of |dL/dξ_h| (L in nats, ξ a unitless gate).
    examples: number of examples averaged over. stacks: an encoder-decoder's ``(stack, layer)`` of each row
    (its gate rows), else ``None``.
    """

    raw: np.ndarray
    examples: int
    stacks: list[tuple[str, int]] | None = None

    @property
    def normalized(self) -> np.ndarray:
        """[layers, heads] ``raw`` over the L2 norm of its layer's scores (0 where those are all 0)."""
        norms = np.linalg.norm(self.raw, axis=1, keepdims=True)
        return np.divide(self.raw, norms, out=np.zeros_like(self.raw), where=norms > 0)

    def removal_order(self) -> list[Head]:
        """Every head, least important (normalised) first."""
        return lowest_first(self.normalized)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based; an encoder-decoder's ``stack`` first),
        ``importance``, ``importance_normalized``."""
        return pd.DataFrame(
            {
                **head_columns(*self.raw.shape, self.stacks),
                "importance": self.raw.ravel(),
                "importance_normalized": self.normalized.ravel(),
            }
        )


def head_importance(
    task: Task,
    *,
    batch_size: int = IMPORTANCE_BATCH,
    on_progress: Progress | None = None,
) -> HeadImportance:
    """Importance of every head of ``task``'s model over its examples (see the module docstring).

    on_progress: told the examples done, out of ``len(task)``.
    """
    total = np.zeros((task.loaded.gate_layers, task.loaded.num_heads))
    done = 0
    for rows, batch_sum in importance_sums(task, batch_size=batch_size):
        total += batch_sum
        done += rows
        if on_progress is not None:
            on_progress(done, len(task))
    return HeadImportance(total / max(done, 1), done, row_stacks(task.loaded))


def importance_sums(task: Task, *, batch_size: int = IMPORTANCE_BATCH) -> Iterator[tuple[int, np.ndarray]]:
    """For each batch of consecutive examples of ``task``: its size and ``sum_x |dL(x)/dξ_h|``
    ([layers, heads] float64). Summed in order over the batches of any split of the examples into runs of
    whole batches, they give :func:`head_importance`'s sums exactly (:mod:`bertology.cluster.ablation`)."""
    loaded = task.loaded
    with torch.enable_grad(), eval_mode(loaded):
        for inputs, rows in task.batches(batch_size):
            shape = (len(rows), loaded.gate_layers, loaded.num_heads)
            gates = torch.ones(shape, device=loaded.device, requires_grad=True)
            with head_gates(loaded, gates):
                logits = loaded.model(**inputs).logits
            (gradient,) = torch.autograd.grad(task.loss(logits, inputs, rows), gates)
            yield len(rows), gradient.abs().sum(0).cpu().double().numpy()
