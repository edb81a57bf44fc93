"""Counting what a computation hands to the host, with a ``TorchFunctionMode``."""

from __future__ import annotations

from typing import Any

from torch.overrides import TorchFunctionMode


class HostTransfers(TorchFunctionMode):
    """Counts the tensor calls that hand values to the host: a CPU copy, a numpy array, a list or a Python
    number (on a GPU each is a device-to-host transfer and a synchronisation)."""

    NAMES = frozenset({"cpu", "numpy", "tolist", "item", "__int__", "__float__", "__bool__", "__index__"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))
