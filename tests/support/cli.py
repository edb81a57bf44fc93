"""Running the command line inside the test process, as a user's shell would run it."""

from __future__ import annotations

import sys

import pytest

from bertology import cli


def run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``bertology ARGS`` through the console entry point in this process: (exit code, stderr)."""
    saved = sys.argv
    sys.argv = ["bertology", *args]
    try:
        cli.main()
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        sys.argv = saved
    return code, capsys.readouterr().err
