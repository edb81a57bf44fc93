"""Fine-tune a sequence classifier on a GLUE-style task with a plain PyTorch loop, watching its attention.

The loop: a seeded random sample of ``max_train`` training examples; each epoch shuffles them, sorts
them by length within buckets of 50 batches (little padding) and shuffles the batches; AdamW with
weight decay (not on biases and LayerNorm weights), linear warm-up then linear decay to 0, gradient
norm clipped to 1. With the same seed, settings and thread count a run repeats exactly: the new
classification head, the sample, the batches and dropout all come from the seed.

The run folder it writes, and how a run over an earlier one is staged, are
:mod:`bertology.training.run_folder`'s.

The training rules get the loss of every step (before the step's signals, so a divergence in the loss
is seen before what it does to the gradients), every dev evaluation, the signals and the monitor's
records.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import get_linear_schedule_with_warmup

from bertology.corpus.encoding import encode
from bertology.corpus.readers.glue import GlueTask, Split, read_glue
from bertology.errors import BertologyError, TruncationWarning
from bertology.files.run_files import TRAINING_FILE
from bertology.models.classify import accuracy, predict_logits
from bertology.models.devices import resolve_dtype
from bertology.models.loading import RUN_MODEL_FOLDER, LoadedModel, load_model
from bertology.training.archive import ARCHIVE_FOLDER
from bertology.training.monitor import AttentionMonitor, ProbeSet
from bertology.training.rules import Alert, Rule, SignalRecord, Watchdog, select_rules
from bertology.training.rules.smdebug import records_read
from bertology.training.run_folder import (
    METRICS_CSV,
    METRICS_JSONL,
    SIGNALS_JSONL,
    TENSORS_JSONL,
    check_run_dir,
    marked_if_stopped,
    run_folder,
    write_json,
)
from bertology.training.settings import FinetuneSettings, TrainingProgress
from bertology.training.signals import SignalRecorder
from bertology.training.tensor_recorder import TensorRecorder

#: Consecutive batches whose examples are sorted by length together.
BUCKET_BATCHES = 50


@dataclass(frozen=True)
class FinetuneResult:
    """A finished (or stopped) run: its folder, optimizer steps, wall time in seconds (loading to saving),
    training and dev example counts, the final dev accuracy and mean cross-entropy (nats), the rules'
    alerts, and the alert that stopped the run (None: it ran to the end)."""

    run_dir: Path
    steps: int
    seconds: float
    train_examples: int
    dev_examples: int
    dev_accuracy: float
    dev_loss: float
    alerts: tuple[Alert, ...] = ()
    stopped_by: Alert | None = None


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of batches of indices into ``lengths`` [n] (token counts): shuffled, sorted by length
    within buckets of :data:`BUCKET_BATCHES` batches, batch order shuffled. Every index once."""
    order = rng.permutation(len(lengths))
    span = batch_size * BUCKET_BATCHES
    batches = []
    for start in range(0, len(order), span):
        bucket = order[start : start + span]
        bucket = bucket[np.argsort(lengths[bucket], kind="stable")]
        batches += [bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def _token_counts(loaded: LoadedModel, split: Split) -> np.ndarray:
    """[n] int: each example's token count before truncation (special tokens included)."""
    encoded = loaded.tokenizer(split.texts, split.texts_b, verbose=False)
    return np.array([len(ids) for ids in encoded["input_ids"]])


def _optimizer(model: torch.nn.Module, settings: FinetuneSettings) -> torch.optim.AdamW:
    decayed, plain = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (plain if parameter.ndim < 2 or "LayerNorm" in name else decayed).append(parameter)
    groups = [
        {"params": decayed, "weight_decay": settings.weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    # The fused kernel takes about a third of the time of the default one on a CPU.
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=settings.learning_rate, fused=fused)


def evaluate(
    loaded: LoadedModel, split: Split, labels: list[int], max_length: int
) -> tuple[float, float, np.ndarray]:
    """(accuracy, mean cross-entropy in nats, confusion matrix [C, C] of examples by true label (row) and
    arg-max prediction (column)) of classifier ``loaded`` on ``split``. The accuracy is NaN (undefined)
    when any logit is not finite: the arg-max of NaN logits would count every such example as the first
    label, giving that label's share of the dev set instead of an accuracy."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)  # counted in run.json instead
        logits = predict_logits(loaded, split.texts, split.texts_b, batch_size=64, max_length=max_length)
    log_probs = torch.log_softmax(torch.from_numpy(logits).double(), dim=1).numpy()
    loss = -float(np.mean(log_probs[np.arange(len(labels)), labels]))
    classes = logits.shape[1]
    pairs = np.asarray(labels, dtype=np.int64) * classes + np.argmax(logits, axis=1)
    confusion = np.bincount(pairs, minlength=classes * classes).reshape(classes, classes)
    return (accuracy(logits, labels) if np.isfinite(logits).all() else math.nan), loss, confusion


class _MetricsLog:
    """Appends rows to a JSON-lines file (flushed per row, so it can be read during training)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        path.write_text("", encoding="utf-8")

    def add(self, **row: Any) -> None:
        self.rows.append(row)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def save_csv(self, path: Path) -> None:
        import pandas as pd

        pd.DataFrame(self.rows).to_csv(path, index=False)


def _save_model(loaded: LoadedModel, folder: Path) -> None:
    """Save the model and tokenizer into ``folder``, checking that they are there."""
    try:
        loaded.model.save_pretrained(folder)
        loaded.tokenizer.save_pretrained(folder)
    except OSError as error:
        raise BertologyError(f"Could not save the model in {folder}: {error.strerror or error}.") from error
    if not (folder / "config.json").is_file():  # save_pretrained only logs a folder it cannot create
        raise BertologyError(f"Could not save the model in {folder}.")


def _train_sample(task: GlueTask, settings: FinetuneSettings, rng: np.random.Generator) -> Split:
    examples = task.train.examples
    if settings.max_train is not None and settings.max_train < len(examples):
        chosen = np.sort(rng.permutation(len(examples))[: settings.max_train])
        examples = [examples[index] for index in chosen]
    return Split(task.train.path, examples)


class _MixedPrecision:
    """Forward passes in ``dtype`` over float32 weights (``torch.autocast``; float32: plain passes), and for
    float16 a loss scale against gradients that underflow (``torch.amp.GradScaler``)."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device_type, self.dtype = device.type, dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def forward(self) -> torch.autocast:
        """The block in which forward passes run in the run's precision."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype != torch.float32)


def _train_step(
    loaded: LoadedModel,
    inputs: tuple[list[str], list[str] | None, list[int]],
    max_length: int,
    optimizer: torch.optim.Optimizer,
    schedule: torch.optim.lr_scheduler.LRScheduler,
    precision: _MixedPrecision,
    recorder: SignalRecorder | None = None,
    tensors: TensorRecorder | None = None,
) -> tuple[float, float]:
    """One optimizer step on a batch of (texts, second texts or None, label ids); returns the batch's
    mean cross-entropy and the learning rate the step used. ``recorder``: measure this step's signals
    (read them with ``recorder.after_update``, which the step leaves to the caller); ``tensors``: measure
    what SageMaker Debugger's rules read (read it with ``tensors.record``)."""
    texts, texts_b, labels = inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)  # counted in run.json instead
        encoded = encode(loaded.tokenizer, texts, texts_b, max_length=max_length)
    targets = torch.tensor(labels, device=loaded.device)
    with (
        precision.forward(),
        recorder.activations() if recorder else nullcontext(),
        tensors.watching() if tensors else nullcontext(),
    ):
        loss = loaded.model(**loaded.model_inputs(encoded), labels=targets).loss
    scaler = precision.scaler
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    if recorder:
        recorder.gradients()
    if tensors:
        tensors.tensors()
    torch.nn.utils.clip_grad_norm_(loaded.model.parameters(), 1.0)
    rate = schedule.get_last_lr()[0]
    if recorder:
        recorder.before_update()
    scaler.step(optimizer)
    scaler.update()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item(), rate


def finetune(
    task_dir: str | Path,
    run_dir: str | Path,
    settings: FinetuneSettings | None = None,
    *,
    overwrite: bool = False,
    on_progress: Callable[[TrainingProgress], None] | None = None,
    on_alert: Callable[[Alert], None] | None = None,
    rules: Sequence[Rule] | None = None,
) -> FinetuneResult:
    """Fine-tune ``settings.model`` on the task in ``task_dir`` (GLUE-style TSV) into ``run_dir``.

    The attention monitor records step 0, every ``watch_every`` steps and the last step.
    on_progress: called after every optimizer step. on_alert: called with each alert of the training
    rules as it fires. rules: rule objects to evaluate instead of ``settings.rules`` (e.g. other
    thresholds: ``[LossNotDecreasing(window=20)]``); ``settings.stop_on`` names rules among them.

    The settings, task, model and run folder are all checked before anything is written. Should training
    stop on an error or Ctrl-C, ``run.json`` says ``"interrupted"`` (with the error); should a rule of
    ``settings.stop_on`` fire, the run stops after that step, records and saves as at the end and says
    ``"stopped"``.

    Raises:
        BertologyError: bad settings or task folder, an unloadable model, a ``max_length`` with no room for
            text, or a ``run_dir`` that cannot take a run (see :func:`check_run_dir`).
    """
    settings = settings or FinetuneSettings()
    settings.check()
    threads = torch.get_num_threads()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        chosen = select_rules(settings.rules, settings.rule_params) if rules is None else list(rules)
        watchdog = Watchdog(chosen, settings.stop_on)
        return _run(
            Path(task_dir), Path(run_dir), settings, overwrite, on_progress, _Alerts(watchdog, on_alert)
        )
    finally:
        torch.set_num_threads(threads)


def _label_counts(labels: list[str], ids: list[int]) -> dict[str, int]:
    """``{label: training examples}`` for every label of the task (0 for a label without examples)."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(labels))
    return {label: int(count) for label, count in zip(labels, counts, strict=True)}


class _Alerts:
    """The run's watchdog, and what is done with its alerts: kept in ``run.json`` (rewritten whenever
    one fires) and handed to ``on_alert``."""

    def __init__(self, watchdog: Watchdog, on_alert: Callable[[Alert], None] | None) -> None:
        self.watchdog = watchdog
        self.on_alert = on_alert
        self.run_json: Path | None = None
        self.run_info: dict[str, Any] = {}

    def start(self, path: Path, run_info: dict[str, Any]) -> None:
        """Keep alerts in ``run_info`` (``alerts``: a list) and write it to ``path`` when one fires."""
        self.run_json, self.run_info = path, run_info
        run_info["rules"] = [rule.name for rule in self.watchdog.rules]
        run_info["alerts"] = []

    def __call__(self, alerts: list[Alert]) -> None:
        if not alerts:
            return
        self.run_info["alerts"] += [alert.to_json() for alert in alerts]
        if self.run_json is not None:
            write_json(self.run_json, self.run_info)
        if self.on_alert is not None:
            for alert in alerts:
                self.on_alert(alert)


class _RuleMeasures:
    """What the training rules read of a watched step (every ``every``-th optimizer step) besides the
    loss, when rules are evaluated: the signals (``signals.jsonl``) and, when a rule of SageMaker
    Debugger's reads them, its tensors (``tensors.jsonl``)."""

    def __init__(self, model: torch.nn.Module, folder: Path, watchdog: Watchdog, every: int) -> None:
        self.every = every
        self.signals: SignalRecorder | None = None
        self.tensors: TensorRecorder | None = None
        if watchdog.rules and every:
            self.signals, self.signal_log = SignalRecorder(model), _MetricsLog(folder / SIGNALS_JSONL)
            self.tensors = TensorRecorder.for_rules(model, watchdog.rules)
            if self.tensors is not None:
                self.tensor_log = _MetricsLog(folder / TENSORS_JSONL)

    def watches(self, step: int) -> bool:
        """Whether optimizer step ``step`` (counted from 1) is measured."""
        return self.signals is not None and step % self.every == 0

    def record(self, step: int, rate: float, alerts: _Alerts) -> None:
        """After watched step ``step`` (see :meth:`watches`) at learning rate ``rate``: write what was
        measured and hand it to the rules."""
        assert self.signals is not None
        record: SignalRecord = self.signals.after_update(step, rate)
        self.signal_log.add(**record.to_json())
        alerts(alerts.watchdog.signals(record))
        if self.tensors is not None:
            measures = self.tensors.record(step)
            self.tensor_log.add(**measures.to_json())
            alerts(alerts.watchdog.tensors(measures))


@dataclass
class _Training:
    """The training loop of one run: its optimizer steps, logs and dev evaluations, and the rules' view of
    each. ``step``: optimizer steps taken so far."""

    loaded: LoadedModel
    settings: FinetuneSettings
    train: Split
    train_labels: list[int]
    dev: Split
    dev_labels: list[int]
    limit: int
    precision: _MixedPrecision
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    alerts: _Alerts
    monitor: AttentionMonitor | None
    metrics: _MetricsLog
    measures: _RuleMeasures
    confusion: bool
    batches_per_epoch: int
    total: int
    started: float
    on_progress: Callable[[TrainingProgress], None] | None
    step: int = 0

    def run(self, lengths: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
        """Train for the settings' epochs over batches of ``lengths`` [n] (token counts, truncated) drawn
        with ``rng``, until the end or a stopping rule; return the final dev accuracy and loss."""
        self.loaded.model.train()
        window: deque[float] = deque(maxlen=self.settings.log_every)
        dev_step = -1
        for epoch in range(self.settings.epochs):
            for batch in length_batches(lengths, self.settings.batch_size, rng):
                if self.alerts.watchdog.stop is not None:
                    break
                self._train_batch(batch, window)
                epoch_end = self.step == (epoch + 1) * self.batches_per_epoch
                if epoch_end or (self.settings.eval_every and self.step % self.settings.eval_every == 0):
                    dev_accuracy, dev_loss = self._evaluate(alert=True)
                    dev_step = self.step
        if dev_step != self.step:  # stopped by a rule after the last evaluation
            dev_accuracy, dev_loss = self._evaluate(alert=False)
        return dev_accuracy, dev_loss

    def _position(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": round(self.step / self.batches_per_epoch, 4)}

    def _seconds(self) -> float:
        return round(time.perf_counter() - self.started, 2)

    def _train_batch(self, batch: np.ndarray, window: deque[float]) -> None:
        """One optimizer step on the training examples ``batch`` [b] (indices), then its logs, progress,
        measures and the rules' view of them."""
        train, watchdog = self.train, self.alerts.watchdog
        texts_b = None if train.texts_b is None else [train.texts_b[i] for i in batch]
        inputs = ([train.texts[i] for i in batch], texts_b, [self.train_labels[i] for i in batch])
        watched = self.measures.watches(self.step + 1)
        loss, rate = _train_step(
            self.loaded, inputs, self.limit, self.optimizer, self.schedule, self.precision,
            self.measures.signals if watched else None, self.measures.tensors if watched else None,
        )  # fmt: skip
        self.step += 1
        window.append(loss)
        if self.monitor is not None:
            self.monitor.loss(self.step, loss)
        self.alerts(watchdog.train(self.step, loss))
        if watched:
            self.measures.record(self.step, rate, self.alerts)
        if self.step % self.settings.log_every == 0:
            self.metrics.add(**self._position(), split="train", loss=float(np.mean(window)),
                             learning_rate=rate, seconds=self._seconds())  # fmt: skip
        if self.on_progress is not None:
            self.on_progress(TrainingProgress(self.step, self.total, float(np.mean(window)), rate))
        if self.monitor is not None and self.monitor.step(self.loaded, self.step):
            self.alerts(watchdog.attention(self.monitor.latest))  # type: ignore[arg-type]

    def _evaluate(self, alert: bool) -> tuple[float, float]:
        """Evaluate on the dev set, log it, and (``alert``) hand it to the rules; (accuracy, loss)."""
        with self.precision.forward():
            dev_accuracy, dev_loss, confusion = evaluate(self.loaded, self.dev, self.dev_labels, self.limit)
        self.metrics.add(**self._position(), split="dev", loss=dev_loss, accuracy=dev_accuracy,
                         seconds=self._seconds())  # fmt: skip
        if alert:
            watchdog = self.alerts.watchdog
            self.alerts(
                watchdog.dev(self.step, dev_loss, dev_accuracy, confusion if self.confusion else None)
            )
        return dev_accuracy, dev_loss


def _run(
    task_dir: Path,
    run_dir: Path,
    settings: FinetuneSettings,
    overwrite: bool,
    on_progress: Callable[[TrainingProgress], None] | None,
    alerts: _Alerts,
) -> FinetuneResult:
    """:func:`finetune` with checked settings and the thread count set."""
    started = time.perf_counter()
    check_run_dir(run_dir, overwrite)
    task = read_glue(task_dir, max_dev=settings.max_dev)
    rng = np.random.default_rng(settings.seed)
    train = _train_sample(task, settings, rng)
    train_labels, dev_labels = task.label_ids(train), task.label_ids(task.dev)
    torch.manual_seed(settings.seed)
    loaded = load_model(settings.model, classifier=True, labels=task.labels, device=settings.device)
    precision = _MixedPrecision(loaded.device, resolve_dtype(settings.dtype))
    model = loaded.model
    limit = min(settings.max_length, loaded.max_length)
    special = loaded.tokenizer.num_special_tokens_to_add(pair=task.is_pair)
    if limit <= special:
        raise BertologyError(
            f"max-len {settings.max_length} leaves no room for text besides the {special} special tokens."
        )
    check_run_dir(run_dir, overwrite)  # again: the folder may have changed while the model loaded
    with run_folder(run_dir) as folder:
        counts = _token_counts(loaded, train)
        batches_per_epoch = math.ceil(len(train.examples) / settings.batch_size)
        total = batches_per_epoch * settings.epochs
        optimizer = _optimizer(model, settings)
        schedule = get_linear_schedule_with_warmup(optimizer, round(settings.warmup * total), total)
        monitor = None
        if settings.watch_every:
            probe = ProbeSet.sample(task.dev, settings.probe_set, settings.seed)
            monitor = AttentionMonitor(
                folder / ARCHIVE_FOLDER, probe, every=settings.watch_every, max_length=limit
            )
        run_info: dict[str, Any] = {
            "status": "running",
            "task": task.name,
            "task_dir": str(task_dir.resolve()),
            "pair": task.is_pair,
            "model": loaded.name,
            "labels": task.labels,
            "settings": asdict(settings),
            "train_examples": len(train.examples),
            "dev_examples": len(task.dev.examples),
            "truncated_train_examples": int(np.sum(counts > limit)),
            "truncated_dev_examples": int(np.sum(_token_counts(loaded, task.dev) > limit)),
            "steps_planned": total,
            "torch_threads": torch.get_num_threads(),
            "device": str(loaded.device),
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        watchdog = alerts.watchdog
        alerts.start(folder / TRAINING_FILE, run_info)
        write_json(folder / TRAINING_FILE, run_info)
        with marked_if_stopped(folder / TRAINING_FILE, run_info):
            alerts(watchdog.labels(_label_counts(task.labels, train_labels)))
            if monitor is not None:
                monitor.record(loaded, 0)
                alerts(watchdog.attention(monitor.latest))  # type: ignore[arg-type]
            training = _Training(
                loaded, settings, train, train_labels, task.dev, dev_labels, limit, precision, optimizer,
                schedule, alerts, monitor, _MetricsLog(folder / METRICS_JSONL),
                _RuleMeasures(model, folder, watchdog, settings.watch_every),
                "confusion" in records_read(watchdog.rules), batches_per_epoch, total, started, on_progress,
            )  # fmt: skip
            dev_accuracy, dev_loss = training.run(np.minimum(counts, limit), rng)
            step, metrics = training.step, training.metrics
            if monitor is not None:
                monitor.record(loaded, step)

            model.eval()
            _save_model(loaded, folder / RUN_MODEL_FOLDER)
            metrics.save_csv(folder / METRICS_CSV)
            seconds = time.perf_counter() - started
            stop = watchdog.stop
            result = FinetuneResult(
                run_dir, step, seconds, len(train.examples), len(task.dev.examples), dev_accuracy, dev_loss,
                tuple(watchdog.alerts), stop,
            )  # fmt: skip
            if stop is not None:
                run_info["stopped_by"] = stop.to_json()
            run_info |= {
                "status": "finished" if stop is None else "stopped",
                "steps": step,
                "seconds": round(seconds, 1),
                "dev_accuracy": dev_accuracy,
                "dev_loss": dev_loss,
            }
            write_json(folder / TRAINING_FILE, run_info)
            return result
