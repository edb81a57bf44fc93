"""Where a model runs and in what precision: the one place that turns ``--device`` and ``--dtype`` into
torch's.

Devices are named as in :data:`bertology.options.DEVICE_FORMS`: ``auto`` picks a CUDA GPU when torch sees
one, else an Apple GPU (MPS) when there is one, else the CPU. Precisions are
:data:`bertology.options.DTYPES`; the weights and the forward pass take it, while every statistic is summed
in float64 whatever it is, on the model's device (:func:`float64_home`: the CPU for MPS), brought to the
host at the end of a run (:mod:`bertology.stats`).
"""

from __future__ import annotations

import torch

from bertology.errors import BertologyError
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, DEVICE_FORMS, DTYPES, Dtype, is_device_name

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def resolve_device(name: str | torch.device | None = DEFAULT_DEVICE) -> torch.device:
    """The torch device ``name`` stands for (``None``: ``auto``), checked to be present.

    Raises:
        BertologyError: a name of no known form, or a device this machine does not have.
    """
    if isinstance(name, torch.device):
        name = str(name)
    name = DEFAULT_DEVICE if name is None else name
    if not is_device_name(name):
        raise BertologyError(f"'{name}' is not a device; use one of {DEVICE_FORMS}.")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if _mps_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BertologyError(f"{name} is not available: this machine has no CUDA device.")
        if device.index is not None and device.index >= count:
            devices = "1 CUDA device" if count == 1 else f"{count} CUDA devices"
            raise BertologyError(
                f"{name} is not available: this machine has {devices} (cuda:0 to cuda:{count - 1})."
            )
    if device.type == "mps" and not _mps_available():
        raise BertologyError("mps is not available: this machine has no Apple GPU that torch can use.")
    return device


def resolve_dtype(name: Dtype | torch.dtype | None = DEFAULT_DTYPE) -> torch.dtype:
    """The torch dtype of a precision name (``None``: float32).

    Raises:
        BertologyError: a name that is not one of :data:`~bertology.options.DTYPES`.
    """
    if isinstance(name, torch.dtype):
        if name not in _TORCH_DTYPES.values():
            raise BertologyError(f"A model runs in one of {', '.join(DTYPES)}, not {name}.")
        return name
    dtype = _TORCH_DTYPES.get(DEFAULT_DTYPE if name is None else name)
    if dtype is None:
        raise BertologyError(f"'{name}' is not a precision; use one of {', '.join(DTYPES)}.")
    return dtype


def float64_home(device: torch.device) -> torch.device:
    """Where float64 sums over tensors on ``device`` are taken: the device itself, or the CPU for MPS, which
    has no float64."""
    return torch.device("cpu") if device.type == "mps" else device
