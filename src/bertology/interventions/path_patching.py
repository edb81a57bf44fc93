"""Path patching (Wang et al. 2022, "Interpretability in the Wild", Section 3.1 and Appendix B): the effect of
sender heads on the logits only through chosen receiver heads' queries, keys or values.

Wang et al. measure a direct path from a sender to a set of receivers by running ``x_orig`` with the
sender's output taken from ``x_new``, every other head frozen at its ``x_orig`` value, recording the
receivers' inputs, and running ``x_orig`` once more with only those inputs patched (their Appendix B).
ARENA's IOI exercises (``get_path_patch_head_to_heads``) define it in TransformerLens as "path patching
(see algorithm in appendix B of IOI paper), with: sender head = (each head, looped through, one at a
time), receiver node = input to a later head (or set of heads)", the receiver node a set of heads'
``hook_q``, ``hook_k`` or ``hook_v``, and the result a layer x head grid of the metric, one cell per
sender (:func:`path_patch_each`; their grid also holds senders between the receivers' first and last
layer, which reach only the later receivers: here every sender is before every receiver). Their
``x_orig`` is the clean input and ``x_new`` the corrupted one: bertology's ``direction="noising"``. With
``x_target`` the run that is patched and frozen and ``x_source`` the run the senders are taken from
(denoising, the default: the corrupted and the clean input; noising: the reverse):

1. Run ``x_source`` and ``x_target`` and keep every head's output (its slice of the input of the layer's
   output projection, :mod:`bertology.interventions.gates`' point).
2. Run ``x_target`` with every head's output frozen at its ``x_target`` value except the senders', which
   take their ``x_source`` value; the MLPs, norms and residual stream are recomputed.
3. In that run, keep each receiver's query, key or value (the output of the query, key or value
   projection for that head, before any rotary embedding: TransformerLens's ``hook_q``/``hook_k``/
   ``hook_v``).
4. Run ``x_target`` again with only the receivers' queries, keys or values replaced by those of step 3
   (at every position, or at the receiver's one position: Wang et al. patch the name movers' queries at
   the END token only, ``23-3:q@-1``); nothing else is patched or frozen.
5. Read ``LD`` of that run (or the metric chosen: :mod:`bertology.interventions.patching_metrics`).

The effect is normalised as activation patching's (:mod:`bertology.interventions.patching`). With
grouped-query attention a receiver's key or value is its key/value head's, shared by the query heads of its
group: replacing it changes what all of them read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.interventions.curves import Head
from bertology.interventions.data import eval_mode
from bertology.interventions.partial import tiled
from bertology.interventions.patching import GroupRuns, check_options, load_pairs, roles, run_group
from bertology.interventions.patching_pairs import PairGroup, PatchPair
from bertology.models.anatomy import attention_parts
from bertology.models.heads import head_name
from bertology.models.loading import LoadedModel, require_single_stack
from bertology.models.sites import Replacement, recording, replacing
from bertology.options import PatchDirection, PatchMetric
from bertology.progress import Progress

Input = Literal["q", "k", "v"]


class Receiver(NamedTuple):
    """A receiver: head ``head`` of layer ``layer`` (0-based), which of its inputs (``q``, ``k``, ``v``), and
    the one text position patched (negative: counted from the text's end, ``-1`` its last token) or
    ``None``: every position. A plain ``(layer, head, which)`` tuple is read as every position."""

    layer: int
    head: int
    which: Input
    position: int | None = None

    @property
    def name(self) -> str:
        """``"23-3:q"``, or with a position ``"23-3:q@-1"``."""
        at = "" if self.position is None else f"@{self.position}"
        return f"{head_name(self.layer, self.head)}:{self.which}{at}"


def _normalised(
    ld_patched: np.ndarray, ld_clean: np.ndarray, ld_corrupted: np.ndarray, direction: str
) -> np.ndarray:
    """``(mean LD_patched - mean LD_target) / (mean LD_clean - mean LD_corrupted)`` over the last axis of
    ``ld_patched`` ([..., pairs])."""
    target = ld_corrupted if direction == "denoising" else ld_clean
    return (ld_patched.mean(-1) - target.mean()) / (ld_clean.mean() - ld_corrupted.mean())


@dataclass
class _PathRuns:
    """What every path patching run gives: ``LD`` (the ``metric``'s value) of every pair, clean and
    corrupted ([pairs]), and with the senders' path through the receivers patched (``ld_patched``)."""

    senders: list[Head]
    receivers: list[Receiver]
    direction: PatchDirection
    ld_clean: np.ndarray
    ld_corrupted: np.ndarray
    ld_patched: np.ndarray
    metric: PatchMetric = "logit-diff"

    def _effects(self) -> np.ndarray:
        """``(mean LD_patched - mean LD_target) / (mean LD_clean - mean LD_corrupted)``, per row of
        ``ld_patched``."""
        return _normalised(self.ld_patched, self.ld_clean, self.ld_corrupted, self.direction)


@dataclass
class PathPatching(_PathRuns):
    """Path patching of all ``senders`` together: ``ld_patched`` [pairs], and the normalised ``effect`` of
    that path."""

    @property
    def effect(self) -> float:
        """``(mean LD_patched - mean LD_target) / (mean LD_clean - mean LD_corrupted)``."""
        return float(self._effects())


@dataclass
class PathPatchingSweep(_PathRuns):
    """Path patching with each of ``senders`` alone: ``ld_patched`` [senders, pairs] (row ``i``: sender
    ``senders[i]``'s path through all of ``receivers``), ``ld_clean`` and ``ld_corrupted`` [pairs]; the
    model's ``layers`` and ``heads`` shape :attr:`grid`."""

    layers: int = field(kw_only=True)
    heads: int = field(kw_only=True)

    @property
    def effect(self) -> np.ndarray:
        """[senders] each sender's normalised effect (as :attr:`PathPatching.effect`)."""
        return self._effects()

    @property
    def grid(self) -> np.ndarray:
        """[layers, heads] each sender's effect at its head, NaN for the heads not swept."""
        grid = np.full((self.layers, self.heads), np.nan)
        for (layer, head), effect in zip(self.senders, self.effect, strict=True):
            grid[layer, head] = effect
        return grid


def _receivers(receivers: Sequence[Receiver | tuple]) -> list[Receiver]:
    return [Receiver(*receiver) for receiver in receivers]


def check_receivers_after_senders(senders: Sequence[Head], receivers: Sequence[Receiver | tuple]) -> None:
    """Refuse a receiver in the layer of a sender or before it: no sender's output reaches it, so its path
    effect would be exactly 0. Needs no model (the command line asks before loading one).

    Raises:
        BertologyError: as said.
    """
    if not senders:
        return
    last = max(layer for layer, _ in senders)
    for receiver in _receivers(receivers):
        if receiver.layer <= last:
            raise BertologyError(
                f"Receiver {receiver.name} is in layer {receiver.layer}, not after every sender (the last in "
                f"layer {last}), so no sender's output can reach it; choose receivers in layers after {last}."
            )


def _check_heads(loaded: LoadedModel, senders: Sequence[Head], receivers: Sequence[Receiver]) -> None:
    require_single_stack(loaded, "Path patching")
    if not senders or not receivers:
        raise BertologyError("Path patching needs at least one sender head and one receiver.")
    for layer, head, *_ in (*senders, *receivers):
        if not (0 <= layer < loaded.num_layers and 0 <= head < loaded.num_heads):
            raise BertologyError(
                f"Head {head_name(layer, head)} is not in {loaded.name} ({loaded.num_layers} layers of "
                f"{loaded.num_heads} heads, 0-based)."
            )
    for receiver in receivers:
        if receiver.which not in ("q", "k", "v"):
            raise BertologyError(f"A receiver's input is q, k or v, not {receiver.which!r}.")
    check_receivers_after_senders(senders, receivers)


def senders_before(receivers: Sequence[Receiver | tuple], heads: int) -> list[Head]:
    """Every head (of ``heads`` a layer) in the layers before the first receiver's: the senders of a sweep
    whose senders are not named."""
    first = min(receiver.layer for receiver in _receivers(receivers))
    return [(layer, head) for layer in range(first) for head in range(heads)]


def _position(receiver: Receiver, group: PairGroup) -> slice:
    """The positions of ``group``'s input rows where ``receiver`` is patched.

    Raises:
        BertologyError: a position outside the group's texts.
    """
    if receiver.position is None:
        return slice(None)
    tokens = group.prompt_tokens
    if not -tokens <= receiver.position < tokens:
        raise BertologyError(
            f"Receiver {receiver.name} names position {receiver.position}, outside the {tokens} tokens of "
            f"the texts of line {int(group.rows[0]) + 1}'s pair (0-based, or negative from the end)."
        )
    at = receiver.position % tokens
    return slice(at, at + 1)


def _frozen_heads(
    loaded: LoadedModel, runs: GroupRuns, sender_sets: Sequence[Sequence[Head]], source: str, target: str
) -> dict[tuple[str, int], Replacement]:
    """Per layer, what freezes every head's output at the ``target`` run but the senders', which take the
    ``source`` run's: copy ``k`` of a batch of ``len(sender_sets)`` copies of the group with the senders
    ``sender_sets[k]``."""
    values = []
    for layer, frozen in enumerate(runs.heads[target]):  # [rows, t, heads * head_dim]
        d = frozen.shape[-1] // loaded.num_heads
        copies = []
        for senders in sender_sets:
            copy = frozen.clone()
            for head in (head for sender_layer, head in senders if sender_layer == layer):
                copy[..., head * d : (head + 1) * d] = runs.heads[source][layer][
                    ..., head * d : (head + 1) * d
                ]
            copies.append(copy)
        values.append(torch.cat(copies))
    return {("z", layer): (lambda z, _layer, v=value: v.view(z.shape)) for layer, value in enumerate(values)}


def _putting(patches: list[tuple[int, slice, torch.Tensor]]) -> Replacement:
    """What puts ``value`` [b, t, head_dim] in the place of each ``(head, positions, value)`` of ``patches``
    of a per-head site, at ``positions``."""

    def put(tensor: torch.Tensor, _layer: int | None) -> torch.Tensor:
        patched = tensor.clone()
        for head, positions, value in patches:
            patched[:, positions, head] = value[:, positions]
        return patched

    return put


def _path_scores(
    loaded: LoadedModel,
    group: PairGroup,
    runs: GroupRuns,
    sender_sets: Sequence[Sequence[Head]],
    receivers: Sequence[Receiver],
    direction: PatchDirection,
) -> torch.Tensor:
    """[sender sets, b] ``LD`` of ``group`` with each sender set's path through ``receivers`` patched (the
    module docstring's steps 2 to 5), the sets side by side in one batch."""
    source, target = roles(direction)
    parts = attention_parts(loaded.model)
    copies = len(sender_sets)
    inputs = getattr(group, target)
    inputs = tiled(inputs, copies, inputs["input_ids"].shape[0])
    frozen = _frozen_heads(loaded, runs, sender_sets, source, target)
    kept = [(receiver.which, receiver.layer) for receiver in receivers]
    with replacing(loaded.model, frozen), recording(loaded.model, kept) as cache:
        loaded.model(**inputs)
    patches: dict[tuple[str, int], list[tuple[int, slice, torch.Tensor]]] = {}
    for receiver in receivers:
        # the query head itself, or the key/value head it shares (grouped-query attention)
        slot = receiver.head if receiver.which == "q" else receiver.head // parts[receiver.layer].groups
        kept = cache[receiver.which, receiver.layer][:, :, slot]
        patches.setdefault((receiver.which, receiver.layer), []).append(
            (slot, _position(receiver, group), kept)
        )
    with replacing(loaded.model, {site: _putting(values) for site, values in patches.items()}):
        logits = loaded.model(**inputs).logits
    return runs.score(logits, copies).unflatten(0, (copies, len(group.rows)))


def _sweep(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    sender_sets: Sequence[Sequence[Head]],
    receivers: Sequence[Receiver],
    direction: PatchDirection,
    metric: PatchMetric,
    prepend_bos: bool,
    sets_per_pass: int,
    on_progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``LD`` clean and corrupted [pairs] and patched [sender sets, pairs] of path patching each of
    ``sender_sets`` (checked) through ``receivers``, ``sets_per_pass`` sets side by side in a pass;
    ``on_progress`` told the sets done out of sets x groups of pairs of one token count."""
    check_options(loaded, direction, "head", "exact", metric)
    _, encoded = load_pairs(loaded, pairs, prepend_bos)
    ld = {run: np.zeros(len(encoded)) for run in ("clean", "corrupted")}
    patched = np.zeros((len(sender_sets), len(encoded)))
    for group in encoded.groups:
        for receiver in receivers:
            _position(receiver, group)
    done, total = 0, len(sender_sets) * len(encoded.groups)
    with torch.no_grad(), eval_mode(loaded):
        for group in encoded.groups:
            runs = run_group(loaded, group, metric=metric)
            for run in ld:
                ld[run][group.rows] = runs.ld[run].cpu().double().numpy()
            for start in range(0, len(sender_sets), sets_per_pass):
                chosen = sender_sets[start : start + sets_per_pass]
                scores = _path_scores(loaded, group, runs, chosen, receivers, direction)
                patched[start : start + len(chosen), group.rows] = scores.cpu().double().numpy()
                done += len(chosen)
                if on_progress is not None:
                    on_progress(done, total)
    return ld["clean"], ld["corrupted"], patched


def path_patch(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    senders: Sequence[Head],
    receivers: Sequence[Receiver | tuple],
    *,
    direction: PatchDirection = "denoising",
    metric: PatchMetric = "logit-diff",
    prepend_bos: bool = False,
) -> PathPatching:
    """The effect of ``senders`` together on ``LD`` through ``receivers``' queries, keys or values only (each
    a :class:`Receiver` or a ``(layer, head, which)`` tuple), the rest of the model frozen at the target
    run (module docstring), on ``pairs`` (see :func:`~bertology.interventions.patching.patch`, and for
    ``metric`` and ``prepend_bos``). Several-token answers are appended to the texts, and the senders and
    the frozen heads act at their positions too.

    Raises:
        BertologyError: no sender or receiver, a head outside the model, a receiver not in a layer after
            every sender's, an input other than q, k, v, a receiver's position outside the texts, or pairs
            the model cannot read.
    """
    chosen = _receivers(receivers)
    _check_heads(loaded, senders, chosen)
    clean, corrupted, patched = _sweep(loaded, pairs, [senders], chosen, direction, metric, prepend_bos, 1)
    return PathPatching(list(senders), chosen, direction, clean, corrupted, patched[0], metric)


def path_patch_each(
    loaded: LoadedModel,
    pairs: Sequence[PatchPair] | str | Path,
    receivers: Sequence[Receiver | tuple],
    senders: Sequence[Head] | None = None,
    *,
    direction: PatchDirection = "denoising",
    metric: PatchMetric = "logit-diff",
    prepend_bos: bool = False,
    senders_per_pass: int = 16,
    on_progress: Progress | None = None,
) -> PathPatchingSweep:
    """Path patching with each of ``senders`` (by default every head in the layers before the first
    receiver's: :func:`senders_before`) alone as the sender, through all of ``receivers``: one effect per
    sender, a layer x head grid as Wang et al.'s figures and ARENA's ``get_path_patch_head_to_heads``
    give. Equal, sender by sender, to :func:`path_patch` with that one sender; ``senders_per_pass``
    senders run side by side in one batch. ``on_progress`` is told the senders done, out of senders x
    groups of pairs of one token count.

    Raises:
        BertologyError: as :func:`path_patch`.
    """
    chosen = _receivers(receivers)
    swept = list(senders) if senders is not None else senders_before(chosen, loaded.num_heads)
    if not swept and chosen and min(receiver.layer for receiver in chosen) == 0:
        raise BertologyError(
            "A receiver is in layer 0, so no head is before it to send; choose later receivers."
        )
    _check_heads(loaded, swept, chosen)
    sets = [[sender] for sender in swept]
    clean, corrupted, patched = _sweep(
        loaded, pairs, sets, chosen, direction, metric, prepend_bos, senders_per_pass, on_progress
    )
    return PathPatchingSweep(
        swept,
        chosen,
        direction,
        clean,
        corrupted,
        patched,
        metric,
        layers=loaded.num_layers,
        heads=loaded.num_heads,
    )
