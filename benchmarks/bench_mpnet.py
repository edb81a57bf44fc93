"""Benchmark the real 12 x 12 model all-mpnet-base-v2 (``load_model("all-mpnet-base-v2")``).

1. ``--equality N``: bertology's capture (MPNet's module route) against the model's own
   ``output_attentions=True`` on N sentence pairs of UD English EWT dev (consecutive sentences as text A
   and text B), captured alone and in padded batches of 8; the reference is a second copy of the model,
   loaded by transformers alone, run on each pair unpadded. Prints the largest absolute difference over
   every layer, head and real token.
2. ``--speed``: the packaged model's assembly (into a fresh cache folder), ``load_model`` (in a fresh
   process, torch and transformers already imported) and one 128-token input: the plain forward pass
   and ``capture`` (median of 10 each).
3. ``--throughput N``: ``analyze_corpus`` on the sample corpus (all of it) and on the first N segments of
   GAP's Wikipedia texts: segments per second, against the plain eager forward pass (no attentions) on the
   same batches, and the peak memory (max RSS) of a fresh process that analyses them.

4. ``--compare-summary DIR``: the key numbers of ``bertology compare default all-mpnet-base-v2 -o DIR``
   (per-layer curves against relative depth, where the matched heads lie).

Run: ``.venv/bin/python benchmarks/bench_mpnet.py --equality 40 --speed --throughput 300``
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench_analyze import gap_corpus, model_inputs
from transformers import AutoModel

import bertology
from bertology.allocator import keep_freed_memory
from bertology.analysis.analyze import BATCH_SIZE, analyze_corpus, corpus_batches
from bertology.analysis.settings import AnalysisSettings
from bertology.corpus.readers.treebank import read_passages
from bertology.corpus.segments import sample_corpus
from bertology.models.model_store import packaged_model_path

NAME = "all-mpnet-base-v2"
EWT_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_ewt" / "en_ewt-ud-dev.conllu"


def reference_model() -> torch.nn.Module:
    """The model as transformers alone loads it (bertology's hooks are on the other copy)."""
    return AutoModel.from_pretrained(packaged_model_path(NAME), attn_implementation="eager").eval()


def equality(pairs: int) -> None:
    loaded = bertology.load_model(NAME)
    reference = reference_model()
    sentences = [" ".join(passage.text) for passage in itertools.islice(read_passages(EWT_DEV), 2 * pairs)]
    texts, texts_b = sentences[0::2], sentences[1::2]
    for size in (1, 8):
        worst, tokens = 0.0, 0
        for start in range(0, len(texts), size):
            chunk, chunk_b = texts[start : start + size], texts_b[start : start + size]
            batch = bertology.capture_batch(chunk, chunk_b, model=loaded)
            for row, (text, text_b) in enumerate(zip(chunk, chunk_b, strict=True)):
                encoded = loaded.tokenizer(text, text_b, return_tensors="pt")
                n = int(batch.lengths[row])
                assert encoded["input_ids"].shape[1] == n, "bertology encoded the pair differently"
                with torch.inference_mode():
                    expected = torch.stack(reference(**encoded, output_attentions=True).attentions)[:, 0]
                worst = max(worst, float((batch.probs[row, :, :, :n, :n] - expected).abs().max()))
                tokens += n
        print(
            f"| capture against output_attentions, {len(texts)} EWT dev pairs ({tokens} tokens), batches of "
            f"{size} | max abs difference {worst:.2e} over 12 layers x 12 heads |",
            flush=True,
        )


def median_ms(run: object, repeats: int = 10) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def speed() -> None:
    with tempfile.TemporaryDirectory() as cache:
        code = (
            "import time; from bertology.models.model_store import packaged_model_path; "
            "t = time.perf_counter(); "
            f"packaged_model_path({NAME!r}); print(time.perf_counter() - t)"
        )
        environment = {**os.environ, "BERTOLOGY_CACHE": cache}
        seconds = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
        ).stdout.split()[-1]
        size = sum(file.stat().st_size for file in Path(cache).rglob("*") if file.is_file())
    print(f"| assembly (join, SHA-256, unzip) | {float(seconds):.1f} s, {size / 1e6:.0f} MB on disk |")
    code = (
        "import time, bertology.models.loading; t = time.perf_counter(); "  # torch and transformers imported
        f"bertology.models.loading.load_model({NAME!r}); print(time.perf_counter() - t)"
    )
    seconds = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    print(f"| load_model({NAME!r}) in a fresh process, assembled | {float(seconds.split()[-1]):.2f} s |")
    loaded = bertology.load_model(NAME)
    reference = reference_model()
    words = " ".join(["word"] * 126)
    encoded = loaded.tokenizer(words, return_tensors="pt")
    assert encoded["input_ids"].shape[1] == 128
    with torch.inference_mode():
        forward = median_ms(lambda: reference(**encoded))
    captured = median_ms(lambda: bertology.capture(words, model=loaded))
    threads = torch.get_num_threads()
    print(f"| forward pass, 1 x 128 tokens, {threads} threads | {forward:.0f} ms (median of 10) |")
    print(f"| capture, 1 x 128 tokens, {threads} threads | {captured:.0f} ms (median of 10) |", flush=True)


def peak_memory_mb(corpus: Path, segments: int | None) -> float:
    code = (
        "import resource, bertology; from bertology.allocator import keep_freed_memory; "
        "from bertology.analysis.analyze import analyze_corpus; "
        "from bertology.analysis.settings import AnalysisSettings; keep_freed_memory(); "
        f"analyze_corpus({str(corpus)!r}, bertology.load_model({NAME!r}), "
        f"AnalysisSettings(limit={segments})); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1]) / 1024


def throughput_row(
    label: str,
    corpus: Path,
    limit: int | None,
    loaded: bertology.LoadedModel,
    reference: torch.nn.Module,
    repeats: int,
) -> str:
    """The analysis of ``corpus`` and the plain eager forward pass on its batches, alternately ``repeats``
    times after a warm-up of each (the machine is shared: each analysis is compared with the forward pass
    just before it); a table row with the median rate and ratio and a fresh process's peak memory."""
    batches = [
        model_inputs(loaded, batch)
        for batch in corpus_batches(corpus, loaded.tokenizer, limit=limit, batch_size=BATCH_SIZE)
    ]

    def forward_seconds() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for encoded in batches:
                reference(**encoded)
        return time.perf_counter() - start

    def analysis() -> tuple[int, float]:
        result = analyze_corpus(corpus, loaded, AnalysisSettings(limit=limit))
        return result.segments, result.seconds

    forward_seconds(), analysis()  # warm-up
    runs = [(forward_seconds(), *analysis()) for _ in range(repeats)]
    rates = sorted(count / seconds for _, count, seconds in runs)
    ratios = sorted(forward / seconds for forward, _, seconds in runs)
    times = ", ".join(f"{forward:.1f} / {seconds:.1f}" for forward, _, seconds in runs)
    return (
        f"| analyze, {label} ({runs[0][1]} segments, {torch.get_num_threads()} threads) "
        f"| {rates[len(rates) // 2]:.1f} segments/s (median of {repeats}); eager forward / analysis "
        f"{times} s, median ratio {ratios[len(ratios) // 2]:.2f} "
        f"| peak RSS {peak_memory_mb(corpus, limit):.0f} MB |"
    )


def throughput(gap_segments: int, repeats: int) -> None:
    keep_freed_memory()  # as `bertology analyze` does before its first batch
    loaded = bertology.load_model(NAME)
    reference = reference_model()
    warnings.simplefilter("ignore", bertology.TruncationWarning)  # analyze_corpus counts them
    with tempfile.TemporaryDirectory() as scratch:
        gap = gap_corpus(Path(scratch) / "gap.txt")
        for label, corpus, limit in [
            ("sample corpus", sample_corpus(), None),
            (f"GAP, first {gap_segments} segments", gap, gap_segments),
        ]:
            print(throughput_row(label, corpus, limit, loaded, reference, repeats), flush=True)


#: The statistics whose per-layer means ``--compare-summary`` prints.
CURVE_STATISTICS = ("previous", "next", "current", "cls", "sep", "punct", "entropy")


def compare_summary(folder: Path) -> None:
    """Key numbers of a ``bertology compare`` folder of two models of different depth: each model's
    per-layer means against relative depth ((layer + 1) / layers), and where the optimal matching puts
    model A's heads in model B (relative depth), with the mean matched JS divergence per layer of A."""
    comparison = json.loads((folder / "comparison.json").read_text(encoding="utf-8"))
    rows = comparison["heads"]
    print("| model | layer | relative depth | " + " | ".join(CURVE_STATISTICS) + " |")
    for side, model in (("a", "model A"), ("b", "model B")):
        layers: dict[int, list[dict]] = collections.defaultdict(list)
        for row in rows:
            if row[f"layer_{side}"] is not None:
                layers[int(row[f"layer_{side}"])].append(row)
        for layer, members in sorted(layers.items()):
            means = [statistics.mean(row[f"{name}_{side}"] for row in members) for name in CURVE_STATISTICS]
            print(
                f"| {comparison['summary'][model]} | {layer} | {(layer + 1) / len(layers):.2f} | "
                + " | ".join(f"{mean:.3f}" for mean in means)
                + " |"
            )
    matched = [row for row in rows if row["layer_a"] is not None and row["layer_b"] is not None]
    depth_b = 1 + max(int(row["layer_b"]) for row in rows)
    depth_a = 1 + max(int(row["layer_a"]) for row in matched)
    print("| layer of A | relative depth | its matched heads in B: mean relative depth (layers) | mean JS |")
    for layer in range(depth_a):
        members = [row for row in matched if row["layer_a"] == layer]
        layers_b = sorted(int(row["layer_b"]) for row in members)
        mean_depth = statistics.mean((layer_b + 1) / depth_b for layer_b in layers_b)
        mean_js = statistics.mean(row["js_divergence"] for row in members)
        print(f"| {layer} | {(layer + 1) / depth_a:.2f} | {mean_depth:.2f} ({layers_b}) | {mean_js:.3f} |")
    labels = collections.Counter((row["label_a"], row["label_b"]) for row in matched)
    print(f"matched pairs by label (A, B): {dict(labels.most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--equality", type=int, metavar="PAIRS", help="EWT dev sentence pairs to compare")
    parser.add_argument("--speed", action="store_true", help="assembly, load and one 128-token input")
    parser.add_argument("--throughput", type=int, metavar="SEGMENTS", help="GAP segments to analyse")
    parser.add_argument("--compare-summary", type=Path, metavar="DIR", help="a `bertology compare` folder")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each in --throughput")
    args = parser.parse_args()
    if args.equality:
        equality(args.equality)
    if args.speed:
        speed()
    if args.throughput:
        throughput(args.throughput, args.repeats)
    if args.compare_summary:
        compare_summary(args.compare_summary)
    print(f"(max RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
