"""Benchmark the host pipeline of a corpus run: reading, segmenting and encoding, without the model.

On a GPU the model's work is small and the host's is not (issue: ``analyze`` ran at 1-11% of the plain
forward on an H100, 14.6 of 17.4 s in reading and segmenting). This measures the host side alone, on the
whole of UD English EWT train as CoNLL-U (``../shared/data/ud_ewt``), with the default model's tokenizer:

1. read: the corpus reader's sentences (``bertology.corpus.readers.treebank.read_passages``);
2. read + segment: ``corpus_batches`` (sentences packed into segments of at most 128 tokens, ordered by
   length within windows, cut into batches of 256; without the cache), every batch taken;
3. encode: the same batches encoded as the model receives them (``bertology.corpus.encoding.encode``);
4. the encoded-corpus cache (``bertology.corpus.cache``), in a fresh cache folder: a first run that reads,
   segments and encodes while writing the entry, and a second run that reads the entry, each as
   ``analyze`` takes it (``corpus_batches`` with the encodings, each batch stacked as the model receives
   it); the second run's batches are checked equal to the first's. ``cached_speedup`` = first / second.
   ``needed_per_reader`` is the rate each reader process would need for a GPU's bfloat16 forward pass
   (``GPU_SEGMENTS_PER_S``, issue 37) with 15 readers beside the model on a 16-core machine.
5. reader processes (``bertology.corpus.reader_processes``; ``--readers``, default 1,2,4): the first run
   without the cache (read, segment, encode, each batch stacked as the model receives it) by each number of
   readers; ``readers_N_s`` its seconds, ``readers_N_speedup`` the one-reader time over it, the rate
   per reader beside the rate a 16-core machine's 15 readers would each need, and the CPU seconds of
   this process (``readers_N_parent_cpu_s``: with 1 reader all the work, the tokenizer's threads
   included) and of the reader processes (``readers_N_readers_cpu_s``), of the fastest run. The segments
   of every run are checked equal to one reader's.

``--baseline SRC``: the same three, in the same run, in a subprocess that imports bertology from an older
checkout's ``src`` folder (e.g. a ``git worktree`` of the commit before the change); ratios are
baseline time / this checkout's time. Each stage is timed ``--repeats`` times, best kept.

Run: ``.venv/bin/python benchmarks/bench_host.py --baseline /tmp/base/src``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EWT_TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud_ewt" / "en_ewt-ud-train.conllu"
MAX_LENGTH, BATCH = 128, 256
#: Segments a second a bfloat16 forward pass of a BERT-base-sized model reads on an H100 (issue 37), and the
#: reader processes a 16-core machine has beside the process that drives the model.
GPU_SEGMENTS_PER_S, READERS_BESIDE_GPU = 20_000, 15


def measure(corpus: Path, repeats: int, readers: list[int]) -> dict[str, float | int]:
    """Best seconds of each stage over ``repeats`` runs, and the counts they produced."""
    import bertology
    from bertology.analysis.analyze import batch_texts, corpus_batches
    from bertology.corpus.encoding import encode
    from bertology.corpus.readers.treebank import read_passages

    tokenizer = bertology.load_model().tokenizer

    def read() -> int:
        return sum(1 for _ in read_passages(corpus))

    def segment() -> list:
        return list(corpus_batches(corpus, tokenizer, max_length=MAX_LENGTH, batch_size=BATCH, cache=False))

    def best(work: object) -> tuple[float, object]:
        times, result = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            result = work()  # type: ignore[operator]
            times.append(time.perf_counter() - start)
        return min(times), result

    read_s, sentences = best(read)
    segment_s, batches = best(segment)
    encode_s, _ = best(
        lambda: [
            encode(tokenizer, *batch_texts(batch), max_length=MAX_LENGTH, warn=False) for batch in batches
        ]
    )
    segments = sum(len(batch) for batch in batches)  # type: ignore[union-attr]
    first_s, cached_s = cache_runs(corpus, tokenizer)
    curve = readers_curve(corpus, tokenizer, readers, repeats) if readers else {}
    return {
        "sentences": sentences,  # type: ignore[dict-item]
        "segments": segments,
        "read_s": round(read_s, 3),
        "read_segment_s": round(segment_s, 3),
        "encode_s": round(encode_s, 3),
        "host_pipeline_s": round(segment_s + encode_s, 3),
        "segments_per_s": round(segments / (segment_s + encode_s)),
        "cache_first_s": round(first_s, 3),
        "cache_second_s": round(cached_s, 3),
        "cached_speedup": round(first_s / cached_s, 1),
        "needed_per_reader": round(GPU_SEGMENTS_PER_S / READERS_BESIDE_GPU),
        **curve,
    }


def stacked_batches(corpus: Path, tokenizer: object, *, cache: bool, readers: int | None = None) -> list:
    """The corpus's batches through the encoded-corpus cache or not (``cache``), read by ``readers``
    processes (``None``: the default, so that an older checkout without reader processes runs it too),
    each stacked as ``analyze`` gives it to the model."""
    from bertology.analysis.analyze import corpus_batches
    from bertology.corpus.encoding import stack_rows

    reading = {} if readers is None else {"readers": readers}
    return [
        stack_rows([segment.encoded for segment in batch], tokenizer, pad_to_multiple_of=8)  # type: ignore[arg-type]
        for batch in corpus_batches(
            corpus,
            tokenizer,  # type: ignore[arg-type]
            max_length=MAX_LENGTH,
            batch_size=BATCH,
            encoded_length=MAX_LENGTH,
            cache=cache,
            **reading,  # type: ignore[arg-type]
        )
    ]


def readers_curve(corpus: Path, tokenizer: object, counts: list[int], repeats: int) -> dict[str, float]:
    """Best seconds of :func:`stacked_batches` with each number of readers in ``counts``, the speed-up over
    the first count, and the segments a second each reader made; every run's batches equal the first's."""
    import torch

    curve: dict[str, float] = {}
    first: list | None = None
    for readers in counts:
        times = []  # (wall, this process's CPU, the reader processes' CPU) seconds
        for _ in range(repeats):
            wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
            batches = stacked_batches(corpus, tokenizer, cache=False, readers=readers)
            times.append((time.perf_counter() - wall, time.process_time() - cpu, _children_cpu() - children))
        wall_s, cpu_s, readers_cpu_s = min(times)
        if first is None:
            first = batches
        for a, b in zip(first, batches, strict=True):
            assert all(torch.equal(a.model_inputs[name], b.model_inputs[name]) for name in a.model_inputs)
            assert a.tokens == b.tokens and a.words == b.words
        segments = sum(len(batch.tokens) for batch in batches)
        curve[f"readers_{readers}_s"] = round(wall_s, 3)
        curve[f"readers_{readers}_speedup"] = round(curve[f"readers_{counts[0]}_s"] / wall_s, 2)
        curve[f"readers_{readers}_per_reader"] = round(segments / wall_s / readers)
        curve[f"readers_{readers}_parent_cpu_s"] = round(cpu_s, 3)
        curve[f"readers_{readers}_readers_cpu_s"] = round(readers_cpu_s, 3)
    return curve


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's ended child processes (the reader processes)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def cache_runs(corpus: Path, tokenizer: object) -> tuple[float, float]:
    """Seconds of a first run through the encoded-corpus cache (writing the entry) and of a second one
    (reading it), in a fresh cache folder, each batch stacked as the model receives it; the batches of
    the two runs are checked equal."""
    import numpy as np
    import torch

    def run() -> tuple[float, list]:
        start = time.perf_counter()
        batches = stacked_batches(corpus, tokenizer, cache=True)
        return time.perf_counter() - start, batches

    with tempfile.TemporaryDirectory() as folder:
        previous = os.environ.get("BERTOLOGY_CORPUS_CACHE")
        os.environ["BERTOLOGY_CORPUS_CACHE"] = folder
        try:
            first_s, first = run()
            second_s, second = run()
        finally:
            os.environ.pop("BERTOLOGY_CORPUS_CACHE")
            if previous is not None:
                os.environ["BERTOLOGY_CORPUS_CACHE"] = previous
    for a, b in zip(first, second, strict=True):
        assert all(torch.equal(a.model_inputs[name], b.model_inputs[name]) for name in a.model_inputs)
        assert a.tokens == b.tokens and a.words == b.words and a.truncated == b.truncated
        assert all(np.array_equal(x, y) for x, y in zip(a.word_ids, b.word_ids, strict=True))
    return first_s, second_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=EWT_TRAIN)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--readers", default="1,2,4", help="numbers of reader processes to time, comma-separated ('': none)"
    )
    parser.add_argument("--baseline", type=Path, help="an older checkout's src folder, run in a subprocess")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the baseline's answer
    args = parser.parse_args()
    counts = [int(count) for count in args.readers.split(",") if count.strip()]
    now = measure(args.corpus, args.repeats, counts)
    if args.json:
        print(json.dumps(now))
        return
    rows = {"this checkout": now}
    if args.baseline is not None:
        environment = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
        command = [
            sys.executable,
            __file__,
            "--json",
            "--corpus",
            str(args.corpus),
            "--repeats",
            str(args.repeats),
            "--readers",
            "",  # an older checkout has no reader processes
        ]
        answer = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
        rows = {"baseline": json.loads(answer.stdout.strip().splitlines()[-1]), **rows}
    keys = list(now)
    print("| run | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(str(row.get(key, "")) for key in keys) + " |")
    for count in counts:
        print(
            f"{count} readers: {now[f'readers_{count}_per_reader']} segments/s per reader, "
            f"{now[f'readers_{count}_speedup']}x one reader; a 16-core machine's {READERS_BESIDE_GPU} "
            f"readers would each need {now['needed_per_reader']} for {GPU_SEGMENTS_PER_S:,} segments/s"
        )
    if "baseline" in rows:
        base = rows["baseline"]
        for key in ("read_s", "read_segment_s", "encode_s", "host_pipeline_s"):
            print(f"{key}: {base[key] / now[key]:.2f}x faster")  # type: ignore[operator]


if __name__ == "__main__":
    main()
