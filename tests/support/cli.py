"""Running the command line inside the test process, as a user's shell would run it."""

from __future__ import annotations

import os
import subprocess
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


def run_child(*args: str) -> subprocess.CompletedProcess[str]:
    """``bertology ARGS`` in a child process with this process's environment (at most 300 s): its exit
    code, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "bertology", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
