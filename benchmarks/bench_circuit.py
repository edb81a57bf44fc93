"""Benchmark circuit discovery (issue 44) on smollm2-135m and the shipped IOI pairs.

Times, against one plain forward pass of the clean inputs (every group of pairs of one token count):

1. EAP over every edge of the graph (the clean and corrupted runs recorded, one forward and backward pass);
2. EAP-IG with ``--ig-steps`` points (default 5, MIB's);
3. the whole faithfulness curve: MIB's 10 sizes for the method's ranking and a random one, and the empty
   circuit (at most 21 masked passes: each circuit pruned as MIB prunes it, and one pruned to nothing, or
   that keeps every edge, is the empty or the full circuit, whose metrics the plain runs give).

and prints each as a multiple of the plain pass, the curves' CPR and CMD (EAP, EAP-IG, random), and the
largest resident memory of the process. Beside EAP and EAP-IG it times the least work their definitions
need, with nothing of bertology in it (the floor): EAP's activation difference needs the corrupted run and
the clean one, its gradient a backward pass through the clean one, so a plain pass of the corrupted prompts
and one pass with gradients of the clean ones (the metric's gradient taken at the embeddings: a backward
pass through every layer, as the gradient at every node's input needs); EAP-IG's, the clean run and
``--ig-steps`` passes with gradients. Each timing is wall-clock and this process's CPU seconds
(``time.process_time``) of one run; torch runs ``--threads`` threads (default 1: on a shared 2-core
machine two OpenMP threads wait on each other). The plain pass is the median of :data:`PLAIN_RUNS` runs
after one untimed run; every other step is run twice and both are printed, the first (what one ``bertology
circuit`` run meets: memory the process has not yet touched) and the second (as warm as the plain pass).

Run: ``python benchmarks/bench_circuit.py [--model smollm2-135m] [--pairs 18] [--ig-steps 5] [--threads 1]``
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable

import numpy as np
import torch

from bertology.interventions.circuit import RANDOM
from bertology.interventions.circuit_faithfulness import (
    FRACTIONS,
    areas,
    curve,
    empty_metric,
    random_ranking,
    ranking,
    replacements,
)
from bertology.interventions.circuit_pass import circuit_graph
from bertology.interventions.circuit_scores import attribution_scores, circuit_runs
from bertology.interventions.patching_pairs import encode_pairs, ioi_pairs, read_pairs
from bertology.models.loading import load_model
from bertology.options import CircuitMethod

#: The plain pass every step is measured against is the median of this many runs (one varies by 5 to 15 %).
PLAIN_RUNS = 5


def timed(work: Callable[[], object]) -> tuple[np.ndarray, object]:
    """([wall seconds, CPU seconds] of one call of ``work``, its result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return np.array((time.perf_counter() - wall, time.process_time() - cpu)), result


def twice(work: Callable[[], object], one: np.ndarray) -> tuple[str, object]:
    """(the CPU seconds of two calls of ``work`` and each as a multiple of ``one``'s, the second's
    result)."""
    first, _ = timed(work)
    second, result = timed(work)
    return (
        f"first {first[1]:.2f} s CPU ({first[1] / one[1]:.1f} plain passes), "
        f"second {second[1]:.2f} s ({second[1] / one[1]:.1f})"
    ), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--pairs", type=int, default=18)
    parser.add_argument("--ig-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, language_model=True)
    pairs = read_pairs(ioi_pairs())[: args.pairs]
    encoded = encode_pairs(loaded, pairs)
    graph = circuit_graph(loaded)
    print(
        f"{loaded.name}: {graph.layers} layers, {graph.heads} heads ({graph.key_value_heads} key/value), "
        f"{graph.edge_count} edges; {len(pairs)} pairs in {len(encoded.groups)} groups"
    )

    def plain() -> None:
        with torch.no_grad():
            for group in encoded.groups:
                loaded.model(**group.clean)

    plain()  # warm up
    one = np.median([timed(plain)[0] for _ in range(PLAIN_RUNS)], axis=0)
    print(f"plain forward pass (median of {PLAIN_RUNS}): {one[0]:.2f} s wall, {one[1]:.2f} s CPU")

    def scores(method: CircuitMethod) -> np.ndarray:
        runs = [
            circuit_runs(loaded, group, "noising", "logit-diff", method, args.ig_steps)
            for group in encoded.groups
        ]
        total = sum(attribution_scores(loaded, run) for run in runs)
        return (total / len(pairs)).numpy()  # type: ignore[union-attr]

    found = {}
    scorers = [circuit_runs(loaded, group, "noising", "logit-diff").score for group in encoded.groups]

    def floor(steps: int) -> None:
        for group, score in zip(encoded.groups, scorers, strict=True):
            with torch.no_grad():
                loaded.model(**(group.corrupted if steps == 1 else group.clean))
            for _ in range(steps):
                embeddings = loaded.model.get_input_embeddings()(group.clean["input_ids"]).detach()
                embeddings.requires_grad_(True)
                inputs = {key: value for key, value in group.clean.items() if key != "input_ids"}
                logits = loaded.model(inputs_embeds=embeddings, **inputs).logits
                torch.autograd.grad(score(logits).sum(), embeddings)

    for name, steps in (("eap", 1), ("eap-ig", args.ig_steps)):
        spent, _ = twice(lambda steps=steps: floor(steps), one)
        print(f"{name}'s floor: {spent}")

    for name in ("eap", "eap-ig"):
        spent, found[name] = twice(lambda name=name: scores(name), one)
        print(f"{name}: {spent}")

    runs = [circuit_runs(loaded, group, "noising", "logit-diff") for group in encoded.groups]
    carried = replacements(runs, "counterfactual")
    real = graph.real
    full = sum(float(run.metric("clean").sum()) for run in runs) / len(pairs)

    def whole_curve(order_of: np.ndarray) -> list[list[float]]:
        empty = empty_metric(loaded, runs, carried, "counterfactual")
        return [
            curve(loaded, runs, carried, order, graph, full, empty)
            for order in (order_of, random_ranking(real, 0))
        ]

    for name, table in found.items():
        order = ranking(table, real)
        spent, (method_curve, random_curve) = twice(lambda order=order: whole_curve(order), one)  # type: ignore[misc]
        print(f"{name} curve (10 sizes, method and random): {spent}")
        for label, values in ((name, method_curve), (RANDOM, random_curve)):
            cpr, cmd = areas(values, FRACTIONS)
            print(f"  {label}: CPR {cpr:.3f}, CMD {cmd:.3f}; f = " + ", ".join(f"{v:.2f}" for v in values))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"largest resident memory: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
