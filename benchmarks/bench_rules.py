"""Benchmark the training rules' overhead on `bertology finetune` (issue 26): the time they add to the
optimizer steps at the default --watch-every, as a share of the step time.

With the default settings (the default model, batches of 32, max-len 64) on SST-2 it measures, in one
process and on the same batches:

- the plain optimizer step (``loop._train_step``) and the watched step (the same with the per-layer
  signals: activation hooks, gradient norms, a copy of the weights, update norms), interleaved so that
  a busy machine slows both alike; medians;
- the attention monitor's extra work at a record (each head's change since the previous record);
- one evaluation of every default rule by the watchdog, on the history of a whole default run (938
  steps: a training loss per step, 9 signal and attention records, 3 evaluations), per kind of record.

Per ``watch_every`` steps a run adds one watched step, one change and the evaluations of that many
steps' records (``watch_every`` training losses, one signal and one attention record,
``watch_every / eval_every`` evaluations); the overhead is that time over ``watch_every`` plain steps.

With ``--rules smdebug`` (SageMaker Debugger's rules, issue 33) the watched step also measures what those
rules read (``TensorRecorder``: gradient and weight statistics, activation activity, token counts), and
the evaluations are of Debugger's 16 rules, with tensor records and dev confusion matrices in the history.

Run: ``.venv/bin/python benchmarks/bench_rules.py [--steps 16] [--threads N] [--rules smdebug]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2"


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="plain and watched steps each")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rules", default="default", help="the rules measured: default or smdebug")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import get_linear_schedule_with_warmup

    from bertology.attention.capturing import capture_batch
    from bertology.corpus.readers.glue import read_glue
    from bertology.models.loading import load_model
    from bertology.training.compare import head_change
    from bertology.training.loop import _MixedPrecision, _optimizer, _train_step
    from bertology.training.monitor import ProbeSet
    from bertology.training.rules import AttentionRecord, Watchdog, select_rules
    from bertology.training.settings import FinetuneSettings
    from bertology.training.signals import SignalRecorder
    from bertology.training.tensor_recorder import TensorRecorder

    settings = FinetuneSettings()
    task = read_glue(SST2, max_train=settings.batch_size * args.steps * 2, max_dev=64)
    torch.manual_seed(0)
    loaded = load_model(settings.model, classifier=True, labels=task.labels, device="cpu")
    labels = task.label_ids(task.train)
    optimizer = _optimizer(loaded.model, settings)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, 1000)
    precision = _MixedPrecision(loaded.device, torch.float32)
    recorder = SignalRecorder(loaded.model)
    rules = select_rules(args.rules)
    tensors = TensorRecorder.for_rules(loaded.model, rules)
    loaded.model.train()
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()}", flush=True)

    plain, watched = [], []
    size = settings.batch_size
    for index in range(2 * args.steps + 2):
        rows = range(index % (2 * args.steps) * size, (index % (2 * args.steps) + 1) * size)
        inputs = ([task.train.texts[i] for i in rows], None, [labels[i] for i in rows])
        watch = recorder if index % 2 else None
        start = time.perf_counter()
        measure = tensors if watch is not None else None
        _train_step(loaded, inputs, settings.max_length, optimizer, schedule, precision, watch, measure)
        if watch is not None:
            record = watch.after_update(index, schedule.get_last_lr()[0])
        if measure is not None:
            tensor_record = measure.record(index)
        seconds = time.perf_counter() - start
        if index >= 2:  # the first two warm up
            (watched if watch is not None else plain).append(seconds)
    step, step_watched = statistics.median(plain), statistics.median(watched)

    probe = ProbeSet.sample(task.dev, settings.probe_set, settings.seed)
    loaded.model.eval()
    batch = capture_batch(probe.texts, model=loaded, max_length=settings.max_length)
    lengths = [int(n) for n in batch.encoded.lengths]
    probs = batch.probs.float().numpy()
    examples = [probs[i, ..., :n, :n] for i, n in enumerate(lengths)]
    change_seconds = min(timed(head_change, examples, examples)[0] for _ in range(3))

    # A whole default run's history: 938 steps, a loss per step, records every 100, evaluations every 250.
    rng = np.random.default_rng(0)
    layers, heads = loaded.num_layers, loaded.num_heads
    names = ("cls", "sep", "entropy")
    watchdog = Watchdog(rules)
    confusion = np.array([[380, 48], [80, 364]])
    watchdog.labels({"0": 13000, "1": 17000})
    for at in range(1, 938):
        watchdog.train(at, 0.7 * np.exp(-at / 300) + 0.2 + 0.01 * rng.random())
        if at % 100 == 0:
            watchdog.signals(record)
            if tensors is not None:
                watchdog.tensors(tensor_record)
            stats = rng.random((3, layers, heads)) + np.array([0, 0, 1.0])[:, None, None]
            watchdog.attention(AttentionRecord(at, names, stats, rng.random((layers, heads)) * 1e-2))
        if at % 250 == 0:
            watchdog.dev(at, 0.3, 0.85, confusion)
    history = watchdog.history
    costs = {
        "train": timed(watchdog.train, 940, 0.25)[0],
        "signals": timed(watchdog.signals, record)[0],
        "attention": timed(watchdog.attention, history.attention[-1])[0],
        "dev": timed(watchdog.dev, 940, 0.3, 0.85, confusion)[0],
    }
    if tensors is not None:
        costs["tensors"] = timed(watchdog.tensors, tensor_record)[0]
    every = settings.watch_every
    evaluations = (
        costs["train"] * every
        + costs["signals"]
        + costs["attention"]
        + costs["dev"] * every / (settings.eval_every or every)
        + costs.get("tensors", 0.0)
    )
    added = (step_watched - step) + change_seconds + evaluations
    print(f"plain step: median {step * 1e3:.0f} ms over {len(plain)}")
    print(
        f"watched step: median {step_watched * 1e3:.0f} ms over {len(watched)} "
        f"(+{(step_watched - step) * 1e3:.1f} ms)"
    )
    print(f"monitor: each head's change since the previous record {change_seconds * 1e3:.1f} ms")
    print(
        f"rule evaluation (all {len(rules)} {args.rules} rules) per record: "
        + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in costs.items())
    )
    print(
        f"per {every} steps: {added * 1e3:.1f} ms added to {every * step:.1f} s of steps = "
        f"{100 * added / (every * step):.2f} % of the step time"
    )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
