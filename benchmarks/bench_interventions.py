"""Benchmark head ablation and structural pruning (issue 5) on a classifier and a GLUE dev set.

1. Single-head ablation sweep over every head: the sweep that reuses each batch's lower layers (and
   batches examples of similar length) against the naive loop of full forward passes, once through
   ``predict_logits`` (batches in input order, what a user would write) and once on the sweep's own
   length-sorted batches (so the ratio isolates the reuse of the lower layers). All three must give the
   same per-head accuracies; the ratios are naive seconds / sweep seconds.
2. Structural pruning: copies of the model without 0, 25 and 50% of the heads (least important first,
   Michel et al.'s normalised importance on the same dev examples), their dev accuracy and the fastest
   of ``--repeats`` timed forward passes over the same batches, against the unpruned model (the two
   take turns, so a changing load on a shared machine slows both alike).

``--model`` is a run folder (``bertology finetune``) or ``default``: the default model with a fresh,
seeded classification head (accuracies near chance; the timings do not depend on the head).
``--threads`` sets torch's CPU threads (on a shared machine, 1 thread gives steadier timings).

Run: ``.venv/bin/python benchmarks/bench_interventions.py [--model default] [--max-dev 200] [--threads 1]
[--parts sweep pruning]``
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

from bertology.corpus.readers.glue import read_glue
from bertology.interventions.ablation import ablation_sweep
from bertology.interventions.data import LabelledTexts, batches
from bertology.interventions.gates import head_gates
from bertology.interventions.importance import head_importance
from bertology.interventions.pruning import prune_and_measure
from bertology.interventions.task import ClassifierTask
from bertology.models.classify import accuracy
from bertology.models.loading import LoadedModel, load_model

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2"


def classifier(model: str, labels: list[str]) -> LoadedModel:
    if model == "default":
        torch.manual_seed(0)
        return load_model(classifier=True, labels=labels)
    return load_model(model, classifier=True)


def naive_on_sorted_batches(loaded: LoadedModel, data: LabelledTexts, batch_size: int) -> np.ndarray:
    """[layers, heads] accuracy with each head removed: one full forward pass per head and batch, over the
    same length-sorted batches as the sweep."""
    encoded = list(batches(loaded, data, batch_size=batch_size, by_length=True))
    scores = np.zeros((loaded.num_layers, loaded.num_heads))
    with torch.inference_mode():
        for layer in range(loaded.num_layers):
            for head in range(loaded.num_heads):
                logits = np.empty((len(data), loaded.model.config.num_labels), np.float32)
                with head_gates(loaded, {layer: [head]}):
                    for batch in encoded:
                        logits[batch.rows] = loaded.model(**batch.inputs).logits.numpy()
                scores[layer, head] = accuracy(logits, data.labels)
    return scores


def timed(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """(result, (wall seconds, CPU seconds of this process))."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args, **kwargs)
    return result, (time.perf_counter() - wall, time.process_time() - cpu)


def sweep(loaded: LoadedModel, data: LabelledTexts, batch_size: int) -> None:
    task = ClassifierTask(loaded, data)
    fast, fast_s = timed(ablation_sweep, task, batch_size=batch_size)
    naive, naive_s = timed(ablation_sweep, task, batch_size=batch_size, reuse_lower_layers=False)
    sorted_scores, sorted_s = timed(naive_on_sorted_batches, loaded, data, batch_size)
    same = np.array_equal(fast.scores, naive.scores) and fast.baseline == naive.baseline
    same_sorted = np.array_equal(fast.scores, sorted_scores)
    heads = fast.scores.size
    print(f"Single-head ablation, {heads} heads x {len(data)} dev examples (accuracy {fast.baseline:.4f}):")
    print("| method | wall s | CPU s | sweep speed-up (wall / CPU) | same per-head accuracies as the sweep |")
    print("|---|---|---|---|---|")
    rows = (
        ("sweep: lower layers reused, length-sorted batches", fast_s, "-"),
        ("naive: a full pass per head (input order)", naive_s, same),
        ("naive: full passes on the sweep's sorted batches", sorted_s, same_sorted),
    )
    for name, (wall, cpu), equal in rows:
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {wall / fast_s[0]:.2f} / {cpu / fast_s[1]:.2f} | {equal} |",
            flush=True,
        )


def pruning(loaded: LoadedModel, data: LabelledTexts, batch_size: int, repeats: int) -> None:
    task = ClassifierTask(loaded, data)
    order = head_importance(task).removal_order()
    print(f"\nStructural pruning, least important heads first, {len(data)} dev examples, batch {batch_size}:")
    print("| heads removed | parameters | dev accuracy | seconds (pruned / unpruned) | speed-up |")
    print("|---|---|---|---|---|")
    for share in (0.0, 0.25, 0.5):
        count = round(share * len(order))
        _, outcome = prune_and_measure(task, order[:count], batch_size=batch_size, repeats=repeats)
        print(
            f"| {count} of {len(order)} ({share:.0%}) | {outcome.parameters:,} | {outcome.value:.4f} "
            f"(unpruned {outcome.baseline:.4f}) | {outcome.seconds:.2f} / "
            f"{outcome.baseline_seconds:.2f} | {outcome.speedup:.2f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="Run folder, or 'default' (fresh head).")
    parser.add_argument("--task", type=Path, default=SST2, help="GLUE-style task folder.")
    parser.add_argument("--max-dev", type=int, default=200, help="First N dev examples.")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="Timed passes per model (the fastest counts).")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's).")
    parser.add_argument("--parts", nargs="+", choices=("sweep", "pruning"), default=["sweep", "pruning"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = read_glue(args.task, max_dev=args.max_dev)
    loaded = classifier(args.model, task.labels)
    data = LabelledTexts.of_split(loaded, task, task.dev)
    print(
        f"Model {loaded.name} ({loaded.num_layers} x {loaded.num_heads} heads), task {task.name}, "
        f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}.\n",
        flush=True,
    )
    if "sweep" in args.parts:
        sweep(loaded, data, args.batch_size)
    if "pruning" in args.parts:
        pruning(loaded, data, args.batch_size, args.repeats)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
