"""Fine-tuning: batching, settings, a repeatable run on a tiny model, and the default model end to end."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.cli import run_child_killed_at_switch
from support.run_folders import write_tiny_task

from bertology.corpus.readers.glue import read_glue
from bertology.errors import BertologyError, TruncationWarning
from bertology.models.classify import accuracy, predict_logits
from bertology.models.loading import load_model
from bertology.training import FinetuneSettings, finetune, read_archive
from bertology.training.loop import evaluate, length_batches

BERTOLOGY = [sys.executable, "-m", "bertology"]


def tiny_settings(model: Path, **changes: object) -> FinetuneSettings:
    options = dict(
        model=str(model), max_train=40, batch_size=8, epochs=2, max_length=32, learning_rate=1e-3,
        eval_every=None, log_every=1, watch_every=3, probe_set=2, threads=1,
    )  # fmt: skip
    return FinetuneSettings(**{**options, **changes})  # type: ignore[arg-type]


def test_length_batches_cover_every_example_once_sorted_within_buckets() -> None:
    lengths = np.random.default_rng(1).integers(3, 60, size=1000)
    batches = length_batches(lengths, 8, np.random.default_rng(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    assert all(len(batch) <= 8 for batch in batches)
    spreads = [np.ptp(lengths[batch]) for batch in batches]
    assert np.median(spreads) <= 2  # batches of similar lengths: little padding
    again = length_batches(lengths, 8, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epochs": 0}, "epochs must be at least 1"),
        ({"max_train": 0}, "max-train must be at least 1"),
        ({"watch_every": -1}, "watch-every must be 0"),
        ({"warmup": 1.0}, "warm-up fraction"),
    ],
)
def test_bad_settings_are_refused(changes: dict[str, object], message: str, tmp_path: Path) -> None:
    task = write_tiny_task(tmp_path / "task")
    with pytest.raises(BertologyError, match=message):
        finetune(task, tmp_path / "run", FinetuneSettings(**changes))  # type: ignore[arg-type]


def test_a_run_repeats_exactly_and_saves_a_loadable_classifier(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    task = write_tiny_task(tmp_path / "task")
    settings = tiny_settings(tiny_model_dirs["bert"])
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # not the run's 1 (a test worker computes on 1), so the check below can fail
    try:
        first = finetune(task, tmp_path / "one", settings)
        assert torch.get_num_threads() == 2  # the run's 1 thread was for the run only
    finally:
        torch.set_num_threads(threads)
    second = finetune(task, tmp_path / "two", settings)
    other = finetune(task, tmp_path / "three", tiny_settings(tiny_model_dirs["bert"], seed=1))

    def rows(run: Path) -> pd.DataFrame:
        return pd.read_csv(run / "metrics.csv").drop(columns="seconds")

    assert first.steps == 10  # 40 examples, batches of 8, 2 epochs
    pd.testing.assert_frame_equal(rows(first.run_dir), rows(second.run_dir))
    assert not rows(first.run_dir)["loss"].equals(rows(other.run_dir)["loss"])
    a, b = read_archive(first.run_dir), read_archive(second.run_dir)
    assert a.steps.tolist() == [0, 3, 6, 9, 10]
    np.testing.assert_array_equal(a.stats, b.stats)
    np.testing.assert_array_equal(a.attention(1), b.attention(1))

    run = json.loads((first.run_dir / "run.json").read_text())
    assert run["status"] == "finished"
    assert run["labels"] == ["0", "1"]
    assert run["steps"] == 10 and run["train_examples"] == 40 and run["dev_examples"] == 12
    assert run["settings"]["learning_rate"] == 1e-3
    dev = rows(first.run_dir).query("split == 'dev'")
    assert dev["step"].tolist() == [5, 10]  # each epoch's end
    assert dev["accuracy"].iloc[-1] == run["dev_accuracy"] == first.dev_accuracy

    loaded = load_model(first.run_dir, classifier=True)
    assert loaded.model.config.id2label == {0: "0", 1: "1"}
    tiny = read_glue(task)
    logits = predict_logits(loaded, tiny.dev.texts, batch_size=64, max_length=32)
    assert accuracy(logits, tiny.label_ids(tiny.dev)) == run["dev_accuracy"]

    with pytest.raises(BertologyError, match="already holds a training run"):
        finetune(task, first.run_dir, settings)
    unwatched = tiny_settings(tiny_model_dirs["bert"], epochs=1, watch_every=0)
    finetune(task, first.run_dir, unwatched, overwrite=True)
    assert not (first.run_dir / "monitor.zarr").exists()  # no stale archive from the run replaced


def test_a_folder_that_holds_no_run_is_never_emptied(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    task = write_tiny_task(tmp_path / "task")
    settings = tiny_settings(tiny_model_dirs["bert"], epochs=1, watch_every=0)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me", encoding="utf-8")
    (folder / "model").write_text("a file named model, not a run's", encoding="utf-8")
    for overwrite in (False, True):
        with pytest.raises(BertologyError, match=r"holds model but no run\.json"):
            finetune(task, folder, settings, overwrite=overwrite)
    assert sorted(path.name for path in folder.iterdir()) == ["model", "notes.txt"]
    assert (folder / "model").read_text(encoding="utf-8") == "a file named model, not a run's"
    (folder / "model").unlink()
    finetune(task, folder, settings)  # other files are fine, and left alone
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "keep me"
    assert (folder / "model" / "config.json").is_file()


def test_model_and_settings_are_checked_before_an_earlier_run_is_replaced(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    task = write_tiny_task(tmp_path / "task")
    run_dir = tmp_path / "run"
    finetune(task, run_dir, tiny_settings(tiny_model_dirs["bert"], epochs=1, watch_every=0))
    before = (run_dir / "run.json").read_text()
    for bad, message in (
        (tiny_settings(tmp_path / "no" / "model", epochs=1), "no model directory"),
        (tiny_settings(tiny_model_dirs["bert"], max_length=1), "max-len 1 leaves no room for text"),
    ):
        with pytest.raises(BertologyError, match=message):
            finetune(task, run_dir, bad, overwrite=True)
        assert (run_dir / "run.json").read_text() == before
        assert (run_dir / "model" / "config.json").is_file()


def test_dev_accuracy_with_logits_that_are_not_finite_is_undefined(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    task = read_glue(write_tiny_task(tmp_path / "task"))
    loaded = load_model(str(tiny_model_dirs["bert"]), classifier=True, labels=task.labels)
    labels = task.label_ids(task.dev)
    accuracy_now, _, _ = evaluate(loaded, task.dev, labels, 32)
    assert 0.0 <= accuracy_now <= 1.0
    with torch.no_grad():
        loaded.model.classifier.bias.fill_(math.nan)  # every logit becomes NaN
    logits = predict_logits(loaded, task.dev.texts, task.dev.texts_b, max_length=32)
    assert np.isnan(logits).all() and accuracy(logits, labels) == np.mean(np.asarray(labels) == 0)
    accuracy_nan, loss, _ = evaluate(loaded, task.dev, labels, 32)
    assert math.isnan(accuracy_nan) and math.isnan(loss)


def test_a_run_stopped_by_ctrl_c_says_interrupted(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    from bertology.training.run_folder import run_status

    def stop(progress: object) -> None:
        if getattr(progress, "step", 0) == 2:
            raise KeyboardInterrupt

    task = write_tiny_task(tmp_path / "task")
    with pytest.raises(KeyboardInterrupt):
        finetune(task, tmp_path / "run", tiny_settings(tiny_model_dirs["bert"]), on_progress=stop)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "interrupted" and run["error"] == "KeyboardInterrupt"
    assert run_status(run) == "interrupted"


def test_a_running_run_whose_process_is_gone_reads_as_interrupted() -> None:
    import socket

    from bertology.training.run_folder import run_status

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    here = socket.gethostname()
    assert run_status({"status": "running", "pid": finished.pid, "host": here}) == "interrupted"
    assert run_status({"status": "running", "pid": os.getpid(), "host": here}) == "running"
    assert run_status({"status": "running", "pid": finished.pid, "host": "elsewhere"}) == "running"
    assert run_status({"status": "finished", "pid": finished.pid, "host": here}) == "finished"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BERTOLOGY, *args], capture_output=True, text=True, timeout=600, env=os.environ)


@pytest.mark.slow
def test_default_model_finetunes_on_sst2_and_the_run_can_be_watched(
    tmp_path: Path, shared_data: Path
) -> None:
    sst2 = shared_data / "glue" / "SST-2"
    run_dir = tmp_path / "run"
    result = run_cli(
        "finetune", str(sst2), "-o", str(run_dir), "--max-train", "128", "--max-dev", "64",
        "--max-len", "48", "--watch-every", "2", "--probe-set", "3", "--eval-every", "0", "--threads", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["steps"] == 4 and run["train_examples"] == 128 and run["dev_examples"] == 64
    assert f"dev accuracy {run['dev_accuracy']:.4f} on 64 examples" in result.stdout

    task = read_glue(sst2, max_train=10, max_dev=64)
    loaded = load_model(run_dir, classifier=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)
        logits = predict_logits(loaded, task.dev.texts, batch_size=64, max_length=48)
    assert accuracy(logits, task.label_ids(task.dev)) == run["dev_accuracy"]
    assert read_archive(run_dir).steps.tolist() == [0, 2, 4]

    page = tmp_path / "watch.html"
    result = run_cli("watch", str(run_dir), "-o", str(page))
    assert result.returncode == 0, result.stderr
    assert f"Wrote {page}" in result.stdout
    text = page.read_text()
    assert '"view":"watch"' in text and "default-src 'none'" in text


def _files(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` and its bytes."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
def test_an_overwrite_killed_at_its_switch_leaves_the_old_run_and_later_runs_remove_only_its_leftovers(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 43: an overwrite killed at its first rename left the folder with neither run, the old one in
    an unlocked staging folder that the next overwrite removed. One SIGKILL here, at the real command's
    switch just before the names are exchanged (everything staged, the user's file linked in): the point
    where the old move had begun taking the old run apart. The switch's every step is killed in
    tests/files/test_swap.py, cheaply. Then a run into another folder beside it keeps both; a plain run
    where the user removed the run removes the killed run's staging folder (issue 43: they built up); an
    overwrite replaces a run and keeps the user's file."""
    task = write_tiny_task(tmp_path / "task")
    model = tiny_model_dirs["bert"]
    runs = tmp_path / "runs"
    folder = runs / "ft"
    finetune(task, folder, tiny_settings(model, epochs=1, watch_every=0, seed=3))
    (folder / "notes.txt").write_text("the user's", encoding="utf-8")
    old_files = _files(folder)
    options = ["--model", str(model), "--max-train", "16", "--batch-size", "8", "--epochs", "1"]
    killed = run_child_killed_at_switch(
        "before", "finetune", str(task), "-o", str(folder), *options, "--max-len", "32", "--seed", "7",
        "--watch-every", "0", "--threads", "1", "--overwrite",
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _files(folder) == old_files
    staged = list(runs.glob(".ft.*.partial"))
    assert len(staged) == 1 and json.loads((staged[0] / "run.json").read_text())["settings"]["seed"] == 7
    finetune(task, runs / "other", tiny_settings(model, epochs=1, watch_every=0, max_train=8))
    assert _files(folder) == old_files and list(runs.glob(".ft.*.partial")) == staged
    finetune(task, folder, tiny_settings(model, epochs=1, watch_every=0, max_train=8, seed=5), overwrite=True)
    assert json.loads((folder / "run.json").read_text())["settings"]["seed"] == 5
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "the user's"
    assert not list(runs.glob(".*.partial"))
    shutil.rmtree(folder)  # the user removes the run; a killed overwrite of it had left its staging folder
    shutil.copytree(runs / "other", runs / ".ft.0123456789ab.partial")
    finetune(task, folder, tiny_settings(model, epochs=1, watch_every=0, max_train=8))
    assert not list(runs.glob(".*.partial"))
