"""Hooks are registered in one place: :mod:`bertology.models.sites` (``hook_module``, on which ``hooking``,
``recording`` and ``replacing`` are built); every other module hooks a model through it (issue 42, item 2).
"""

from __future__ import annotations

from support.ci_rules import REPOSITORY

SOURCE = REPOSITORY / "src" / "bertology"
#: The one module that registers hooks.
SITES = "models/sites.py"
#: What registers a hook on a module in PyTorch (forward, pre-forward and backward hooks).
REGISTERING = ("register_forward", "register_full_backward", "register_backward_hook", "register_module_")


def test_only_the_sites_module_registers_hooks() -> None:
    registering = {
        path.relative_to(SOURCE).as_posix()
        for path in SOURCE.rglob("*.py")
        if any(call in path.read_text(encoding="utf-8") for call in REGISTERING)
    }
    assert registering == {SITES}
