"""Benchmark `bertology index` (corpus search) on UD EWT train: build time against the plain forward pass,
index size, peak memory, search recall and query latency through the API.

1. Build: ``build_index`` over UD EWT train (``../shared/data/ud_ewt``, or its first ``--sentences``) at
   ``--layers``, in a fresh process (its peak RSS is the build's memory), against the plain forward pass
   (the same model, tokenizer and length-sorted batches, no hidden states or attentions kept) in this one.
   Both use ``--threads`` torch threads (default: torch's own default, one per core, as a user runs
   them); the HNSW graphs are built with as many.
2. Size of the index folder; recall@10 of the last layer's index against exact search over the same stored
   vectors (300 random tokens).
3. Query latency through the API (``POST /api/search/input`` with a token, k=10, in-process test client):
   200 queries over UD EWT dev sentences, p50 / p95 (the query's own forward pass included).

Run: ``.venv/bin/python benchmarks/bench_index.py [--sentences 0] [--layers 1,3,5] [--threads 0]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from fastapi.testclient import TestClient

import bertology
from bertology.corpus.batching import length_sorted_batches
from bertology.index.token_index import TokenIndex, encode_segment, read_indexed_segments
from bertology.server import create_app

EWT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_ewt"


def corpus_file(sentences: int, folder: Path) -> Path:
    """UD EWT train, or its first ``sentences`` sentences."""
    train = EWT / "en_ewt-ud-train.conllu"
    if not sentences:
        return train
    blocks = train.read_text(encoding="utf-8").split("\n\n")[:sentences]
    part = folder / "train-part.conllu"
    part.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    return part


def plain_forward_seconds(corpus: Path, loaded: bertology.LoadedModel) -> tuple[float, int]:
    """Seconds to read, encode and run the plain forward pass over the corpus as the index batches it."""
    start, tokens = time.perf_counter(), 0
    segments = enumerate(read_indexed_segments(corpus, loaded.tokenizer, 128))
    for batch in length_sorted_batches(segments, lambda item: len(item[1].words), batch_size=32):
        inputs = [encode_segment(loaded.tokenizer, segment, 128)[0] for _, segment in batch]
        padded = loaded.tokenizer.pad(inputs, return_tensors="pt", pad_to_multiple_of=8)
        with torch.inference_mode():
            loaded.model(**padded)
        tokens += int(padded["attention_mask"].sum())
    return time.perf_counter() - start, tokens


def build_in_child(corpus: Path, out: Path, layers: str, threads: int) -> dict[str, float]:
    script = (
        "import json, resource, sys, time, torch\n"
        f"torch.set_num_threads({threads})\n"
        "from bertology.index.token_index import build_index\n"
        "start = time.perf_counter()\n"
        f"build_index({str(corpus)!r}, {str(out)!r}, layers=[{layers}], threads={threads})\n"
        "print(json.dumps({'seconds': time.perf_counter() - start,"
        " 'peak_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def recall_at_10(index: TokenIndex, layer: int) -> float:
    stored = index.vectors(np.arange(len(index)), layer).astype(np.float32)
    queries = np.random.default_rng(0).choice(len(stored), 300, replace=False)
    rows, _ = index.search(stored[queries], layer, k=10)
    exact = np.argsort(-(stored[queries] @ stored.T), axis=1)[:, :10]
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact, strict=True)]))


def query_latency_ms(out: Path, loaded: bertology.LoadedModel, layer: int) -> tuple[float, float]:
    texts = [
        line[len("# text = ") :]
        for line in (EWT / "en_ewt-ud-dev.conllu").read_text(encoding="utf-8").splitlines()
        if line.startswith("# text = ")
    ][:200]
    times = []
    with TestClient(create_app([loaded], index=out)) as client:
        for number, text in enumerate(texts):
            body = {"text": text, "layer": layer, "token": 1 + number % 3, "k": 10}
            start = time.perf_counter()
            answer = client.post("/api/search/input", json=body)
            times.append(time.perf_counter() - start)
            assert answer.status_code in (200, 422), answer.text  # 422: a one-token sentence
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 95) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=0, help="First sentences of train (0: all).")
    parser.add_argument("--layers", default="1,3,5")
    parser.add_argument(
        "--threads", type=int, default=0, help="Torch threads of both passes (0: torch's default, all cores)."
    )
    args = parser.parse_args()
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    loaded = bertology.load_model()
    with tempfile.TemporaryDirectory() as temp:
        corpus = corpus_file(args.sentences, Path(temp))
        out = Path(temp) / "index"
        plain_forward_seconds(corpus if args.sentences else corpus_file(200, Path(temp)), loaded)  # warm-up
        corpus = corpus_file(args.sentences, Path(temp))
        forward, tokens = plain_forward_seconds(corpus, loaded)
        built = build_in_child(corpus, out, args.layers, args.threads)
        size = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
        index = TokenIndex.open(out)
        last = index.layers[-1]
        recall = recall_at_10(index, last)
        p50, p95 = query_latency_ms(out, loaded, last)
    print(f"corpus: {corpus.name}, {len(index.segments)} sentences, {len(index)} tokens ({tokens} forward)")
    print(
        f"plain forward {forward:.1f} s; build at layers {args.layers} {built['seconds']:.1f} s "
        f"({built['seconds'] / forward:.2f}x); threads {args.threads}"
    )
    print(
        f"index size {size / 2**20:.1f} MiB; build peak RSS {built['peak_mib']:.0f} MiB; "
        f"this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    print(f"recall@10 (layer {last}) {recall:.3f}; query through the API p50 {p50:.1f} ms, p95 {p95:.1f} ms")


if __name__ == "__main__":
    main()
