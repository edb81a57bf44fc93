"""The command line: outputs on success, one clear sentence and a non-zero exit on user errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BERTOLOGY = [sys.executable, "-m", "bertology"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BERTOLOGY, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize("kind", ["head", "model", "neuron"])
def test_view_writes_a_self_contained_page(kind: str, tmp_path: Path) -> None:
    target = tmp_path / f"{kind}.html"
    result = run(
        "view",
        "I went to the store.",
        "At the store, I bought fresh strawberries.",
        "--view",
        kind,
        "-o",
        str(target),
    )
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
    args: list[str], env: dict[str, str], message: str
) -> None:
    result = run(*args, env=env)
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
def test_usage_errors_show_the_usage_and_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
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


def test_models_lists_architectures_and_default() -> None:
    result = run("models")
    assert result.returncode == 0
    for name in ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra", "all-MiniLM-L6-v2"):
        assert name in result.stdout
