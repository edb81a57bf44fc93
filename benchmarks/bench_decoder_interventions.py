"""Benchmark head interventions on a decoder by its language-model loss (issue 27, item 3), on SmolLM2-135M.

1. Induction heads matter for repeated text: the head the induction detector
   (:mod:`bertology.analysis.head_detectors`, on its own seeded sequences) ranks first is removed (gate 0)
   and the next-token loss measured on other seeded repeated random-token sequences, against removing
   each of ``--random-heads`` heads drawn at random (seeded). The loss is given over the whole sequence
   and over its second half alone (the tokens an induction head can predict: each repeats the token
   after an earlier occurrence of the token before it).
2. Time and memory on the CPU: the loss of the sequences, the single-head ablation sweep (seconds per
   head, lower layers reused), Michel et al.'s importance (one backward pass per batch), and structural
   pruning of ``--prune`` of the heads (least important first) with the pruned model's largest logit
   difference to the gated original, its parameters and speed.

Run: ``.venv/bin/python benchmarks/bench_decoder_interventions.py [--sequences 20] [--length 50]
[--sweep-heads 27] [--threads N]``
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from bertology.analysis.head_detectors import detect_heads, repeated_random_tokens
from bertology.corpus.segments import sample_corpus
from bertology.interventions.ablation import ablation_sweep
from bertology.interventions.gates import head_gates
from bertology.interventions.importance import head_importance
from bertology.interventions.language_model import (
    LanguageModelTask,
    TokenSequences,
    language_model_loss,
    next_token_losses,
    token_batches,
)
from bertology.interventions.pruning import prune_and_measure
from bertology.models.loading import LoadedModel, load_model

T = TypeVar("T")


def second_half_loss(
    loaded: LoadedModel, data: TokenSequences, length: int, heads: set[tuple[int, int]]
) -> float:
    """Mean next-token cross-entropy over the predictions of the repeated half (positions ``length + 1``
    onwards predict tokens ``length + 2 ..``; the first token is BOS), with ``heads`` removed."""
    total, count = 0.0, 0
    with torch.inference_mode(), head_gates(loaded, heads):
        for inputs, _ in token_batches(loaded, data):
            mask = inputs["attention_mask"].clone()
            mask[:, : length + 1] = 0  # predictions of tokens in the first half (and of the first repeat) out
            sums, counts = next_token_losses(loaded.model(**inputs).logits, inputs["input_ids"], mask)
            total, count = total + float(sums.sum()), count + int(counts.sum())
    return total / count


def timed(step: Callable[[], T]) -> tuple[T, float]:
    """``step()`` and its wall seconds."""
    started = time.perf_counter()
    value = step()
    return value, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=20)
    parser.add_argument("--length", type=int, default=50)
    parser.add_argument("--random-heads", type=int, default=10)
    parser.add_argument("--sweep-heads", type=int, default=27)
    parser.add_argument("--prune", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded, load_seconds = timed(lambda: load_model("smollm2-135m", language_model=True, device="cpu"))
    print(f"loaded {loaded.name} ({loaded.num_layers} x {loaded.num_heads} heads) in {load_seconds:.1f} s")
    detection, seconds = timed(lambda: detect_heads(loaded, sample_corpus(), segments=4))
    induction = detection.scores["induction"]
    top = tuple(int(i) for i in np.unravel_index(np.argmax(induction), induction.shape))
    print(f"induction detector (seed 0, {seconds:.0f} s): top head L{top[0]} H{top[1]} {induction[top]:.3f}")

    ids = repeated_random_tokens(
        loaded.tokenizer, length=args.length, sequences=args.sequences, seed=args.seed
    )
    data = TokenSequences.of_ids(ids, "repeated random tokens")
    rng = np.random.default_rng(args.seed)
    others = [head for head in np.ndindex(loaded.num_layers, loaded.num_heads) if head != top]
    randoms = [others[i] for i in rng.choice(len(others), size=args.random_heads, replace=False)]

    baseline, loss_seconds = timed(lambda: language_model_loss(loaded, data))
    rows = [("none", baseline, second_half_loss(loaded, data, args.length, set()))]
    for head in [top, *randoms]:
        rows.append(
            (
                f"L{head[0]} H{head[1]} (induction {induction[head]:.3f})",
                language_model_loss(loaded, data, gates={head}),
                second_half_loss(loaded, data, args.length, {head}),
            )
        )
    print(
        f"\nloss on {args.sequences} sequences of 1 + 2 x {args.length} tokens (seed {args.seed}), "
        "nats per token:"
    )
    print("| head removed | loss, whole sequence | change | loss, repeated half | change |")
    print("|---|---|---|---|---|")
    for name, whole, half in rows:
        print(f"| {name} | {whole:.4f} | {whole - baseline:+.4f} | {half:.4f} | {half - rows[0][2]:+.4f} |")
    random_changes = np.array([half - rows[0][2] for _, _, half in rows[2:]])
    print(
        f"random heads, repeated half: mean change {random_changes.mean():+.4f}, "
        f"largest {random_changes.max():+.4f};"
        f" top induction head {rows[1][2] - rows[0][2]:+.4f}"
    )

    print(f"\nCPU ({torch.get_num_threads()} threads), {data.predicted_tokens} predicted tokens:")
    print(f"loss: {loss_seconds:.2f} s")
    sweep_heads = list(np.ndindex(loaded.num_layers, loaded.num_heads))[:: max(1, 270 // args.sweep_heads)]
    task = LanguageModelTask(loaded, data)
    _, seconds = timed(lambda: ablation_sweep(task, heads=sweep_heads))
    print(
        f"single-head ablation: {seconds:.1f} s for {len(sweep_heads)} heads spread over the layers, "
        f"{seconds / len(sweep_heads):.2f} s per head "
        f"(all 270: about {seconds / len(sweep_heads) * 270 / 60:.0f} min)"
    )
    importance, seconds = timed(lambda: head_importance(task, batch_size=8))
    print(f"importance: {seconds:.1f} s ({seconds / len(data):.2f} s per sequence)")
    removed = round(args.prune * loaded.num_layers * loaded.num_heads)
    (_, outcome), seconds = timed(
        lambda: prune_and_measure(task, importance.removal_order()[:removed], batch_size=8)
    )
    print(
        f"pruning {outcome.removed} heads "
        f"({outcome.total_key_value_heads - outcome.key_value_heads} key/value heads): {seconds:.1f} s with "
        f"the timings; largest logit difference to gating {outcome.largest_difference:.2e}; loss "
        f"{outcome.value:.4f} (gated {outcome.gated:.4f}, original {outcome.baseline:.4f}); "
        f"parameters {outcome.parameters:,} of {outcome.baseline_parameters:,}; "
        f"{outcome.speedup:.2f}x as fast"
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of the process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
