"""What decides a fine-tuning run, and what it reports as it goes; plain data that imports nothing heavy,
so the command line can show the defaults without loading torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bertology.errors import BertologyError
from bertology.options import DEFAULT_DEVICE, DEFAULT_DTYPE, MAX_SEED, MAX_THREADS, Dtype


@dataclass(frozen=True)
class FinetuneSettings:
    """Everything that decides a run (the defaults: SST-2 in an estimated 8 to 10 minutes on 2 idle CPU
    cores, dev accuracy 0.88; see benchmarks/RESULTS.md).

    model: ``"default"`` (all-MiniLM-L6-v2), a hub name or a folder. max_train / max_dev: examples used
    (None: all); the training examples are a seeded random sample, the dev examples the first ones.
    max_length: tokens per input, special tokens included. learning_rate: peak AdamW rate, reached after
    ``warmup`` (a fraction of all steps). eval_every: also evaluate every this many steps (None: only at
    each epoch's end). log_every: steps per training-loss row. watch_every: steps between attention
    records (0: no monitor). probe_set: examples in the monitor's probe set, drawn from the dev split.
    threads: torch threads during the run (None: torch's default, one per core). On a machine busy with
    other work, 1 thread can be several times faster than 2 (they wait for each other).
    device: where the model trains (:data:`~bertology.options.DEVICE_FORMS`). dtype: the precision of the
    forward passes (mixed precision: the weights and the optimizer stay float32, since AdamW's small
    updates vanish in a bfloat16 weight; float16 scales the loss against underflow).
    rules: the training rules evaluated as the run goes (:mod:`bertology.training.rules`): ``"default"``
    (ours), ``"smdebug"`` (SageMaker Debugger's), ``"none"`` or ``"NAME,NAME,..."``; the per-layer signals
    they read are measured every ``watch_every`` steps. rule_params: ``"NAME.PARAM=VALUE"`` entries that
    set a selected rule's parameter. stop_on: rule names whose first alert stops the run (status
    ``"stopped"``).
    """

    model: str = "default"
    max_train: int | None = 30_000
    max_dev: int | None = None
    epochs: int = 1
    max_length: int = 64
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup: float = 0.1
    weight_decay: float = 0.01
    seed: int = 0
    eval_every: int | None = 250
    log_every: int = 10
    watch_every: int = 100
    probe_set: int = 8
    threads: int | None = None
    device: str = DEFAULT_DEVICE
    dtype: Dtype = DEFAULT_DTYPE
    rules: str = "default"
    stop_on: tuple[str, ...] = ()
    rule_params: tuple[str, ...] = ()

    def check(self) -> None:
        """Raises BertologyError for settings that cannot run."""
        positive = {"epochs": self.epochs, "max_length": self.max_length, "batch_size": self.batch_size}
        positive |= {"log_every": self.log_every, "probe_set": self.probe_set}
        optional = {"max_train": self.max_train, "max_dev": self.max_dev, "eval_every": self.eval_every}
        optional |= {"threads": self.threads}
        for name, value in positive.items():
            if value < 1:
                raise BertologyError(f"{name.replace('_', '-')} must be at least 1, not {value}.")
        for name, value in optional.items():
            if value is not None and value < 1:
                raise BertologyError(f"{name.replace('_', '-')} must be at least 1, not {value}.")
        if self.watch_every < 0:
            raise BertologyError(f"watch-every must be 0 (no monitor) or more, not {self.watch_every}.")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0 and 0 <= self.warmup < 1):
            raise BertologyError(
                "The learning rate must be finite and positive and the warm-up fraction in [0, 1)."
            )
        if not 0 <= self.seed <= MAX_SEED:
            raise BertologyError(f"seed must be from 0 to {MAX_SEED}, not {self.seed}.")
        if self.threads is not None and self.threads > MAX_THREADS:
            raise BertologyError(f"threads must be at most {MAX_THREADS}, not {self.threads}.")
        from bertology.training.rules import rule_names, select_rules, stop_names

        select_rules(self.rules, self.rule_params)  # unknown names and bad parameters

        unwatched = sorted(set(stop_names(self.stop_on)) - set(rule_names(self.rules)))
        if unwatched:
            raise BertologyError(
                f"stop-on names {', '.join(unwatched)}, which --rules {self.rules} leaves out."
            )


@dataclass(frozen=True)
class TrainingProgress:
    """Reported after each optimizer step: step (1-based) of total, mean loss over the last ``log_every``
    steps, and the learning rate used for this step."""

    step: int
    total: int
    loss: float
    learning_rate: float
