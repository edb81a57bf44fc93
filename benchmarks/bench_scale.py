"""Benchmark corpus analysis on Ray against one process: throughput, scaling, Ray's overhead.

On N segments of at most 128 tokens built (the Clark way) from the Wikipedia text of GAP (as
``bench_analyze.py`` builds them), with the default model:

1. local: ``analyze_corpus`` in this process with 2 torch threads;
2. Ray, 2 workers x 1 thread and 1 worker x 1 thread on a local Ray cluster of 2 CPUs
   (``analyze_on_pool``, shards of ``--shard`` segments); start-up (``ray.init`` and the workers' start,
   model loading included) is timed apart and not counted in the throughput;
3. local with 1 thread, the reference for the 1-worker run: the difference, per shard, is the whole
   cost of going through Ray (shipping segments, returning and merging accumulators, scheduling);
4. Ray's own round trip per shard: the same shards sent to 2 workers that do nothing with them.

Every distributed result is checked against the local 1-thread run (heads and JS divergences to 1e-9
relative: each worker runs 1 thread); the 2-thread local run differs from it by float32 rounding (torch's
CPU kernels round differently with other thread counts), which the table shows.
Scaling efficiency = Ray 2 x 1 throughput / (2 x Ray 1 x 1 throughput). The machine's load average is
printed before and after: the numbers are only comparable on an otherwise idle machine.

Run: ``.venv/bin/python benchmarks/bench_scale.py [--segments 4000] [--shard 256]``
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray
import torch
from bench_analyze import gap_corpus

import bertology
from bertology.allocator import keep_freed_memory
from bertology.analysis.analyze import CorpusAnalysis, analyze_corpus, corpus_batches
from bertology.analysis.settings import AnalysisSettings
from bertology.cluster.analyze import AnalysisJob, analyze_on_pool
from bertology.cluster.shards import SHARD_SEGMENTS, Shard, shards_of
from bertology.cluster.workers import ClusterOptions, WorkerPool
from bertology.models.loading import ModelSpec

#: Segments of at most 128 tokens in one copy of GAP's texts (the corpus repeats them for more).
GAP_SEGMENTS = 2700


@dataclass(frozen=True)
class NoWork:
    """A job whose workers return at once: what is left is Ray's round trip for a shard."""

    def start(self) -> NoWork:
        return self

    def run(self, shard: Shard) -> int:
        return shard.segments


def relative_difference(distributed: CorpusAnalysis, local: CorpusAnalysis) -> float:
    """The largest relative difference of the heads' statistics and JS divergence sums."""
    numbers = local.heads_frame().select_dtypes("number").columns
    pairs = [
        (distributed.heads_frame()[numbers].to_numpy(float), local.heads_frame()[numbers].to_numpy(float)),
        (distributed.distances.js_sum, local.distances.js_sum),
    ]
    assert distributed.segments == local.segments
    worst = 0.0
    for got, expected in pairs:
        kept = np.isfinite(expected) & (expected != 0)
        worst = max(worst, float(np.max(np.abs(got[kept] - expected[kept]) / np.abs(expected[kept]))))
    return worst


def local_run(corpus: Path, segments: int, threads: int) -> tuple[CorpusAnalysis, float]:
    torch.set_num_threads(threads)
    loaded = bertology.load_model()
    start = time.perf_counter()
    analysis = analyze_corpus(corpus, loaded, AnalysisSettings(limit=segments))
    return analysis, time.perf_counter() - start


def ray_run(
    corpus: Path, segments: int, workers: int, shard: int
) -> tuple[CorpusAnalysis, float, float, int]:
    """(analysis, start-up seconds, run seconds, shards)."""
    loaded = bertology.load_model()
    options = ClusterOptions(workers=workers, threads_per_worker=1, setup=keep_freed_memory)
    with WorkerPool(AnalysisJob(ModelSpec(), AnalysisSettings(limit=segments)), options) as pool:
        start = time.perf_counter()
        analysis = analyze_on_pool(pool, corpus, loaded, segments_per_shard=shard)
        seconds = time.perf_counter() - start
        shards = -(-segments // shard)
        return analysis, pool.startup_seconds, seconds, shards


def round_trip(corpus: Path, segments: int, shard: int) -> tuple[float, int]:
    """Seconds per shard for 2 workers that do nothing, the shards already segmented."""
    loaded = bertology.load_model()
    shards = list(shards_of(corpus_batches(corpus, loaded.tokenizer, limit=segments), shard))
    with WorkerPool(NoWork(), ClusterOptions(workers=2)) as pool:
        start = time.perf_counter()
        assert sum(count for _, count in pool.map_ordered(shards)) == segments
        return (time.perf_counter() - start) / len(shards), len(shards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=4000)
    parser.add_argument("--shard", type=int, default=SHARD_SEGMENTS)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    keep_freed_memory()  # as `bertology analyze` does (the Ray workers get it as their setup)
    with tempfile.TemporaryDirectory() as folder:
        corpus = gap_corpus(Path(folder) / "gap.txt", copies=-(-args.segments // GAP_SEGMENTS))
        local_run(corpus, 64, threads=2)  # warm-up: first batches, lazy imports
        local, local_seconds = local_run(corpus, args.segments, threads=2)
        one_thread, one_thread_seconds = local_run(corpus, args.segments, threads=1)
        rate = {"local, 2 threads": args.segments / local_seconds}
        differences = {"local, 2 threads": relative_difference(local, one_thread)}
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        init_seconds = time.perf_counter() - start
        startup: dict[str, float] = {}
        shards = 0
        for workers in (2, 1):
            name = f"Ray, {workers} x 1 thread"
            analysis, startup[name], seconds, shards = ray_run(corpus, args.segments, workers, args.shard)
            rate[name] = args.segments / seconds
            differences[name] = relative_difference(analysis, one_thread)
            assert differences[name] <= 1e-9, (name, differences[name])  # the same threads per process
        rate["local, 1 thread"] = args.segments / one_thread_seconds
        differences["local, 1 thread"] = 0.0
        per_shard, count = round_trip(corpus, args.segments, args.shard)
        ray.shutdown()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"\n{args.segments} segments, shards of {args.shard} ({shards} shards)\n")
    print(
        "| run | segments/s | relative to local 2 threads | largest relative difference to local 1 thread |"
    )
    print("|---|---|---|---|")
    for name, value in rate.items():
        print(f"| {name} | {value:.1f} | {value / rate['local, 2 threads']:.2f} | {differences[name]:.1e} |")
    efficiency = rate["Ray, 2 x 1 thread"] / (2 * rate["Ray, 1 x 1 thread"])
    overhead = (args.segments / rate["Ray, 1 x 1 thread"] - one_thread_seconds) / shards
    print(f"\nscaling efficiency 1 -> 2 workers: {efficiency:.2f}")
    print(f"Ray 1 x 1 against local 1 thread: {overhead * 1000:.0f} ms per shard")
    print(
        f"Ray round trip of a shard to a worker that does nothing: {per_shard * 1000:.1f} ms ({count} shards)"
    )
    print(
        f"start-up: ray.init {init_seconds:.1f} s; workers ready (model loaded): "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in startup.items())
    )


if __name__ == "__main__":
    main()
