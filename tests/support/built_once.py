"""Artefacts that many tests read, built once for the whole test run, whichever worker asks first."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` fills, built by the first test of this run to ask for it
    and then read by every other, on any pytest-xdist worker: the workers' temporary folders share one
    parent, where a lock keeps the others waiting until the first has built it. A failed build leaves
    nothing marked built, so the next test to ask tries again (and fails with the build's own error).

    Tests read the folder; a test that changes such an artefact works on its own copy
    (``shutil.copytree``)."""
    root = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / "built-once" / name
    built = folder.with_name(f"{name}.built")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(folder.with_name(f"{name}.lock")):
        if not built.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            built.touch()
    return folder
