"""Benchmark issue 27's attribution for generation and decoder corpus analysis on SmolLM2-135M, CPU.

``--part explain``: seconds per prompt of each saliency method alone on the next token (the defaults:
50 Gauss-Legendre steps for integrated gradients, 50 samples for SmoothGrad, copies in batches of 16), of
the heads' direct logit attribution alone (one forward pass with hooks) and of ``explain`` with all of
them. ``--part analyze``: ``analyze_corpus`` over the first ``--segments`` segments of the sample corpus
(128 tokens each at most), statistics (the attention sink among them), patterns and JS distances.
Memory: the process's peak resident set (``ru_maxrss``) and what it was with the model loaded; run each
part in its own process so the peaks are that part's.

Run: ``.venv/bin/python benchmarks/bench_decoder_attribution.py --part explain|analyze [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch

from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.corpus.encoding import encode
from bertology.corpus.segments import sample_corpus
from bertology.interventions import direct_logit_attribution, explain
from bertology.interventions.saliency import METHODS
from bertology.models.loading import LoadedModel, load_model

PROMPTS = [
    "The capital of France is",
    "When Mary and John went to the store, John gave a drink to",
    "The quick brown fox jumps over the lazy",
    "In 1969, the first person to walk on the",
]


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(run, items: list[str]) -> list[float]:  # type: ignore[no-untyped-def]
    seconds = []
    for item in items:
        start = time.perf_counter()
        run(item)
        seconds.append(time.perf_counter() - start)
    return seconds


def explain_part(loaded: LoadedModel) -> None:
    explain(loaded, PROMPTS[0], methods=["gradient"])  # warm-up
    print("| what | mean s / prompt | max s |\n|---|---|---|")
    for method in METHODS:
        seconds = timed(lambda text, m=method: explain(loaded, text, methods=[m]), PROMPTS)
        print(f"| {method} (with the heads) | {statistics.mean(seconds):.2f} | {max(seconds):.2f} |")

    def heads_only(text: str) -> None:
        inputs = loaded.model_inputs(encode(loaded.tokenizer, [text], max_length=loaded.max_length))
        direct_logit_attribution(loaded, inputs, 0)

    seconds = timed(heads_only, PROMPTS)
    print(f"| direct logit attribution alone | {statistics.mean(seconds):.3f} | {max(seconds):.3f} |")
    seconds = timed(lambda text: explain(loaded, text), PROMPTS)
    print(f"| all four methods and the heads | {statistics.mean(seconds):.2f} | {max(seconds):.2f} |")


def analyze_part(loaded: LoadedModel, segments: int) -> None:
    settings = AnalysisSettings(max_length=128, limit=segments, examples_per_head=0)
    start = time.perf_counter()
    analysis = analyze_corpus(sample_corpus(), loaded, settings)
    seconds = time.perf_counter() - start
    sink = analysis.surface["sink"]
    print(
        f"analyze: {analysis.segments} segments in {seconds:.1f} s ({seconds / analysis.segments:.2f} s per "
        f"segment); mean sink {sink.mean():.3f}, {int((sink > 0.5).sum())} of {sink.size} heads above 0.5"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["explain", "analyze"], required=True)
    parser.add_argument("--segments", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2-135m", device="cpu", language_model=args.part == "explain")
    loaded_mb = peak_mb()
    print(f"{loaded.name}, {args.threads} torch thread(s), load average {os.getloadavg()[0]:.1f}\n")
    if args.part == "explain":
        explain_part(loaded)
    else:
        analyze_part(loaded, args.segments)
    print(
        f"\npeak resident memory {peak_mb():.0f} MB (model loaded: {loaded_mb:.0f} MB); load average at the "
        f"end {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
