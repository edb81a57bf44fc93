"""The attention monitor and its archive: whole records only, readable during training and after a kill,
from a plain loop and from Hugging Face's Trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from support.run_folders import write_tiny_task

from bertology.attention.capturing import capture_batch
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, load_model
from bertology.stats.surface import SURFACE_STATISTICS
from bertology.training import AttentionMonitor, MonitorArchive, ProbeSet, read_archive
from bertology.training.archive import ARCHIVE_FOLDER, ArchiveWriter, ProbeTokens

PROBE = ProbeSet(
    ["the film was good .", "a dull and boring story", "the acting was really quite lovely ."],
    labels=["1", "0", "1"],
)
ALWAYS_DEFINED = ("previous", "next", "current", "cls", "sep", "punct", "entropy", "confidence")


@pytest.fixture
def tiny_classifier(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    torch.manual_seed(0)
    return load_model(tiny_model_dirs["bert"], classifier=True, labels=["0", "1"])


def assert_records_complete(archive: MonitorArchive) -> None:
    """Every record: attention rows of real queries sum to 1 over real keys, zero padding, statistics."""
    assert len(archive) >= 1
    group = zarr.open_group(str(archive.path), mode="r")
    for example, n in enumerate(archive.lengths):
        attention = archive.attention(example)  # [T, L, H, n, n]
        assert attention.shape == (len(archive), archive.layers, archive.heads, n, n)
        np.testing.assert_allclose(attention.sum(-1), 1.0, atol=3e-3)  # float16 storage
        padded = np.asarray(group["attention"][: len(archive), example])
        assert not padded[..., n:, :].any() and not padded[..., :, n:].any()
    for name in ALWAYS_DEFINED:
        assert np.isfinite(archive.statistic(name)).all(), name
    assert archive.statistics == list(SURFACE_STATISTICS)


def test_only_complete_records_are_read(tmp_path: Path) -> None:
    probe = ProbeTokens(["a b"], None, ["1"], [["[CLS]", "a", "b", "[SEP]"]], [[0, 0, 0, 0]], [0])
    path = tmp_path / ARCHIVE_FOLDER
    writer = ArchiveWriter.create(path, model="m", layers=1, heads=2, probe=probe, statistics=["s"], every=1)
    attention = np.full((1, 1, 2, 4, 4), 0.25)
    writer.append(0, attention, np.zeros((1, 1, 2)))
    # A record cut short after its chunks were written but before it was counted: invisible.
    group = zarr.open_group(str(path), mode="r+")
    for name in ("steps", "attention", "stats"):
        group[name].resize((2, *group[name].shape[1:]))
    group["steps"][1] = 7
    archive = read_archive(tmp_path)
    assert archive.steps.tolist() == [0]
    assert archive.attention(0).shape == (1, 1, 2, 4, 4)
    with pytest.raises(BertologyError, match="holds"):
        writer.append(1, np.zeros((1, 1, 2, 5, 5)), np.zeros((1, 1, 2)))


def test_every_steps_training_loss_is_kept_up_to_the_last_complete_record(tmp_path: Path) -> None:
    probe = ProbeTokens(["a b"], None, ["1"], [["[CLS]", "a", "b", "[SEP]"]], [[0, 0, 0, 0]], [0])
    path = tmp_path / ARCHIVE_FOLDER
    writer = ArchiveWriter.create(path, model="m", layers=1, heads=2, probe=probe, statistics=["s"], every=1)
    attention, stats = np.full((1, 1, 2, 4, 4), 0.25), np.zeros((1, 1, 2))
    losses = np.random.default_rng(0).random(1500).astype(np.float32)  # more than one chunk of steps
    losses[1] = np.nan  # a step whose loss was not given
    writer.append(0, attention, stats, losses[:0])
    writer.append(3, attention, stats, losses[:3])
    assert np.array_equal(read_archive(tmp_path).losses, losses[:3], equal_nan=True)
    writer.append(1400, attention, stats, losses[:1400])
    assert np.array_equal(read_archive(tmp_path).losses, losses[:1400], equal_nan=True)
    # Losses written for a record that was never counted are not read.
    group = zarr.open_group(str(path), mode="r+")
    group["losses"].resize((1500,))
    group["losses"][1400:] = losses[1400:]
    assert len(read_archive(tmp_path).losses) == 1400


def test_monitor_records_in_eval_mode_and_restores_the_mode(
    tiny_classifier: LoadedModel, tmp_path: Path
) -> None:
    monitor = AttentionMonitor(tmp_path / ARCHIVE_FOLDER, PROBE, every=2)
    tiny_classifier.model.train()  # dropout on: a record must not see it
    assert monitor.record(tiny_classifier, 0)
    assert not monitor.record(tiny_classifier, 0)  # the same step twice is one record
    assert not monitor.step(tiny_classifier, 1)
    assert monitor.step(tiny_classifier, 2)
    assert tiny_classifier.model.training
    archive = read_archive(tmp_path)
    assert archive.steps.tolist() == [0, 2]
    np.testing.assert_array_equal(archive.attention(0)[0], archive.attention(0)[1])  # no dropout
    assert archive.probe.texts == PROBE.texts and archive.probe.labels == PROBE.labels
    assert archive.probe.tokens[0][0] == "[CLS]" and archive.probe.tokens[0][-1] == "[SEP]"
    assert_records_complete(archive)


def test_archive_survives_a_training_run_killed_midway(
    tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    task = write_tiny_task(tmp_path / "task", train_rows=64, dev_rows=8)
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "bertology", "finetune", str(task), "-o", str(run_dir),
        "--model", str(tiny_model_dirs["bert"]), "--watch-every", "1", "--probe-set", "3",
        "--epochs", "1000", "--batch-size", "8", "--max-len", "32", "--eval-every", "0", "--threads", "1",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ)
    seen: dict[int, np.ndarray] = {}
    try:
        deadline = time.monotonic() + 180
        while len(seen) < 3:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the monitor recorded fewer than 3 steps in 180 s"
            if (run_dir / ARCHIVE_FOLDER / "zarr.json").exists():
                archive = read_archive(run_dir)  # read while training writes
                if len(archive):
                    assert_records_complete(archive)
                    seen = {int(step): archive.attention(0)[i] for i, step in enumerate(archive.steps)}
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL

    archive = read_archive(run_dir)
    assert_records_complete(archive)
    assert archive.steps.tolist() == list(range(len(archive)))  # every step, from 0, none missing
    assert len(archive) >= len(seen)
    for step, attention in seen.items():  # what was read during training has not changed since
        np.testing.assert_array_equal(archive.attention(0)[step], attention)


def test_trainer_callback_records_like_the_plain_loop(tiny_classifier: LoadedModel, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from bertology.training.callback import MonitorCallback

    texts = [f"{word} film , really {word} ." for word in ("good", "bad", "fun", "dull")] * 4
    encoded = tiny_classifier.tokenizer(texts, padding="max_length", max_length=16, truncation=True)
    dataset = [
        {name: torch.tensor(values[index]) for name, values in encoded.items()}
        | {"labels": torch.tensor(index % 2)}
        for index in range(len(texts))
    ]
    monitor = AttentionMonitor(tmp_path / ARCHIVE_FOLDER, PROBE, every=2)
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=5, per_device_train_batch_size=4, learning_rate=1e-3,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(
        model=tiny_classifier.model, args=args, train_dataset=dataset,
        callbacks=[MonitorCallback(monitor, tiny_classifier)],
    )  # fmt: skip
    trainer.train()

    archive = read_archive(tmp_path)
    assert archive.steps.tolist() == [0, 2, 4, 5]  # before training, every 2 steps, the last step
    assert_records_complete(archive)
    tiny_classifier.model.eval()
    now = capture_batch(PROBE.texts, model=tiny_classifier)  # the trained model, as a plain capture
    for example in range(len(PROBE.texts)):
        attention = archive.attention(example)
        expected = now[example].probs
        # the archive keeps float16: weights <= 1 round by at most 2^-11 (4.9e-4); 1e-3 is twice that
        np.testing.assert_allclose(attention[-1], expected, atol=1e-3)
        assert np.abs(attention[0] - expected).max() > 1e-3  # training changed the attention


@pytest.mark.parametrize("recorded", [-3, 5])
def test_a_record_count_the_archive_cannot_hold_is_damaged_metadata(tmp_path: Path, recorded: int) -> None:
    probe = ProbeTokens(["a b"], None, ["1"], [["[CLS]", "a", "b", "[SEP]"]], [[0, 0, 0, 0]], [0])
    path = tmp_path / ARCHIVE_FOLDER
    writer = ArchiveWriter.create(path, model="m", layers=1, heads=2, probe=probe, statistics=["s"], every=1)
    writer.append(0, np.full((1, 1, 2, 4, 4), 0.25), np.zeros((1, 1, 2)))
    zarr.open_group(str(path), mode="r+").attrs["recorded"] = recorded
    with pytest.raises(BertologyError, match=rf"{recorded} records, of 1 stored\); its metadata is damaged"):
        read_archive(tmp_path)
