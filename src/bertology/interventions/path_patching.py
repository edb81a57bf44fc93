"""Path patching (Wang et al. 2022, "Interpretability in the Wild", Section 3.1 and Appendix B): the effect of
sender heads on the logits only through chosen receiver heads' queries, keys or values.

With ``x_target`` the run that is patched and ``x_source`` the run the senders are taken from
(denoising, the default: the corrupted and the clean input; noising: the reverse), the five steps of the
paper as TransformerLens's path-patching practice (ARENA's IOI exercises) writes them:

1. Run ``x_source`` and ``x_target`` and keep every head's output (its slice of the input of the layer's
   output projection, :mod:`bertology.interventions.gates`' point).
2. Run ``x_target`` with every head's output frozen at its ``x_target`` value except the senders', which
   take their ``x_source`` value; the MLPs, norms and residual stream are recomputed.
3. In that run, keep each receiver's query, key or value (the output of the query, key or value
   projection for that head, before any rotary embedding: TransformerLens's ``hook_q``/``hook_k``/
   ``hook_v``).
4. Run ``x_target`` again with only the receivers' queries, keys or values replaced by those of step 3;
   nothing else is patched or frozen.
5. Read ``LD`` of that run (or the metric chosen: :mod:`bertology.interventions.patching_metrics`).

The effect is normalised as activation patching's (:mod:`bertology.interventions.patching`). With
grouped-query attention a receiver's key or value is its key/value head's, shared by the query heads of its
group: replacing it changes what all of them read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.interventions.curves import Head
from bertology.interventions.data import eval_mode
from bertology.interventions.patching import (
    check_options,
    load_pairs,
    roles,
    run_group,
)
from bertology.interventions.patching_pairs import PatchPair
from bertology.models.anatomy import AttentionParts, attention_parts
from bertology.models.heads import head_name
from bertology.models.loading import LoadedModel
from bertology.models.sites import Replacement, recording, replacing
from bertology.options import PatchDirection, PatchMetric

Input = Literal["q", "k", "v"]
#: A receiver: (layer, head, which of its inputs).
Receiver = tuple[int, int, Input]


@dataclass
class PathPatching:
    """``LD`` (the ``metric``'s value) of every pair, clean, corrupted and with the senders' path through
    the receivers patched (each [pairs]), and the normalised ``effect`` of that path."""

    senders: list[Head]
    receivers: list[Receiver]
    direction: PatchDirection
    ld_clean: np.ndarray
    ld_corrupted: np.ndarray
    ld_patched: np.ndarray
    metric: PatchMetric = "logit-diff"

    @property
    def effect(self) -> float:
        """``(mean LD_patched - mean LD_target) / (mean LD_clean - mean LD_corrupted)``."""
        target = self.ld_corrupted if self.direction == "denoising" else self.ld_clean
        gap = self.ld_clean.mean() - self.ld_corrupted.mean()
        return float((self.ld_patched.mean() - target.mean()) / gap)


def _slot(parts: AttentionParts, head: int, which: Input) -> int:
    """The head of site ``which`` (q, k or v) that computes ``head``'s input: its own query head, or the
    key/value head it shares (grouped-query attention)."""
    return head if which == "q" else head // parts.groups


def check_receivers_after_senders(senders: Sequence[Head], receivers: Sequence[Receiver]) -> None:
    """Refuse a receiver in the layer of a sender or before it: no sender's output reaches it, so its path
    effect would be exactly 0. Needs no model (the command line asks before loading one).

    Raises:
        BertologyError: as said.
    """
    if not senders:
        return
    last = max(layer for layer, _ in senders)
    for layer, head, which in receivers:
        if layer <= last:
            raise BertologyError(
                f"Receiver {head_name(layer, head)}:{which} is in layer {layer}, not after every sender (the "
                f"last in layer {last}), so no sender's output can reach it; choose receivers in layers "
                f"after {last}."
            )


def _check_heads(loaded: LoadedModel, senders: Sequence[Head], receivers: Sequence[Receiver]) -> None:
    if not senders or not receivers:
        raise BertologyError("Path patching needs at least one sender head and one receiver.")
    for layer, head, *_ in (*senders, *receivers):
        if not (0 <= layer < loaded.num_layers and 0 <= head < loaded.num_heads):
            raise BertologyError(
                f"Head {head_name(layer, head)} is not in {loaded.name} ({loaded.num_layers} layers of "
                f"{loaded.num_heads} heads, 0-based)."
            )
    for receiver in receivers:
        if receiver[2] not in ("q", "k", "v"):
            raise BertologyError(f"A receiver's input is q, k or v, not {receiver[2]!r}.")
    check_receivers_after_senders(senders, receivers)


@contextmanager
def _frozen_heads(
    loaded: LoadedModel, frozen: list[torch.Tensor], senders: Sequence[Head], source: list[torch.Tensor]
) -> Iterator[None]:
    """Inside the block every head's output is ``frozen`` (per layer [b, t, heads * head_dim]) but the
    senders', which are ``source``'s."""
    values = [layer.clone() for layer in frozen]
    for layer, head in senders:
        d = values[layer].shape[-1] // loaded.num_heads
        values[layer][..., head * d : (head + 1) * d] = source[layer][..., head * d : (head + 1) * d]
    frozen_z = {
        ("z", layer): (lambda z, _layer, v=value: v.view(z.shape)) for layer, value in enumerate(values)
    }
    with replacing(loaded.model, frozen_z):
        yield


def _receiver_inputs(
    loaded: LoadedModel, inputs: dict[str, torch.Tensor], receivers: Sequence[Receiver]
) -> list[torch.Tensor]:
    """Per receiver, [b, t, head_dim] its query, key or value in one pass of ``inputs``."""
    parts = attention_parts(loaded.model)
    with recording(loaded.model, [(which, layer) for layer, _, which in receivers]) as cache:
        loaded.model(**inputs)
    return [cache[which, layer][:, :, _slot(parts[layer], head, which)] for layer, head, which in receivers]


def _putting(heads: list[tuple[int, torch.Tensor]]) -> Replacement:
    """What puts ``value`` [b, t, head_dim] in the place of each ``(head, value)`` of ``heads`` of a per-head
    site."""

    def put(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        patched = tensor.clone()
        for head, value in heads:
            patched[:, :, head] = value
        return patched

    return put


def path_patch(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    senders: Sequence[Head],
    receivers: Sequence[Receiver],
    *,
    direction: PatchDirection = "denoising",
    metric: PatchMetric = "logit-diff",
    prepend_bos: bool = False,
) -> PathPatching:
    """The effect of ``senders`` on ``LD`` through ``receivers``' queries, keys or values only, the rest of
    the model frozen at the target run (module docstring), on ``pairs`` (see
    :func:`~bertology.interventions.patching.patch`, and for ``metric`` and ``prepend_bos``). Several-token
    answers are appended to the texts, and the senders and the frozen heads act at their positions too.

    Raises:
        BertologyError: no sender or receiver, a head outside the model, a receiver not in a layer after
            every sender's, an input other than q, k, v, or pairs the model cannot read.
    """
    check_options(loaded, direction, "head", "exact", metric)
    _check_heads(loaded, senders, receivers)
    chosen, encoded = load_pairs(loaded, pairs, prepend_bos)
    source_run, target_run = roles(direction)
    parts = attention_parts(loaded.model)
    ld = {run: np.zeros(len(chosen)) for run in ("clean", "corrupted", "patched")}
    with torch.no_grad(), eval_mode(loaded):
        for group in encoded.groups:
            runs = run_group(loaded, group, metric=metric)
            target = getattr(group, target_run)
            frozen = _frozen_heads(loaded, runs.heads[target_run], senders, runs.heads[source_run])
            with frozen:
                kept = _receiver_inputs(loaded, target, receivers)
            heads: dict[tuple[str, int], list[tuple[int, torch.Tensor]]] = {}
            for (layer, head, which), value in zip(receivers, kept, strict=True):
                heads.setdefault((which, layer), []).append((_slot(parts[layer], head, which), value))
            with replacing(loaded.model, {key: _putting(values) for key, values in heads.items()}):
                logits = loaded.model(**target).logits
            ld["patched"][group.rows] = runs.score(logits).cpu().double().numpy()
            for run in ("clean", "corrupted"):
                ld[run][group.rows] = runs.ld[run].cpu().double().numpy()
    return PathPatching(
        list(senders), list(receivers), direction, ld["clean"], ld["corrupted"], ld["patched"], metric
    )
