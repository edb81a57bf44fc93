"""What SageMaker Debugger's rules read of a watched step's tensors
(:class:`~bertology.training.rules.records.TensorRecord`), measured only when a selected rule reads it
(:func:`~bertology.training.rules.smdebug.records_read`):

- ``gradient`` / ``weight``: per parameter group, the mean absolute value, the share of zeros, the
  variance and the counts of NaN and infinite values of the gradients (after ``backward``, before
  clipping) and of the weights (before the optimizer step); ``gradient_spread``: the 95th minus the 5th
  percentile of each group's gradients (a selection over all of them, the costliest statistic);
- ``activations``: for each activation function module, each node's activity over the batch positions
  (tanh and sigmoid: the input strictly inside the SaturatedActivation rule's bounds; ReLU-like functions:
  the output above 0) and the variance of its inputs, recorded (:func:`bertology.models.sites.recording`
  of their module sites) for the watched step's forward pass only;
- ``tokens``: the counts of the token ids the word embeddings receive (their input, recorded the same way).

Sums stay on the model's device until :meth:`TensorRecorder.record` reads them (one transfer per record).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from bertology.models.sites import SiteKey, SiteRequest, recording
from bertology.training.rules.records import ActivationRecord, TensorRecord
from bertology.training.rules.smdebug import SaturatedActivation, records_read
from bertology.training.rules.watchdog import Rule
from bertology.training.signals import _is_gate, activation_modules, parameter_groups

#: Per-tensor sums, in this order, from which a group's statistics follow.
_SUMS = ("count", "abs", "zero", "nan", "inf", "sum", "squares")


def _kind(module: nn.Module) -> str | None:
    """``"tanh"``, ``"sigmoid"``, ``"relu"`` (functions that gate at 0) or None (other bounded ones)."""
    name = type(module).__name__
    return {"Tanh": "tanh", "Sigmoid": "sigmoid"}.get(name, "relu" if _is_gate(module) else None)


class TensorRecorder:
    """Measures ``reads`` (module docstring) at a watched step of ``model``'s training; call, in a step's
    order, :meth:`watching` (around the forward pass), :meth:`tensors` (after ``backward``, before
    clipping and the optimizer step) and :meth:`record`. ``tanh`` and ``sigmoid``: the bounds inside which
    such a node counts as active."""

    def __init__(
        self,
        model: nn.Module,
        reads: frozenset[str],
        tanh: tuple[float, float] = SaturatedActivation.threshold_tanh,
        sigmoid: tuple[float, float] = SaturatedActivation.threshold_sigmoid,
    ) -> None:
        self.model = model
        self.reads = reads
        self.bounds = {"tanh": tanh, "sigmoid": sigmoid}
        self.groups, group_of = parameter_groups(model)
        self._parameters = list(model.parameters())
        self._group_of = np.array(group_of)
        self._modules = [
            (name, module, group, kind)
            for name, module, group in activation_modules(model)
            if (kind := _kind(module)) is not None
        ]
        self._kinds = {name: kind for name, _, _, kind in self._modules}
        embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        #: The path of the word embeddings (whose input is the token ids), or None.
        self._embeddings = next(
            (name for name, module in model.named_modules() if module is embeddings), None
        )
        self._active: dict[str, torch.Tensor] = {}
        self._moments: dict[str, torch.Tensor] = {}
        self._tokens: list[torch.Tensor] = []
        self._stats: dict[str, torch.Tensor] = {}

    @classmethod
    def for_rules(cls, model: nn.Module, rules: Sequence[Rule]) -> TensorRecorder | None:
        """The recorder of what ``rules`` read (None: nothing beyond every run's records)."""
        reads = records_read(rules) - {"confusion"}
        if not reads:
            return None
        saturated = next(
            (rule for rule in rules if isinstance(rule, SaturatedActivation)), SaturatedActivation()
        )
        return cls(model, reads, saturated.threshold_tanh, saturated.threshold_sigmoid)

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Count the activations and the tokens during the block (the step's forward pass)."""
        self._active, self._moments, self._tokens = {}, {}, []
        sites: list[SiteRequest] = []
        if "activations" in self.reads:
            sites += [("module_input", name) for name in self._kinds]
            sites += [("module", name) for name, kind in self._kinds.items() if kind == "relu"]
        if "tokens" in self.reads and self._embeddings is not None:
            sites.append(("module_input", self._embeddings))
        with recording(self.model, sites, consume=self._take):
            yield

    @torch.no_grad()
    def _take(self, key: SiteKey, tensor: torch.Tensor) -> None:
        """One call's tensor: the word embeddings' input (token ids), an activation function's input (its
        moments; for tanh and sigmoid, which nodes are active) or a ReLU-like function's output (which
        nodes are active)."""
        site, name = key[0], str(key[1])
        if name == self._embeddings:
            self._tokens.append(tensor.flatten())
            return
        if site == "module":
            self._add_active(name, tensor > 0)
            return
        x = tensor.float()
        if self._kinds[name] != "relu":
            low, high = self.bounds[self._kinds[name]]
            self._add_active(name, (x > low) & (x < high))
        moments = torch.stack(
            [x.new_tensor(x.numel() / x.shape[-1]), x.new_tensor(x.numel()), x.sum(), x.square().sum()]
        )
        self._moments[name] = self._moments[name] + moments if name in self._moments else moments

    def _add_active(self, name: str, active: torch.Tensor) -> None:
        counts = active.flatten(0, -2).sum(0).float()  # [nodes]
        self._active[name] = self._active[name] + counts if name in self._active else counts

    @torch.no_grad()
    def tensors(self) -> None:
        """Take the gradients' and weights' sums (and the gradients' percentiles) of each parameter."""
        self._stats = {}
        if "gradient" in self.reads or "gradient_spread" in self.reads:
            self._stats["gradient"] = self._tensor_sums([p.grad for p in self._parameters])
        if "weight" in self.reads:
            self._stats["weight"] = self._tensor_sums(
                [p.detach() if p.requires_grad else None for p in self._parameters]
            )
        if "gradient_spread" in self.reads:
            self._stats["spread"] = self._spreads()

    def _tensor_sums(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """[P, len(_SUMS)] sums of each tensor (rows of zeros for None)."""
        rows = []
        for tensor in tensors:
            if tensor is None:
                rows.append(torch.zeros(len(_SUMS), device=self._parameters[0].device))
                continue
            t = tensor.float()
            finite = torch.where(torch.isfinite(t), t, torch.zeros((), device=t.device))
            counted = [(t == 0).sum(), torch.isnan(t).sum(), torch.isinf(t).sum()]
            sums = [t.new_tensor(t.numel()), t.abs().sum(), *(c.float() for c in counted)]
            rows.append(torch.stack([*sums, finite.sum(), finite.square().sum()]))
        return torch.stack(rows)

    def _spreads(self) -> torch.Tensor:
        """[G] the 95th minus the 5th percentile of each group's gradients (NaN: no gradient)."""
        spreads = []
        for group in range(len(self.groups)):
            grads = [
                p.grad.flatten().float()
                for p, g in zip(self._parameters, self._group_of, strict=True)
                if g == group and p.grad is not None
            ]
            if not grads:
                spreads.append(torch.tensor(float("nan")))
                continue
            values = torch.cat(grads)
            low = values.kthvalue(max(1, round(0.05 * values.numel()))).values
            high = values.kthvalue(max(1, round(0.95 * values.numel()))).values
            spreads.append((high - low).cpu())
        return torch.stack(spreads)

    def _group_statistics(self, sums: np.ndarray) -> dict[str, np.ndarray]:
        """Per-group statistics from the [P, len(_SUMS)] per-tensor sums."""
        totals = np.zeros((len(self.groups), len(_SUMS)))
        np.add.at(totals, self._group_of, sums)
        count, absolute, zero, nan, inf, total, squares = totals.T
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(count > 0, total / count, np.nan)
            stats = {
                "abs_mean": np.where(count > 0, absolute / count, np.nan),
                "zero_fraction": np.where(count > 0, zero / count, np.nan),
                "variance": np.where(count > 0, np.maximum(squares / count - mean**2, 0.0), np.nan),
                "nan": np.where(count > 0, nan, np.nan),
                "inf": np.where(count > 0, inf, np.nan),
            }
        return stats

    def record(self, step: int) -> TensorRecord:
        """The step's :class:`TensorRecord` (optimizer step ``step``, 1-based)."""
        gradient = weight = {}
        if "gradient" in self._stats:
            gradient = self._group_statistics(self._stats["gradient"].double().cpu().numpy())
        if "weight" in self._stats:
            weight = self._group_statistics(self._stats["weight"].double().cpu().numpy())
        if "spread" in self._stats:
            gradient = gradient | {"spread": self._stats["spread"].double().numpy()}
        activations = []
        for name, module, group, kind in self._modules:
            if name not in self._active:
                continue
            positions, count, total, squares = self._moments[name].double().cpu().numpy()
            mean = total / count
            activity = self._active[name].double().cpu().numpy() / positions
            variance = float(squares / count - mean**2)
            activations.append(
                ActivationRecord(name, self.groups[group], kind, type(module).__name__, activity, variance)
            )
        counts: dict[int, int] = {}
        tokens = 0
        if self._tokens:
            ids, occurrences = torch.unique(torch.cat(self._tokens), return_counts=True)
            counts = {int(i): int(n) for i, n in zip(ids.tolist(), occurrences.tolist(), strict=True)}
            tokens = int(occurrences.sum())
        return TensorRecord(step, tuple(self.groups), gradient, weight, tuple(activations), counts, tokens)
