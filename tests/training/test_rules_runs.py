"""The training rules in real runs of a tiny model: a learning rate of 1e3 explodes, a learning rate too
small to move a float32 weight (a frozen model) stalls, a tiny training set overfits, and a run that
trains without learning raises only that it predicts one class; --stop-on stops a run cleanly; the
Trainer callback evaluates the same rules; the signals recorder's numbers against independent
computations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support.run_folders import write_tiny_task

from bertology.models.loading import LoadedModel, load_model
from bertology.training import FinetuneSettings, finetune, read_archive
from bertology.training.signals import SignalRecorder
from bertology.training.watch import watch_data


def tiny_settings(model: Path, **changes: object) -> FinetuneSettings:
    options = dict(
        model=str(model), max_train=40, batch_size=8, epochs=2, max_length=32, learning_rate=1e-3,
        eval_every=None, log_every=1, watch_every=1, probe_set=2, threads=1,
    )  # fmt: skip
    return FinetuneSettings(**{**options, **changes})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_task(tmp_path_factory.mktemp("rules") / "task")


def rules_fired(run_dir: Path) -> set[str]:
    return {alert["rule"] for alert in json.loads((run_dir / "run.json").read_text())["alerts"]}


def test_a_run_that_does_not_learn_raises_only_one_class_predictions(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    # The tiny random model's 10 steps (evaluated at steps 5 and 10) move every weight without learning
    # the task: every dev prediction is label "1", which 7 of the 12 dev sentences have (accuracy 7/12).
    # The optimisation and attention rules stay silent; the one-class rule says it, once, at step 5.
    result = finetune(task, tmp_path / "run", tiny_settings(tiny_model_dirs["bert"]))
    dev_labels = [line.rsplit("\t", 1)[1] for line in (task / "dev.tsv").read_text().splitlines()[1:]]
    assert dev_labels.count("1") == 7 and len(dev_labels) == 12
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(row["step"], row["accuracy"]) for row in rows if row["split"] == "dev"] == [
        (5, 7 / 12),
        (10, 7 / 12),
    ]
    assert [(alert.rule, alert.step, alert.what) for alert in result.alerts] == [
        (
            "one_class_predictions",
            5,
            "12 of the 12 dev predictions are label '1', which 7 of the dev examples have; "
            "dev accuracy 0.583",
        )
    ]
    assert result.stopped_by is None
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "finished" and len(run["rules"]) == 12
    assert run["alerts"] == [alert.to_json() for alert in result.alerts]
    lines = (tmp_path / "run" / "signals.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 11))


def test_a_learning_rate_of_1e3_explodes(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    seen = []
    result = finetune(
        task,
        tmp_path / "run",
        tiny_settings(tiny_model_dirs["bert"], learning_rate=1e3),
        on_alert=seen.append,
    )
    fired = {alert.rule for alert in result.alerts}
    assert {"exploding_gradient", "weight_update_ratio", "entropy_collapse"} <= fired
    assert "stalled_training" not in fired and "overfitting" not in fired
    assert list(result.alerts) == seen
    exploding = next(alert for alert in result.alerts if alert.rule == "exploding_gradient")
    assert exploding.where == ("training loss",)
    assert rules_fired(tmp_path / "run") == fired


def test_a_frozen_model_stalls(tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path) -> None:
    # 1e-30 x an Adam step is below a float32 weight's precision: no weight changes.
    result = finetune(task, tmp_path / "run", tiny_settings(tiny_model_dirs["bert"], learning_rate=1e-30))
    fired = {alert.rule for alert in result.alerts}
    assert {"stalled_training", "frozen_heads"} <= fired
    assert "exploding_gradient" not in fired
    frozen = next(alert for alert in result.alerts if alert.rule == "frozen_heads")
    assert len(frozen.heads) == 3 * 4  # every head of the 3 x 4 model


def test_a_tiny_training_set_overfits(tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path) -> None:
    settings = tiny_settings(
        tiny_model_dirs["bert"], max_train=8, epochs=30, learning_rate=3e-3, watch_every=0
    )
    result = finetune(task, tmp_path / "run", settings)
    # Besides overfitting: some evaluation of 8 examples' training predicts one class (the rule's own test
    # is above).
    assert [alert.rule for alert in result.alerts if alert.rule != "one_class_predictions"] == ["overfitting"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    dev = {row["step"]: row["loss"] for row in rows if row["split"] == "dev"}
    alert = next(alert for alert in result.alerts if alert.rule == "overfitting")
    assert dev[alert.step] >= 1.05 * min(loss for step, loss in dev.items() if step < alert.step)


@pytest.mark.slow
def test_stop_on_ends_the_run_with_status_stopped(
    tiny_model_dirs: dict[str, Path], task: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "bertology", "finetune", str(task), "-o", str(run_dir), "--model",
        str(tiny_model_dirs["bert"]), "--lr", "1000", "--epochs", "20", "--batch-size", "8",
        "--max-len", "32", "--watch-every", "1", "--probe-set", "2", "--eval-every", "0", "--threads", "1",
        "--rules", "exploding_gradient,frozen_heads", "--stop-on", "exploding_gradient",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ)
    assert result.returncode == 0, result.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "stopped" and run["rules"] == ["exploding_gradient", "frozen_heads"]
    stop = run["stopped_by"]
    assert stop["rule"] == "exploding_gradient" and run["steps"] == stop["step"] < 6 * 20
    assert f"Alert at step {stop['step']}: exploding_gradient: " in result.stderr
    assert f"Stopped by exploding_gradient at step {stop['step']}." in result.stdout
    assert stop in run["alerts"]
    archive = read_archive(run_dir)  # readable, and its last record is the step the run stopped at
    assert archive.steps[-1] == stop["step"]
    assert archive.attention(0).shape[0] == len(archive)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["split"] == "dev" and rows[-1]["step"] == stop["step"]  # evaluated where it stopped
    assert (run_dir / "model" / "config.json").is_file()
    data = watch_data(run_dir)
    assert [alert["rule"] for alert in data["alerts"]] == [alert["rule"] for alert in run["alerts"]]
    assert ["stopped by", f"exploding_gradient at step {stop['step']}"] in data["facts"]


@pytest.mark.slow
def test_unknown_rules_are_a_usage_error(task: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bertology", "finetune", str(task), "-o", str(tmp_path / "run")]
    for extra, message in (
        (["--rules", "overfit"], "Unknown rule overfit"),
        (
            ["--rules", "overfitting", "--stop-on", "frozen_heads"],
            "stop-on names frozen_heads, which --rules",
        ),
    ):
        result = subprocess.run(command + extra, capture_output=True, text=True, timeout=120, env=os.environ)
        assert result.returncode != 0 and message in result.stderr
        assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


@pytest.fixture
def tiny_classifier(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    torch.manual_seed(0)
    return load_model(tiny_model_dirs["bert"], classifier=True, labels=["0", "1"])


@pytest.mark.slow
def test_trainer_callback_evaluates_the_rules_and_stops(tiny_classifier: LoadedModel, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from bertology.training import AttentionMonitor, ProbeSet
    from bertology.training.callback import MonitorCallback, RulesCallback
    from bertology.training.rules import Watchdog, select_rules

    texts = [f"{word} film , really {word} ." for word in ("good", "bad", "fun", "dull")] * 4
    encoded = tiny_classifier.tokenizer(texts, padding="max_length", max_length=16, truncation=True)
    dataset = [
        {name: torch.tensor(values[index]) for name, values in encoded.items()} | {"labels": torch.tensor(0)}
        for index in range(len(texts))
    ]  # every label 0: the training labels are all one class
    monitor = AttentionMonitor(tmp_path / "monitor.zarr", ProbeSet(texts[:2]), every=1)
    watchdog = Watchdog(select_rules("default"), stop_on=["exploding_gradient"])
    rules = RulesCallback(watchdog, tiny_classifier, every=1, monitor=monitor, label_counts={"0": 16, "1": 0})
    args = TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=40, per_device_train_batch_size=4, learning_rate=1e3,
        report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = Trainer(
        model=tiny_classifier.model, args=args, train_dataset=dataset,
        callbacks=[MonitorCallback(monitor, tiny_classifier), rules],
    )  # fmt: skip
    trainer.train()
    fired = [alert.rule for alert in watchdog.alerts]
    assert fired[0] == "class_imbalance" and watchdog.alerts[0].step == 0
    assert watchdog.stop is not None and watchdog.stop.rule == "exploding_gradient"
    assert trainer.state.global_step == watchdog.stop.step < 40  # stopped at the step it fired
    assert "entropy_collapse" in fired and "weight_update_ratio" in fired
    assert len(watchdog.history.signals) == trainer.state.global_step
    assert len(watchdog.history.attention) == len(read_archive(tmp_path))


def test_signal_recorder_numbers(tiny_classifier: LoadedModel) -> None:
    model = tiny_classifier.model
    recorder = SignalRecorder(model)
    assert recorder.groups == ["embeddings", "layer 0", "layer 1", "layer 2", "head"]
    with torch.no_grad():  # every feed-forward unit of layer 1 dead, every pooler output saturated
        model.bert.encoder.layer[1].intermediate.dense.bias.fill_(-100.0)
        model.bert.pooler.dense.weight.mul_(1000.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = tiny_classifier.tokenizer(["a good film .", "a dull story"], return_tensors="pt", padding=True)
    with recorder.activations():
        loss = model(**inputs, labels=torch.tensor([1, 0])).loss
    loss.backward()
    recorder.gradients()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    recorder.before_update()
    optimizer.step()
    record = recorder.after_update(1, 0.1)

    def group(name: str) -> str:
        if name.startswith("bert.encoder.layer."):
            return f"layer {name.split('.')[3]}"
        return "embeddings" if name.startswith("bert.embeddings.") else "head"

    for index, name in enumerate(recorder.groups):
        members = [n for n in before if group(n) == name]
        expected_grad = np.sqrt(sum(float(grads[n].double().square().sum()) for n in members if n in grads))
        after = {n: p.detach() for n, p in model.named_parameters()}
        expected_update = np.sqrt(sum(float((before[n] - after[n]).double().square().sum()) for n in members))
        # float32 squares summed per tensor in float32 (about sqrt(n)·2^-24 relative, n <= 10^5), here
        # in float64; the update is a difference of nearly equal float32 weights, which loses a digit
        assert record.gradient_norm[index] == pytest.approx(expected_grad, rel=1e-5)
        assert record.update_norm[index] == pytest.approx(expected_update, rel=1e-4)
        assert record.parameters[index] == sum(before[n].numel() for n in members)
    assert np.isnan(record.saturation[0])  # no activation function in the embeddings
    assert record.saturation[2] == 1.0 and record.saturation[4] == 1.0
    assert record.saturation[1] < 0.5
