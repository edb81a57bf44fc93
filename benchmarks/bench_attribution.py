"""Benchmark self-attention attribution (Hao et al. 2021; issue 26) on a classifier and SST-2's dev set.

Scores every head by the paper's importance (the largest entry of its attribution matrix, averaged over
the first ``--examples`` dev sentences, the gold label's probability attributed, Riemann sum of
``--steps`` steps), then measures dev accuracy on the first ``--max-dev`` sentences with more and more
heads removed (gate 0): lowest attribution first, and in ``--seeds`` seeded random orders. Prints the
curves as a Markdown table, the time per example, and for how many points of the curve attribution
pruning kept at least the random orders' mean accuracy.

Run: ``.venv/bin/python benchmarks/bench_attribution.py [--model benchmarks/out/sst2_run] [--examples 200]
[--max-dev 872] [--threads 1]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from bertology.corpus.readers.glue import read_glue
from bertology.interventions.attention_attribution import attribution_importance
from bertology.interventions.curves import pruning_curve, removal_counts
from bertology.interventions.data import LabelledTexts
from bertology.interventions.task import ClassifierTask
from bertology.models.loading import load_model

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="benchmarks/out/sst2_run")
    parser.add_argument("--task", default=str(SST2))
    parser.add_argument("--examples", type=int, default=200, help="dev sentences that score the heads")
    parser.add_argument("--max-dev", type=int, default=872, help="dev sentences the curves are measured on")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, classifier=True)
    task = read_glue(args.task, max_dev=args.max_dev)
    data = LabelledTexts.of_split(loaded, task, task.dev)
    started = time.perf_counter()
    importance = attribution_importance(loaded, data.part(0, args.examples), steps=args.steps)
    seconds = time.perf_counter() - started
    heads = loaded.num_layers * loaded.num_heads
    counts = removal_counts(heads)
    task = ClassifierTask(loaded, data)
    by_attribution = pruning_curve(task, importance.removal_order(), counts, batch_size=32)
    random_curves = []
    for seed in range(args.seeds):
        order = np.random.default_rng(seed).permutation(heads)
        random_curves.append(
            pruning_curve(
                task,
                [(int(i // loaded.num_heads), int(i % loaded.num_heads)) for i in order],
                counts,
                batch_size=32,
            )
        )
    random_mean = np.mean(random_curves, axis=0)
    print(
        f"{loaded.name}: {loaded.num_layers} x {loaded.num_heads} heads; importance on {importance.examples} "
        f"dev sentences in {seconds:.0f} s ({seconds / importance.examples:.2f} s per example, Riemann "
        f"{args.steps} steps, {torch.get_num_threads()} torch threads); curves on {len(data)} dev sentences."
    )
    print("| heads removed | " + " | ".join(map(str, counts)) + " |")
    print("|---" * (len(counts) + 1) + "|")
    print("| lowest attribution first | " + " | ".join(f"{v:.3f}" for v in by_attribution) + " |")
    for seed, curve in enumerate(random_curves):
        print(f"| random, seed {seed} | " + " | ".join(f"{v:.3f}" for v in curve) + " |")
    print(f"| random, mean of {args.seeds} | " + " | ".join(f"{v:.3f}" for v in random_mean) + " |")
    inner = slice(1, -1)  # neither all heads kept nor all removed
    wins = int(np.sum(by_attribution[inner] >= random_mean[inner]))
    print(f"Attribution at or above the random mean at {wins} of {len(counts) - 2} inner points.")
    layers = np.argsort(importance.scores.ravel())[:10]
    print(
        "Lowest-scored heads (layer, head):",
        [(int(i // loaded.num_heads), int(i % loaded.num_heads)) for i in layers],
    )


if __name__ == "__main__":
    main()
