"""Benchmark the interpretation methods of issue 26: seconds per example of each saliency method and
each attack on SST-2 dev sentences.

Each of ``explain``'s methods runs alone (``methods=[name]``, the defaults: 50 Gauss-Legendre steps for
integrated gradients, 50 samples at noise level 0.01 for SmoothGrad, copies in batches of 16), then
``attack`` with input reduction (beam 3) and HotFlip (whole words, until the prediction changes, at most
``--max-flips`` swaps). HotFlip's whole-word vocabulary is worked out once per tokenizer; that first
call is timed separately and left out of the per-example figures. The attacks' rows also say how far
they went: tokens left after reduction, swaps made and how many inputs flipped.

``--model`` is a run folder (``bertology finetune``) or ``default``: the default model with a fresh,
seeded classification head (predictions near chance; the same code paths and costs).

Run: ``.venv/bin/python benchmarks/bench_interpretation.py [--model default] [--examples 20] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from bertology.corpus.readers.glue import read_glue
from bertology.interventions.attacks import attack, replacement_entries
from bertology.interventions.saliency import METHODS, explain
from bertology.models.loading import LoadedModel, load_model

SST2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue" / "SST-2"


def classifier(model: str) -> LoadedModel:
    if model == "default":
        torch.manual_seed(0)
        return load_model(classifier=True, labels=["0", "1"], device="cpu")
    return load_model(model, classifier=True, device="cpu")


def per_example(run, texts: list[str]) -> tuple[list[float], list[object]]:  # type: ignore[no-untyped-def]
    """Wall seconds of ``run(text)`` for each text, and the results."""
    seconds, results = [], []
    for text in texts:
        start = time.perf_counter()
        results.append(run(text))
        seconds.append(time.perf_counter() - start)
    return seconds, results


def row(name: str, seconds: list[float], note: str = "") -> None:
    print(
        f"| {name} | {statistics.mean(seconds):.3f} | {statistics.median(seconds):.3f} | {max(seconds):.3f} "
        f"| {note} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-flips", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = classifier(args.model)
    texts = read_glue(SST2).dev.texts[: args.examples]
    tokens = [len(loaded.tokenizer(text)["input_ids"]) for text in texts]
    print(
        f"{loaded.name}, {len(texts)} SST-2 dev sentences ({statistics.mean(tokens):.1f} tokens on average, "
        f"{min(tokens)}-{max(tokens)}), {args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f}"
    )
    explain(loaded, texts[0], methods=["gradient"])  # warm-up
    print("\n| method | mean s / example | median s | max s | note |\n|---|---|---|---|---|")
    for method in METHODS:
        seconds, _ = per_example(lambda text, m=method: explain(loaded, text, methods=[m]), texts)
        row(method, seconds)
    seconds, _ = per_example(lambda text: explain(loaded, text), texts)
    row("all four together", seconds, "the gradient is shared by gradient and input-x-gradient")

    seconds, results = per_example(lambda text: attack(loaded, text, method="input-reduction"), texts)
    kept = [
        sum(not r.special[p] for p in r.result.positions) / int((~r.special).sum()) if r.result else 1.0
        for r in results
    ]
    row("input-reduction (beam 3)", seconds, f"{statistics.mean(kept):.0%} of the tokens left on average")

    start = time.perf_counter()
    replacement_entries(loaded)
    vocabulary_seconds = time.perf_counter() - start
    seconds, results = per_example(
        lambda text: attack(loaded, text, method="hotflip", max_flips=args.max_flips), texts
    )
    swaps = statistics.mean(len(r.steps) for r in results)
    flipped = sum(r.flipped for r in results)
    row(
        f"hotflip (at most {args.max_flips} swaps)",
        seconds,
        f"{flipped}/{len(results)} flipped, {swaps:.1f} swaps on average; whole-word vocabulary: "
        f"{vocabulary_seconds:.2f} s once",
    )
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
