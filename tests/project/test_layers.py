"""The one-way flow of README.md's "How it works" holds: import-linter's contracts in pyproject.toml
(``[tool.importlinter]``) are kept by the package's real imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.ci_rules import REPOSITORY


def test_the_import_layers_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPOSITORY, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
