"""Where the circuit benchmark's time goes (issue 44), smollm2-135m on the shipped IOI pairs: each masked pass
of the faithfulness curve, and EAP-IG with its points one, two or four to a pass with gradients.

1. Every curve size of an EAP ranking and of a random one (seed 0), pruned as ``curve`` prunes it: its kept
   edges after pruning, the layers the pass skips, and its CPU time in plain forward passes (circuits pruned
   to nothing, or of every edge, run no pass and are left out).
2. For each ``--points`` setting, in a fresh process: three EAP-IG scorings (5 steps) in a row, each in plain
   passes, and the process's peak memory (the first scoring meets memory the process has not touched yet).

The plain pass is the median of 5 runs of the clean prompts; one torch thread.

Run: ``python benchmarks/bench_circuit_passes.py [--points 1 2 4]``
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import numpy as np
import torch

from bertology.interventions import circuit_scores
from bertology.interventions.circuit_faithfulness import (
    circuit_metric,
    edge_counts,
    random_ranking,
    ranking,
    replacements,
    top_edges,
)
from bertology.interventions.circuit_pass import circuit_graph
from bertology.interventions.circuit_scores import attribution_scores, circuit_runs
from bertology.interventions.patching_pairs import encode_pairs, ioi_pairs, read_pairs
from bertology.models.loading import load_model


def setup() -> tuple[object, object, float]:
    """(the model, its one group of 18 IOI pairs, the median CPU seconds of a plain pass)."""
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m", language_model=True)
    (group,) = encode_pairs(loaded, read_pairs(ioi_pairs())[:18]).groups

    def plain() -> float:
        start = time.process_time()
        with torch.no_grad():
            loaded.model(**group.clean)
        return time.process_time() - start

    plain()
    return loaded, group, float(np.median([plain() for _ in range(5)]))


def masked_passes() -> None:
    loaded, group, one = setup()
    graph = circuit_graph(loaded)
    run = circuit_runs(loaded, group, "noising", "logit-diff", "eap")
    order = ranking(attribution_scores(loaded, run).numpy(), graph.real)
    carried = replacements([run], "counterfactual")
    print(f"plain pass {one:.3f} s CPU; each masked pass in plain passes")
    print("| ranking | edges | kept after pruning | layers skipped | plain passes |")
    print("|---|---|---|---|---|")
    total = 0.0
    for name, edges in (("eap", order), ("random", random_ranking(graph.real, 0))):
        for count in edge_counts(graph.edge_count):
            kept = graph.pruned(top_edges(edges, count, graph.real.shape))
            if not kept.any() or kept.sum() == graph.edge_count:
                continue
            by_layer = kept[1:].any(1).reshape(graph.layers, graph.heads + 1).any(1)
            start = time.process_time()
            circuit_metric(loaded, [run], carried, kept)
            spent = (time.process_time() - start) / one
            total += spent
            print(f"| {name} | {count} | {int(kept.sum())} | {int((~by_layer).sum())} | {spent:.2f} |")
    print(f"all of them: {total:.1f} plain passes")


def scorings(points: int) -> None:
    loaded, group, one = setup()
    circuit_scores._TOKENS_PER_GRADIENT_PASS = points * group.clean["input_ids"].numel()
    spent = []
    for _ in range(3):
        start = time.process_time()
        attribution_scores(loaded, circuit_runs(loaded, group, "noising", "logit-diff", "eap-ig", 5))
        spent.append((time.process_time() - start) / one)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"| {points} | " + " | ".join(f"{value:.1f}" for value in spent) + f" | {peak:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args()
    if args.one is not None:
        scorings(args.one)
        return
    masked_passes()
    print("\n| EAP-IG points a pass | first | second | third scoring (plain passes) | peak GiB |")
    print("|---|---|---|---|---|")
    for points in args.points:
        child = [sys.executable, __file__, "--one", str(points)]
        print(subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip())


if __name__ == "__main__":
    main()
