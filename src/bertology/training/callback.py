"""The attention monitor and the training rules as Hugging Face ``TrainerCallback``s, for training with
``transformers.Trainer``.

```python
loaded = bertology.load_model("default", classifier=True, labels=["0", "1"])
monitor = AttentionMonitor("run/monitor.zarr", ProbeSet(texts), every=50)
trainer = Trainer(model=loaded.model, args=args, train_dataset=data,
                  callbacks=[MonitorCallback(monitor, loaded)])
```

The model must be the one in ``loaded`` (its attention routed through bertology's capture, as
:func:`~bertology.models.loading.load_model` prepares it). Records: step 0 when training begins, every
``monitor.every`` optimizer steps, and the last step when training ends; the archive's ``losses`` get the
Trainer's logged training loss at each logging step (every step with ``logging_steps=1``).

:class:`RulesCallback` evaluates the same rules as ``bertology finetune`` (:mod:`bertology.training.rules`)::

    watchdog = Watchdog(select_rules("default"), stop_on=["exploding_gradient"])
    callbacks = [MonitorCallback(monitor, loaded), RulesCallback(watchdog, loaded, every=50, monitor=monitor)]

It feeds the watchdog the Trainer's logged training loss (one value per logging step:
``logging_steps=1`` gives the rules every step's loss, as :func:`~bertology.training.finetune` does) and
evaluations (``loss``, ``eval_loss``, ``eval_accuracy``), the per-layer signals of every ``every``-th
optimizer step, the monitor's records
(when given) and the training labels' counts (when given); an alert of a ``stop_on`` rule ends training
(``control.should_training_stop``). The Trainer clips gradients before any callback sees them, so the
gradient norms here are after clipping (``max_grad_norm``), unlike :func:`~bertology.training.finetune`'s.
SageMaker Debugger's rules (``select_rules("smdebug")``) get their tensor statistics the same way
(:mod:`~bertology.training.tensor_recorder`); the Trainer's evaluations carry no confusion matrix, so
``one_class_predictions``, ``Confusion`` and ``ClassImbalance``'s misprediction check see none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from bertology.models.loading import LoadedModel
from bertology.training.monitor import AttentionMonitor
from bertology.training.rules import Alert, Watchdog
from bertology.training.signals import SignalRecorder
from bertology.training.tensor_recorder import TensorRecorder


class MonitorCallback(TrainerCallback):
    """Calls ``monitor`` at the Trainer's step boundaries (``state.global_step`` is the step recorded)."""

    def __init__(self, monitor: AttentionMonitor, loaded: LoadedModel) -> None:
        self.monitor = monitor
        self.loaded = loaded

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.monitor.record(self.loaded, state.global_step)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.monitor.step(self.loaded, state.global_step)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if logs and "loss" in logs and state.global_step > 0:
            self.monitor.loss(state.global_step, float(logs["loss"]))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.monitor.record(self.loaded, state.global_step)


class RulesCallback(TrainerCallback):
    """Evaluates ``watchdog``'s rules during a Trainer run (module docstring).

    every: measure the per-layer signals every this many optimizer steps. monitor: the run's attention
    monitor (its records feed the attention rules). label_counts: ``{label: training examples}``.
    on_alert: called with each alert as it fires (``watchdog.alerts`` keeps them all).
    """

    def __init__(
        self,
        watchdog: Watchdog,
        loaded: LoadedModel,
        *,
        every: int,
        monitor: AttentionMonitor | None = None,
        label_counts: dict[str, int] | None = None,
        on_alert: Callable[[Alert], None] | None = None,
    ) -> None:
        self.watchdog = watchdog
        self.recorder = SignalRecorder(loaded.model)
        self.tensors = TensorRecorder.for_rules(loaded.model, watchdog.rules)
        self.every = every
        self.monitor = monitor
        self.label_counts = label_counts
        self.on_alert = on_alert
        self._watching: ExitStack | None = None
        self._rate = 0.0
        self._fed_step: int | None = None

    def _raise(self, alerts: list[Alert], control: TrainerControl) -> None:
        if self.on_alert is not None:
            for alert in alerts:
                self.on_alert(alert)
        if self.watchdog.stop is not None:
            control.should_training_stop = True

    def _feed_monitor(self, control: TrainerControl) -> None:
        latest = None if self.monitor is None else self.monitor.latest
        if latest is not None and latest.step != self._fed_step:
            self._fed_step = latest.step
            self._raise(self.watchdog.attention(latest), control)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.label_counts is not None:
            self._raise(self.watchdog.labels(self.label_counts), control)
        self._feed_monitor(control)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if (state.global_step + 1) % self.every == 0:
            self._watching = ExitStack()
            self._watching.enter_context(self.recorder.activations())
            if self.tensors is not None:
                self._watching.enter_context(self.tensors.watching())

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._watching is not None:
            self._watching.close()  # the forward pass is over
            self.recorder.gradients()
            if self.tensors is not None:
                self.tensors.tensors()
            self.recorder.before_update()
            self._rate = float(kwargs["optimizer"].param_groups[0]["lr"])

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._watching is not None:
            self._watching = None
            record = self.recorder.after_update(state.global_step + 1, self._rate)
            self._raise(self.watchdog.signals(record), control)
            if self.tensors is not None:
                self._raise(self.watchdog.tensors(self.tensors.record(state.global_step + 1)), control)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._feed_monitor(control)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        logs = logs or {}
        if "loss" in logs:
            self._raise(self.watchdog.train(state.global_step, float(logs["loss"])), control)
        if "eval_loss" in logs:
            accuracy = float(logs.get("eval_accuracy", math.nan))
            self._raise(self.watchdog.dev(state.global_step, float(logs["eval_loss"]), accuracy), control)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._feed_monitor(control)
