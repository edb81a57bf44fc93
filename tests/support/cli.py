"""Running the command line inside the test process, as a user's shell would run it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from bertology import cli
from bertology.errors import BertologyError


def run_command(args: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """``bertology ARGS`` through the console entry point in this process, as a user's shell would run it:
    its exit code, stdout and stderr as text, the shape of ``subprocess.run``'s answer (a child's start and
    imports cost seconds each, where a test needs no process of its own)."""
    capsys.readouterr()  # what the test printed before is not the command's
    saved = sys.argv
    sys.argv = ["bertology", *args]
    try:
        cli.main()
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    finally:
        sys.argv = saved
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["bertology", *args], code, out, err)


def run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """:func:`run_command`'s exit code and stderr."""
    result = run_command(args, capsys)
    return result.returncode, result.stderr


def invoke(*arguments: str) -> tuple[int, str]:
    """``bertology ARGUMENTS`` through typer's test runner: the exit code and the output, or 1 and the
    one-sentence message of a :class:`BertologyError` (which the entry point prints without a traceback);
    any other exception fails the test."""
    result = CliRunner().invoke(cli.app, list(arguments))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert isinstance(result.exception, BertologyError), result.exception
        return 1, str(result.exception)
    return result.exit_code, result.output


#: ``bertology ARGV[2:]`` in this child, SIGKILLed at the switch of its output folder
#: (bertology.files.swap): ARGV[1] "before" (everything staged, the target's other files linked in) or
#: "after" (the names exchanged, the old run not yet removed).
_KILLED_AT_SWITCH = """
import os, signal, sys
from bertology.files import swap

exchange, when = swap._renameat2, sys.argv[1]

def killed(*args):
    if when == "after":
        exchange(*args)
    os.kill(os.getpid(), signal.SIGKILL)

swap._renameat2 = killed
sys.argv = ["bertology", *sys.argv[2:]]
from bertology.cli import main
main()
"""


def run_child_killed_at_switch(when: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``bertology ARGS`` in a child process (this process's environment, at most 300 s) that is
    SIGKILLed at the switch of its output folder over an earlier one, ``when`` ``"before"`` or ``"after"``
    the names are exchanged."""
    return subprocess.run(
        [sys.executable, "-c", _KILLED_AT_SWITCH, when, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
