"""The attention monitor as a Hugging Face ``TrainerCallback``, for training with ``transformers.Trainer``.

```python
loaded = bertology.load_model("default", classifier=True, labels=["0", "1"])
monitor = AttentionMonitor("run/monitor.zarr", ProbeSet(texts), every=50)
trainer = Trainer(model=loaded.model, args=args, train_dataset=data,
                  callbacks=[MonitorCallback(monitor, loaded)])
```

The model must be the one in ``loaded`` (its attention routed through bertology's capture, as
:func:`~bertology.models.load_model` prepares it). Records: step 0 when training begins, every
``monitor.every`` optimizer steps, and the last step when training ends.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from bertology.models import LoadedModel
from bertology.training.monitor import AttentionMonitor


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

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.monitor.record(self.loaded, state.global_step)
