"""Per-layer signals of one optimizer step, for the training rules: gradient norms, weight-update norms
and activation saturation.

:class:`SignalRecorder` groups a model's trainable parameters by layer (``"embeddings"``, ``"layer 0"``,
..., ``"head"`` for the rest: pooler, classifier; ALBERT's shared layer is ``"layers (shared)"``) and, on
a watched step, measures (:class:`~bertology.training.rules.records.SignalRecord`):

- gradient norm: the L2 norm of the group's gradients, taken between ``backward`` and clipping;
- weight and update norm: the L2 norm of the group's weights before the optimizer step, and of the
  step's change (a copy of the weights is kept from before the step to after it);
- saturation: over the activation functions in the group, the fraction of saturated outputs: for tanh
  and sigmoid the outputs within 3 % of a bound (SageMaker Debugger's ``threshold_tanh`` 0.97 and
  ``threshold_sigmoid`` 0.03), for ReLU-like functions (ReLU, GELU, SiLU and the like) the units that
  are not positive for any token of the batch (dead units, as in SageMaker Debugger's DeadRelu).

Nothing is measured on the other steps; the activation functions' outputs are recorded
(:func:`bertology.models.sites.recording` of their module sites) for the watched step's forward pass only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from bertology.models.anatomy import layer_modules, shares_layers
from bertology.models.sites import SiteKey, recording
from bertology.training.rules.records import SignalRecord

#: Activation functions whose outputs are bounded, and the bounds.
_BOUNDED = {"Tanh": (-1.0, 1.0), "Sigmoid": (0.0, 1.0), "Hardtanh": (-1.0, 1.0), "Hardsigmoid": (0.0, 1.0)}
#: Share of the output range next to a bound that counts as saturated.
SATURATED_MARGIN = 0.03
#: Activation functions that gate at 0 (their class names; transformers' activations included).
_GATES = ("ReLU", "GELU", "SiLU", "Swish", "Mish", "QuickGELU", "FastGELU", "NewGELU", "ReLU6", "LeakyReLU")


def _is_gate(module: nn.Module) -> bool:
    name = type(module).__name__
    return any(name.startswith(gate) or name.endswith(gate + "Activation") for gate in _GATES)


def parameter_groups(model: nn.Module) -> tuple[list[str], list[int]]:
    """The group names and, for each of ``model.named_parameters()`` (in order), its group's index."""
    layers = layer_modules(model)  # type: ignore[arg-type]
    shared = shares_layers(model)  # type: ignore[arg-type]
    names = ["embeddings"] + (["layers (shared)"] if shared else [f"layer {i}" for i in range(len(layers))])
    names.append("head")
    owner: dict[int, int] = {}
    for index, layer in enumerate(layers):
        for parameter in layer.parameters():
            owner.setdefault(id(parameter), 1 if shared else index + 1)
    head = len(names) - 1
    return names, [owner.get(id(p), 0 if "embed" in name else head) for name, p in model.named_parameters()]


def activation_modules(model: nn.Module) -> list[tuple[str, nn.Module, int]]:
    """(path, module, group index into :func:`parameter_groups`' names) of each activation function
    module of ``model``: the bounded ones (tanh, sigmoid...) and those that gate at 0 (ReLU, GELU...)."""
    layers = layer_modules(model)  # type: ignore[arg-type]
    inside = {id(module): index for index, layer in enumerate(layers) for module in layer.modules()}
    shared = shares_layers(model)  # type: ignore[arg-type]
    head = 2 if shared else len(layers) + 1  # after "embeddings" and the layers
    found = []
    for name, module in model.named_modules():
        if type(module).__name__ in _BOUNDED or _is_gate(module):
            layer = inside.get(id(module))
            group = (1 if shared else layer + 1) if layer is not None else (0 if "embed" in name else head)
            found.append((name, module, group))
    return found


class SignalRecorder:
    """Measures a watched step of ``model``'s training (module docstring); call, in a step's order,
    :meth:`activations` (around the forward pass), :meth:`gradients` (after ``backward``, before
    clipping), :meth:`before_update` and :meth:`after_update` (around ``optimizer.step()``)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.groups, group_of = parameter_groups(model)
        self._parameters = [p for p in model.parameters()]
        self._index = torch.tensor(group_of)
        #: Per activation function's path: its group and, for a bounded one, its bounds.
        self._activations = {
            name: (group, _BOUNDED.get(type(module).__name__))
            for name, module, group in activation_modules(model)
        }
        self._saturated = np.zeros(len(self.groups))
        self._counted = np.zeros(len(self.groups))
        self._gradient_norm = np.zeros(len(self.groups))
        self._before: list[torch.Tensor] = []

    def _sums(self, values: list[torch.Tensor]) -> np.ndarray:
        """[G] sum per group of one value per parameter."""
        stacked = torch.stack([value.float() for value in values]).cpu() if values else torch.zeros(0)
        return (
            torch.zeros(len(self.groups)).index_add_(0, self._index[: len(values)], stacked).double().numpy()
        )

    @contextmanager
    def activations(self) -> Iterator[None]:
        """Count saturated activations during the block (the step's forward pass)."""
        self._saturated[:] = 0
        self._counted[:] = 0
        with recording(self.model, [("module", name) for name in self._activations], consume=self._count):
            yield

    @torch.no_grad()
    def _count(self, key: SiteKey, output: torch.Tensor) -> None:
        """Count the saturated outputs of one call of the activation function at path ``key[1]``."""
        group, bounds = self._activations[str(key[1])]
        if bounds is not None:
            low, high = bounds
            margin = SATURATED_MARGIN * (high - low)
            hits = ((output <= low + margin) | (output >= high - margin)).sum()
            total = output.numel()
        else:  # a unit is dead when it is not positive for any token of the batch
            alive = (output > 0).flatten(0, -2).any(0)
            hits, total = (~alive).sum(), alive.numel()
        self._saturated[group] += float(hits)
        self._counted[group] += total

    @torch.no_grad()
    def gradients(self) -> None:
        """Take the gradient norm of each group (parameters without a gradient count 0)."""
        squares = [
            p.new_zeros(()) if p.grad is None else torch.linalg.vector_norm(p.grad.float()).square()
            for p in self._parameters
        ]
        self._gradient_norm = np.sqrt(self._sums(squares))

    @torch.no_grad()
    def before_update(self) -> None:
        """Keep a copy of the weights before the optimizer step."""
        self._before = [p.detach().clone() for p in self._parameters]

    @torch.no_grad()
    def after_update(self, step: int, learning_rate: float) -> SignalRecord:
        """The step's :class:`SignalRecord` (weights now against the copy of :meth:`before_update`)."""
        weight = [torch.linalg.vector_norm(before.float()).square() for before in self._before]
        update = [
            torch.linalg.vector_norm((p.detach() - before).float()).square()
            for p, before in zip(self._parameters, self._before, strict=True)
        ]
        trainable = [p.numel() if p.requires_grad else 0 for p in self._parameters]
        self._before = []
        with np.errstate(invalid="ignore", divide="ignore"):
            saturation = np.where(self._counted > 0, self._saturated / np.maximum(self._counted, 1), np.nan)
        return SignalRecord(
            step=step,
            learning_rate=float(learning_rate),
            groups=tuple(self.groups),
            parameters=np.bincount(self._index.numpy(), trainable, len(self.groups)).astype(np.int64),
            gradient_norm=self._gradient_norm,
            weight_norm=np.sqrt(self._sums(weight)),
            update_norm=np.sqrt(self._sums(update)),
            saturation=saturation,
        )
