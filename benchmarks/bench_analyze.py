"""Benchmark `bertology analyze`: throughput against a plain forward pass, flat memory, JS speed.

1. Throughput: on N segments of at most 128 tokens built (the Clark way) from the Wikipedia text of
   GAP (``../shared/data/gap``), the full analysis (``analyze_corpus``: reading and segmenting the
   corpus, encoding, capture, every accumulator) against the default model's plain forward pass with
   ``attn_implementation="sdpa"`` and no attentions on the same batches, already encoded, in the same
   run: after a warm-up of each, the two alternate ``--repeats`` times. Ratio = forward time /
   analysis time (1.0 is the limit); the median is reported with the range.
2. Peak memory (max RSS of a fresh process) analysing 1000 and 4000 segments.
3. JS divergences: the vectorised accumulator against a straightforward loop over head pairs (numpy,
   vectorised over tokens) on the same attention maps.
4. ``--breakdown N``: where the analysis time goes, on the same N segments' batches timed four ways (best
   of two): the sdpa forward; the forward routed through capture with a consumer that does nothing
   (eager attention, encoding); plus the row summary; plus the JS rows and the accumulators.

Run: ``.venv/bin/python benchmarks/bench_analyze.py [--segments 1000] [--memory 1000 4000]``
"""

from __future__ import annotations

import argparse
import csv
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.special import rel_entr, xlogy
from transformers import AutoModel

import bertology
from bertology.allocator import keep_freed_memory
from bertology.analysis.analyze import (
    BATCH_SIZE,
    PAD_MULTIPLE,
    CorpusAccumulators,
    analyze_corpus,
    batch_texts,
    corpus_batches,
)
from bertology.analysis.distances import DistanceAccumulator
from bertology.analysis.settings import AnalysisSettings
from bertology.attention.capturing import encode_for_model, stream_batch
from bertology.corpus.batching import iter_batches
from bertology.corpus.encoding import encode
from bertology.corpus.segments import Segment, iter_segments
from bertology.models.loading import default_model_path
from bertology.stats.rows import RowSummarizer, SpecialTokens

GAP = Path(__file__).resolve().parents[2] / "shared" / "data" / "gap"
BATCH = BATCH_SIZE


def gap_corpus(target: Path, copies: int = 1) -> Path:
    """GAP's Wikipedia texts as a plain-text corpus: one document per row, one sentence per line."""
    lines: list[str] = []
    for name in ("gap-development.tsv", "gap-validation.tsv"):
        with (GAP / name).open(encoding="utf-8") as handle:
            for row in csv.DictReader(handle, delimiter="\t"):
                lines += [*re.split(r"(?<=[.!?])\s+", row["Text"].strip()), ""]
    target.write_text("\n".join(lines * copies), encoding="utf-8")
    return target


def model_inputs(loaded: bertology.LoadedModel, batch: list[Segment]) -> dict[str, torch.Tensor]:
    """A batch of segments encoded and padded as the analysis pads them."""
    texts = batch_texts(batch)
    return encode(loaded.tokenizer, *texts, max_length=128, pad_to_multiple_of=PAD_MULTIPLE).model_inputs


def throughput(corpus: Path, segments: int, repeats: int) -> None:
    """The forward pass and the analysis, alternately ``repeats`` times after a warm-up; each analysis is
    compared with the forward pass timed just before it, and the median ratio is reported."""
    keep_freed_memory()  # as `bertology analyze` does before its first batch
    loaded = bertology.load_model()
    sdpa = AutoModel.from_pretrained(default_model_path(), attn_implementation="sdpa").eval()
    warnings.simplefilter("ignore", bertology.TruncationWarning)  # analyze_corpus counts them
    batches = [
        model_inputs(loaded, batch)
        for batch in corpus_batches(corpus, loaded.tokenizer, limit=segments, batch_size=BATCH)
    ]

    def forward_seconds() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for encoded in batches:
                sdpa(**encoded)
        return time.perf_counter() - start

    def analysis_seconds() -> float:
        return analyze_corpus(corpus, loaded, AnalysisSettings(limit=segments, batch_size=BATCH)).seconds

    forward_seconds(), analysis_seconds()  # warm-up
    pairs = [(forward_seconds(), analysis_seconds()) for _ in range(repeats)]
    ratios = sorted(forward / analysis for forward, analysis in pairs)
    runs = "; ".join(f"{forward:.1f} s / {analysis:.1f} s" for forward, analysis in pairs)
    print(
        f"| throughput, {segments} segments | sdpa forward / analysis: {runs} "
        f"| median ratio {ratios[len(ratios) // 2]:.2f} (range {ratios[0]:.2f}-{ratios[-1]:.2f}) |",
        flush=True,
    )


def softmax_timing(repeats: int = 30) -> None:
    """One layer's attention at analysis size (16 x 12 heads x 128 tokens x 32 dims): BERT's eager with the
    softmax into a new buffer, the hook's in-place softmax, and the fused sdpa kernel (mean ms)."""
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(16, 12, 128, 32, generator=generator) for _ in range(3))
    mask = torch.zeros(16, 1, 1, 128)
    mask[:8, ..., 100:] = torch.finfo(torch.float32).min

    def eager(in_place: bool) -> torch.Tensor:
        scores = torch.matmul(query * 32**-0.5, key.transpose(2, 3)).add_(mask)
        probs = torch.softmax(scores, -1, out=scores) if in_place else torch.softmax(scores, -1)
        return torch.matmul(probs, value)

    ways = {
        "softmax into a new buffer": lambda: eager(False),
        "softmax in place (bertology's hook)": lambda: eager(True),
        "sdpa (fused, no probabilities)": lambda: torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask
        ),
    }
    with torch.inference_mode():
        for name, way in ways.items():
            way()
            start = time.perf_counter()
            for _ in range(repeats):
                way()
            print(
                f"| one layer's attention, {name} | {1000 * (time.perf_counter() - start) / repeats:.2f} ms |"
            )


def breakdown(corpus: Path, segments: int) -> None:
    keep_freed_memory()  # as `bertology analyze` does before its first batch
    loaded = bertology.load_model()
    sdpa = AutoModel.from_pretrained(default_model_path(), attn_implementation="sdpa").eval()
    warnings.simplefilter("ignore", bertology.TruncationWarning)
    batches = list(corpus_batches(corpus, loaded.tokenizer, limit=segments, batch_size=BATCH))
    special = SpecialTokens.of(loaded)

    def sdpa_forward() -> None:
        with torch.inference_mode():
            for batch in batches:
                sdpa(**model_inputs(loaded, batch))

    def streamed(summarise: bool) -> None:
        for batch in batches:
            consumer = (lambda encoded: RowSummarizer(encoded, special).add_layer) if summarise else None
            encoded = encode_for_model(
                loaded, *batch_texts(batch), max_length=128, pad_to_multiple_of=PAD_MULTIPLE, warn=False
            )
            stream_batch(encoded, consumer or (lambda encoded: lambda probs: None), model=loaded)

    def full() -> None:
        accumulators = CorpusAccumulators(loaded)
        for batch in batches:
            accumulators.update(batch)

    stages = {
        "sdpa forward (with encoding)": sdpa_forward,
        "capture, no-op consumer": lambda: streamed(False),
        "+ row summary": lambda: streamed(True),
        "+ JS rows and accumulators (CorpusAccumulators.update)": full,
    }
    times = {}
    for name, stage in stages.items():
        stage()  # warm-up
        best = float("inf")
        for _ in range(2):
            start = time.perf_counter()
            stage()
            best = min(best, time.perf_counter() - start)
        times[name] = best
    base = times["sdpa forward (with encoding)"]
    for name, seconds in times.items():
        per_batch = 1000 * seconds / len(batches)
        print(f"| {name} | {per_batch:.0f} ms per batch of {BATCH} | {seconds / base:.2f} |", flush=True)


def peak_memory_mb(corpus: Path, segments: int) -> float:
    code = (
        "import resource, bertology; from bertology.allocator import keep_freed_memory; "
        "from bertology.analysis.analyze import analyze_corpus; "
        "from bertology.analysis.settings import AnalysisSettings; keep_freed_memory(); "
        f"analyze_corpus({str(corpus)!r}, bertology.load_model(), "
        f"AnalysisSettings(limit={segments}, batch_size={BATCH})); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1]) / 1024


def js_loop_textbook(rows: np.ndarray) -> np.ndarray:
    """Straightforward loop: for every head pair, JS = KL(p||m)/2 + KL(q||m)/2 summed over tokens.

    rows: [heads, tokens, keys]."""
    heads = rows.shape[0]
    result = np.zeros((heads, heads))
    for i in range(heads):
        for j in range(heads):
            mix = (rows[i] + rows[j]) / 2
            result[i, j] = 0.5 * rel_entr(rows[i], mix).sum() + 0.5 * rel_entr(rows[j], mix).sum()
    return result


def js_loop_precomputed(rows: np.ndarray) -> np.ndarray:
    """A stricter loop over head pairs: sum p ln p per head is computed once, only m ln m per pair."""
    heads = rows.shape[0]
    plogp = xlogy(rows, rows).reshape(heads, -1).sum(-1)
    result = np.zeros((heads, heads))
    for i in range(heads):
        for j in range(heads):
            mix = (rows[i] + rows[j]) / 2
            result[i, j] = 0.5 * (plogp[i] + plogp[j]) - xlogy(mix, mix).sum()
    return result


def js_speed(corpus: Path, segments: int) -> None:
    loaded = bertology.load_model()
    batch = next(iter_batches(iter_segments(corpus, loaded.tokenizer, max_length=128), segments))
    attention = bertology.capture_batch(*batch_texts(batch), model=loaded, max_length=128)
    start = time.perf_counter()
    accumulator = DistanceAccumulator()
    accumulator.update(attention)
    fast = accumulator.result().js_sum
    fast_s = time.perf_counter() - start
    for name, loop in (
        ("textbook loop", js_loop_textbook),
        ("precomputed-entropy loop", js_loop_precomputed),
    ):
        start = time.perf_counter()
        reference = np.zeros_like(fast)
        for index, n in enumerate(attention.lengths):
            probs = attention.probs[index, :, :, :n, :n].double().numpy()  # [layers, heads, n, n]
            reference += loop(probs.reshape(-1, n, n))
        loop_s = time.perf_counter() - start
        print(
            f"| JS divergences, {len(batch)} segments, {fast.shape[0]} heads, all tokens "
            f"| vectorised {fast_s:.2f} s "
            f"| {name} over head pairs {loop_s:.1f} s | {loop_s / fast_s:.0f}x faster "
            f"| max difference {np.abs(fast - reference).max():.1e} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="forward / analysis pairs timed")
    parser.add_argument("--memory", type=int, nargs="*", default=[1000, 4000])
    parser.add_argument("--js-segments", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--breakdown", type=int, default=0, help="segments for the time breakdown (0: skip)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        corpus = gap_corpus(Path(folder) / "gap.txt", copies=2)
        print(f"machine: {torch.get_num_threads()} threads; corpus: GAP dev+validation texts x2")
        if args.breakdown:
            softmax_timing()
            breakdown(corpus, args.breakdown)
        throughput(corpus, args.segments, args.repeats)
        memory = {count: peak_memory_mb(corpus, count) for count in args.memory}
        for count, megabytes in memory.items():
            print(f"| peak memory, {count} segments | {megabytes:.0f} MB |")
        if len(memory) == 2:
            low, high = memory.values()
            print(
                f"| memory growth {args.memory[0]} -> {args.memory[1]} segments "
                f"| {100 * (high / low - 1):+.1f}% |"
            )
        if args.js_segments:
            js_speed(corpus, args.js_segments)
        print(f"(this process: max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
