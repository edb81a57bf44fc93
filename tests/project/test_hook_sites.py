"""Hooks are registered in one place: :mod:`bertology.models.sites` (``recording`` and ``replacing``).

The files below still register their own and are to move onto the sites (issue 42, item 2); the list
must shrink, never grow: a file that stops registering hooks must leave it, and no other file may start.
"""

from __future__ import annotations

from support.ci_rules import REPOSITORY

SOURCE = REPOSITORY / "src" / "bertology"
#: The one module that registers hooks.
SITES = "models/sites.py"
#: Not moved onto the sites yet: persistent hooks put on at loading (attention capture, gates, pruned
#: heads), partial runs' layer arguments, gradients taken at a hooked tensor, training recorders of any
#: module by name.
NOT_YET_MOVED = {
    "attention/norms.py",
    "interventions/partial.py",
    "models/hook.py",
    "models/module_capture.py",
    "models/surgery.py",
    "training/signals.py",
    "training/tensor_recorder.py",
}


def test_only_the_sites_module_registers_hooks() -> None:
    registering = {
        path.relative_to(SOURCE).as_posix()
        for path in SOURCE.rglob("*.py")
        if "register_forward" in path.read_text(encoding="utf-8")
    }
    assert SITES in registering
    assert registering - {SITES} == NOT_YET_MOVED
