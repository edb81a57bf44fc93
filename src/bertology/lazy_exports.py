"""Package names imported on first use, so that importing a package (e.g. for ``bertology --help``) does
not import torch."""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.util import find_spec
from types import ModuleType
from typing import Any


class _LazyPackage(ModuleType):
    """A package whose public names (``_lazy_homes``: name -> submodule) and submodules are imported on
    first use. No public name is also the name of a submodule (importing a submodule sets the package
    attribute of its name, which would hide the public name; tests/cli/test_cli_inputs.py checks)."""

    _lazy_homes: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        home = self.__dict__.get("_lazy_homes", {}).get(name)
        if home is not None:
            return getattr(import_module(f"{self.__name__}.{home}"), name)
        if not name.startswith("__") and find_spec(f"{self.__name__}.{name}") is not None:
            return import_module(f"{self.__name__}.{name}")  # a submodule, as ``bertology.views``
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


def export_lazily(package: str, homes: dict[str, str]) -> None:
    """Give the package ``package`` (its ``__name__``) the names of ``homes`` (name -> submodule, relative
    to the package), each imported from its submodule when first used."""
    module = sys.modules[package]
    module.__dict__["_lazy_homes"] = dict(homes)
    module.__class__ = _LazyPackage
