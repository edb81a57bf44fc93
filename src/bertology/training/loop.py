"""Fine-tune a sequence classifier on a GLUE-style task with a plain PyTorch loop, watching its attention.

The loop: a seeded random sample of ``max_train`` training examples; each epoch shuffles them, sorts
them by length within buckets of 50 batches (little padding) and shuffles the batches; AdamW with
weight decay (not on biases and LayerNorm weights), linear warm-up then linear decay to 0, gradient
norm clipped to 1. With the same seed, settings and thread count a run repeats exactly: the new
classification head, the sample, the batches and dropout all come from the seed.

A run folder holds:

- ``model/``: the fine-tuned model and tokenizer (``save_pretrained``); ``load_model(RUN_DIR,
  classifier=True)`` loads it.
- ``run.json``: task, model, settings, labels, sizes, status (``running``, ``finished``, ``stopped``
  when a rule of ``stop_on`` fired, with the alert as ``stopped_by``, or ``interrupted`` when training
  stopped on an error or Ctrl-C, with the ``error``), the ``pid`` and ``host`` of the training process
  (:func:`run_status` tells a run whose process is gone), steps, time, the final dev accuracy and loss,
  and the training rules' ``alerts`` (rewritten as they fire; :mod:`bertology.training.rules`).
- ``metrics.jsonl`` (a line per log and evaluation, appended as training goes) and ``metrics.csv``:
  ``split`` = ``train`` rows (mean loss over the last ``log_every`` steps, learning rate) and ``dev``
  rows (accuracy and mean cross-entropy over the dev examples; the accuracy is NaN when a logit is not
  finite, since the arg-max of NaN logits is no prediction).
- ``monitor.zarr``: the attention monitor's archive (:mod:`bertology.training.archive`), with the training
  loss of every step (``losses``).
- ``signals.jsonl``: the per-layer gradient norms, weight-update norms and activation saturation of every
  ``watch_every``-th step (:mod:`bertology.training.signals`), when rules are evaluated.
- ``tensors.jsonl``: what SageMaker Debugger's rules (``rules="smdebug"``) read of every watched step
  (per-layer gradient and weight statistics, activation activity, token counts), when one of them is
  selected (:mod:`bertology.training.tensor_recorder`); they also read each dev evaluation's confusion
  matrix.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
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
from bertology.training.settings import FinetuneSettings, TrainingProgress
from bertology.training.signals import SignalRecorder
from bertology.training.tensor_recorder import TensorRecorder

METRICS_JSONL = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
SIGNALS_JSONL = "signals.jsonl"
TENSORS_JSONL = "tensors.jsonl"
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON through a temporary file and a rename, so readers never see half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(partial, path)


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


#: What a run writes in its folder; nothing else there is touched.
RUN_OUTPUTS = (
    TRAINING_FILE, METRICS_JSONL, METRICS_CSV, RUN_MODEL_FOLDER, ARCHIVE_FOLDER, SIGNALS_JSONL, TENSORS_JSONL,
)  # fmt: skip


def check_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Raise unless a run can be written into ``run_dir``, without changing anything.

    The folder may hold other files. An earlier run there (``run.json``) is replaced only with
    ``overwrite``; a run output's name (``model``, ``metrics.csv``, ...) without ``run.json`` is not a run
    of ours, so it is never replaced.

    Raises:
        BertologyError: ``run_dir`` is a file or not writable, holds a run (without ``overwrite``), or holds
            files with the names of a run's outputs but no ``run.json``.
    """
    from bertology.files.outputs import check_output_folder

    check_output_folder(run_dir)
    if (run_dir / TRAINING_FILE).exists():
        if not overwrite:
            raise BertologyError(
                f"{run_dir} already holds a training run; choose a new folder, or replace it with "
                "--overwrite (overwrite=True in Python)."
            )
        return
    foreign = [name for name in RUN_OUTPUTS if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    if foreign:
        raise BertologyError(
            f"{run_dir} holds {', '.join(foreign)} but no {TRAINING_FILE}, so not a run of bertology's; "
            "choose a new folder (nothing there is replaced)."
        )


@contextmanager
def _run_folder(run_dir: Path) -> Iterator[Path]:
    """The folder a run (checked by :func:`check_run_dir`) writes in: ``run_dir`` itself for a new run, so
    that it can be watched as it trains; over an earlier run, a staging folder beside it
    (:func:`bertology.files.outputs.output_folder`) whose outputs replace the earlier run's
    (:data:`RUN_OUTPUTS`, each whole) only when the block ends without an error, so a run killed or stopped on
    the way leaves the earlier run as it was."""
    from bertology.files.outputs import output_folder

    if not (run_dir / TRAINING_FILE).exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        yield run_dir
        return
    with output_folder(run_dir, replace=RUN_OUTPUTS) as staging:
        yield staging


def _process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run_status(run: dict[str, Any]) -> str:
    """The status of the run that ``run`` (its ``run.json``) describes: its recorded ``status``, except
    that a run recorded as ``"running"`` by a process of this machine that no longer exists (killed, or
    the machine restarted) is ``"interrupted"``."""
    status = str(run.get("status", ""))
    pid = run.get("pid")
    if status == "running" and isinstance(pid, int) and run.get("host") == socket.gethostname():
        return status if _process_alive(pid) else "interrupted"
    return status


@contextmanager
def _marked_if_stopped(path: Path, run_info: dict[str, Any]) -> Iterator[None]:
    """Should the block stop on an error or Ctrl-C, rewrite ``run.json`` at ``path`` as ``"interrupted"``
    with the error, and let the error go on."""
    try:
        yield
    except BaseException as error:
        stopped = {"status": "interrupted", "error": f"{type(error).__name__}: {error}".rstrip(": ")}
        write_json(path, run_info | stopped)
        raise


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
    with _run_folder(run_dir) as folder:
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
        with _marked_if_stopped(folder / TRAINING_FILE, run_info):
            metrics = _MetricsLog(folder / METRICS_JSONL)
            recorder, signals, tensors, tensor_log = None, None, None, None
            if watchdog.rules and settings.watch_every:
                recorder, signals = SignalRecorder(model), _MetricsLog(folder / SIGNALS_JSONL)
                tensors = TensorRecorder.for_rules(model, watchdog.rules)
                tensor_log = _MetricsLog(folder / TENSORS_JSONL) if tensors is not None else None
            confusion = "confusion" in records_read(watchdog.rules)
            alerts(watchdog.labels(_label_counts(task.labels, train_labels)))
            if monitor is not None:
                monitor.record(loaded, 0)
                alerts(watchdog.attention(monitor.latest))  # type: ignore[arg-type]

            step, window, dev_step = 0, deque(maxlen=settings.log_every), -1
            model.train()
            for epoch in range(settings.epochs):
                for batch in length_batches(np.minimum(counts, limit), settings.batch_size, rng):
                    if watchdog.stop is not None:
                        break
                    texts_b = None if train.texts_b is None else [train.texts_b[i] for i in batch]
                    inputs = ([train.texts[i] for i in batch], texts_b, [train_labels[i] for i in batch])
                    watched = recorder if recorder and (step + 1) % settings.watch_every == 0 else None
                    measured = tensors if watched else None
                    loss, rate = _train_step(
                        loaded, inputs, limit, optimizer, schedule, precision, watched, measured
                    )
                    step += 1
                    window.append(loss)
                    if monitor is not None:
                        monitor.loss(step, loss)
                    alerts(watchdog.train(step, loss))
                    if watched is not None and signals is not None:
                        record: SignalRecord = watched.after_update(step, rate)
                        signals.add(**record.to_json())
                        alerts(watchdog.signals(record))
                    if measured is not None and tensor_log is not None:
                        measures = measured.record(step)
                        tensor_log.add(**measures.to_json())
                        alerts(watchdog.tensors(measures))
                    position = {"step": step, "epoch": round(step / batches_per_epoch, 4)}
                    if step % settings.log_every == 0:
                        seconds = round(time.perf_counter() - started, 2)
                        metrics.add(**position, split="train", loss=float(np.mean(window)),
                                    learning_rate=rate, seconds=seconds)  # fmt: skip
                    if on_progress is not None:
                        on_progress(TrainingProgress(step, total, float(np.mean(window)), rate))
                    if monitor is not None and monitor.step(loaded, step):
                        alerts(watchdog.attention(monitor.latest))  # type: ignore[arg-type]
                    epoch_end = step == (epoch + 1) * batches_per_epoch
                    if epoch_end or (settings.eval_every and step % settings.eval_every == 0):
                        with precision.forward():
                            dev_accuracy, dev_loss, dev_confusion = evaluate(
                                loaded, task.dev, dev_labels, limit
                            )
                        metrics.add(**position, split="dev", loss=dev_loss, accuracy=dev_accuracy,
                                    seconds=round(time.perf_counter() - started, 2))  # fmt: skip
                        dev_step = step
                        alerts(
                            watchdog.dev(step, dev_loss, dev_accuracy, dev_confusion if confusion else None)
                        )
            if dev_step != step:  # stopped by a rule after the last evaluation
                with precision.forward():
                    dev_accuracy, dev_loss, _ = evaluate(loaded, task.dev, dev_labels, limit)
                metrics.add(step=step, epoch=round(step / batches_per_epoch, 4), split="dev",
                            loss=dev_loss, accuracy=dev_accuracy,
                            seconds=round(time.perf_counter() - started, 2))  # fmt: skip
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
