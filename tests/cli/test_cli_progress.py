"""Long commands show their progress on stderr: Rich's bars on a terminal, plain lines in a log (a
stderr that is no terminal, as here), one per stage started, each tenth of it and its end; and
``ablate`` says so, in the report and on stderr, when the classifier gives every example one label."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
import torch
from support.run_folders import write_tiny_task
from typer.testing import CliRunner

from bertology.cli import app
from bertology.corpus.encoding import encode
from bertology.models.classify import predict_logits
from bertology.models.loading import load_model

#: ablate's stages, in order (bertology.interventions.run.run_ablation).
ABLATE_STAGES = (
    "Ablating single heads",
    "Head importance",
    "Pruning curve by ablation",
    "Pruning curve by importance",
    "Attention gradients",
    "Pruning and timing",
)


def saved_classifier(model_dir: Path, folder: Path, separate: tuple[str, str] | None = None) -> Path:
    """A run folder as ``bertology finetune`` writes: the tiny model with a two-label head ("0", "1"). With
    ``separate`` (two texts) the head answers "1" for the first and "0" for the second (its weights: the
    difference of their pooled outputs, its threshold half-way); without, it has zero weights and a bias
    for "0", so every input gets "0"."""
    loaded = load_model(model_dir, classifier=True, labels=["0", "1"])
    weight, bias = torch.zeros(2, loaded.model.config.hidden_size), torch.tensor([2.0, -2.0])
    if separate is not None:
        encoded = encode(loaded.tokenizer, list(separate), max_length=loaded.max_length)
        with torch.inference_mode():
            pooled = loaded.model.bert(**loaded.model_inputs(encoded)).pooler_output
        direction = (pooled[0] - pooled[1]) / (pooled[0] - pooled[1]).norm() ** 2
        weight[1], bias = direction, torch.tensor([0.0, -float(direction @ (pooled[0] + pooled[1])) / 2])
    with torch.no_grad():
        loaded.model.classifier.weight.copy_(weight)
        loaded.model.classifier.bias.copy_(bias)
    loaded.model.save_pretrained(folder / "model")
    loaded.tokenizer.save_pretrained(folder / "model")
    return folder


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentiment task of 12 dev examples, labels "0" and "1"."""
    return write_tiny_task(tmp_path_factory.mktemp("task"), train_rows=12, dev_rows=12)


def ablate(classifier: Path, task: Path, output: Path, *options: str) -> tuple[str, str]:
    """``bertology ablate``'s (stdout, stderr); it must succeed."""
    arguments = ["ablate", str(classifier), "--task", str(task), "-o", str(output), *options]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.stderr or result.exception
    return result.stdout, result.stderr


@pytest.mark.slow
def test_ablate_shows_each_stage_as_lines_on_stderr(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    classifier = saved_classifier(tiny_model_dirs["bert"], tmp_path / "run")
    stdout, stderr = ablate(classifier, task, tmp_path / "out")
    lines = stderr.splitlines()
    for stage in ABLATE_STAGES:
        assert f"{stage}..." in lines, stderr
        assert any(re.fullmatch(rf"{stage}: [\d,]+/[\d,]+ \(100%\), \d+ s", line) for line in lines), stage
    starts = [lines.index(f"{stage}...") for stage in ABLATE_STAGES]
    assert starts == sorted(starts)
    # 12 dev examples x 12 heads = 144 example passes, a line each tenth
    sweep = [line for line in lines if line.startswith("Ablating single heads: ")]
    assert sweep[-1].startswith("Ablating single heads: 144/144 (100%)") and len(sweep) == 10
    assert "Dev accuracy" in stdout and "Ablating" not in stdout


@pytest.mark.slow
def test_constant_classifier_is_named_in_the_report_and_on_stderr(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    classifier = saved_classifier(tiny_model_dirs["bert"], tmp_path / "run")
    _, stderr = ablate(classifier, task, tmp_path / "out", "--prune", "0")
    said = " ".join(stderr.split())
    assert "Warning: The classifier predicts '0' for every one of the 12 dev examples" in said
    share = sum(line.endswith("\t0") for line in (task / "dev.tsv").read_text().splitlines()) / 12
    assert f"(accuracy {share:.4f}: the share of that label)" in said
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dev accuracy, all heads"] == round(share, 4)
    assert summary["warning"].startswith("The classifier predicts '0' for every one")
    report = html.unescape((tmp_path / "out" / "report.html").read_text())
    assert "<p class=\"warning\">Warning: The classifier predicts '0' for every one of the 12" in report


def test_a_classifier_with_two_answers_has_no_warning(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    first, second = [line.split("\t")[0] for line in (task / "dev.tsv").read_text().splitlines()[1:3]]
    classifier = saved_classifier(tiny_model_dirs["bert"], tmp_path / "run", (first, second))
    loaded = load_model(classifier, classifier=True)
    assert predict_logits(loaded, [first, second]).argmax(-1).tolist() == [1, 0]
    _, stderr = ablate(classifier, task, tmp_path / "out", "--prune", "0")
    assert "Warning" not in stderr
    assert "warning" not in json.loads((tmp_path / "out" / "summary.json").read_text())
    assert 'class="warning"' not in (tmp_path / "out" / "report.html").read_text()
