"""Every kind of run folder, written by the real commands into one runs folder, is listed by the web app
with the kind its writer marked it with; only the analysis gets the explorer (a GAP probe holds a
``heads.csv`` and a ``report.html`` too, and is still a probe)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support.cli import run_in_process

from bertology.files.run_files import KIND_FILE, TRAINING_FILE
from bertology.models.loading import LoadedModel
from bertology.server import create_app


@pytest.mark.slow
def test_each_kind_of_run_is_listed_with_its_true_kind(
    default_model: LoadedModel,
    shared_data: Path,
    tiny_classifier_run: Path,
    sample_corpus_head: Callable[[int], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each command on a small input (the kind marked does not depend on the numbers; the ablation on the
    tiny classifier)."""
    runs = tmp_path / "runs"
    corpus = sample_corpus_head(4)
    commands = {
        "analysis": ["analyze", str(corpus), "--limit", "4"],
        "gap": ["probe", "gap", str(shared_data / "gap" / "gap-development.tsv"), "--limit", "5"],
        "deps": ["probe", "deps", str(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"), "--limit", "10"],
        "comparison": ["compare", "default", "default", "--corpus", str(corpus), "--limit", "4"],
        "ablation": [
            "ablate", str(tiny_classifier_run), "--task", str(shared_data / "glue" / "SST-2"),
            "--max-dev", "6", "--attribution-examples", "0",
        ],
    }  # fmt: skip
    for folder, command in commands.items():
        code, stderr = run_in_process([*command, "-o", str(runs / folder)], capsys)
        assert code == 0, f"{folder}: {stderr}"
    (runs / "training").mkdir()
    (runs / "training" / TRAINING_FILE).write_text(json.dumps({"status": "finished"}), encoding="utf-8")
    (runs / "old").mkdir()
    (runs / "old" / "report.html").write_text("<title>a report from before the marks</title>")
    (runs / "old" / "heads.csv").write_text("layer,head\n0,0\n")

    gap_mark = json.loads((runs / "gap" / KIND_FILE).read_text(encoding="utf-8"))
    assert gap_mark["kind"] == "probe" and gap_mark["probe"] == "gap"
    assert (runs / "gap" / "heads.csv").is_file()  # the files that once made it look like an analysis
    with TestClient(create_app([default_model], runs=runs)) as client:
        answer = client.get("/api/runs").json()["runs"]
        listed = {run["path"]: (run["kind"], run["explore"]) for run in answer}
        assert listed == {
            "ablation": ("ablation", None),
            "analysis": ("analysis", "/explore?run=analysis"),
            "comparison": ("comparison", None),
            "deps": ("probe", None),
            "gap": ("probe", None),
            "old": ("report", None),
            "training": ("training", None),
        }
        assert client.post("/api/explore/analysis", json={"run": "analysis"}).status_code == 200
        refused = client.post("/api/explore/analysis", json={"run": "gap"})
        assert refused.status_code == 404 and "not an analysis folder" in refused.json()["error"]
