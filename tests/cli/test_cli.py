"""The command line: outputs on success, one clear sentence and a non-zero exit on user errors. The commands
run in the test's process (``support.cli.run_command``) but where a fresh process is what is checked: an
environment read at import, the traceback of ``--debug``, a warning as the console prints it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run_command

BERTOLOGY = [sys.executable, "-m", "bertology"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``bertology ARGS`` in a child process, this process's environment updated by ``env``."""
    return subprocess.run(
        [*BERTOLOGY, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize("kind", ["head", "model", "neuron"])
def test_view_writes_a_self_contained_page(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / f"{kind}.html"
    texts = ["I went to the store.", "At the store, I bought fresh strawberries."]
    result = run_command(["view", *texts, "--view", kind, "-o", str(target)], capsys)
    assert result.returncode == 0, result.stderr
    assert f"Wrote the {kind} view of 19 tokens to {target}" in result.stdout
    page = target.read_text()
    assert page.count('<script type="application/json" id="bertology-data">') == 1
    assert "default-src 'none'" in page  # the page's CSP forbids every network request


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["view", "   "], {}, "Text 0 is empty or only whitespace"),
        (["view", "hi", "--model", "./no/such/dir"], {}, "There is no model directory at './no/such/dir'"),
        (
            ["view", "hi", "--model", "bert-base-uncased"],
            {"HF_HUB_OFFLINE": "1"},
            "the Hugging Face hub cannot be reached",
        ),
        (["view", "hi", "--layer", "6"], {}, "Layer 6 does not exist; there are 6 layers (0 to 5)."),
    ],
)
def test_user_errors_are_one_sentence_without_traceback(
    args: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE when it is imported: a fresh process for that case
    result = run(*args, env=env) if env else run_command(args, capsys)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("Error:") and result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["analyze", "corpus.txt", "--batch-size", "0", "-o", "out"], "greater than or equal to 1"),
        (["view", "hi", "--no-such-option"], "No such option"),
        (["view", "hi", "--view", "galaxy"], "'galaxy' is not one of 'head', 'model', 'neuron'"),
    ],
)
def test_usage_errors_show_the_usage_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_command(args, capsys)
    assert result.returncode == 2
    assert message in result.stderr and "Usage:" in result.stderr
    assert "Unexpected error" not in result.stderr and "Traceback" not in result.stderr


def test_debug_flag_shows_the_traceback() -> None:
    result = run("--debug", "view", "   ")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_truncation_warning_reaches_stderr(tmp_path: Path) -> None:
    result = run("view", " ".join(["word"] * 520), "-o", str(tmp_path / "long.html"))
    assert result.returncode == 0
    assert "Warning:" in result.stderr and "10 tokens were cut" in result.stderr


def test_models_lists_architectures_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_command(["models"], capsys)
    assert result.returncode == 0
    for name in ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra", "all-MiniLM-L6-v2"):
        assert name in result.stdout
