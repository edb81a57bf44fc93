"""Benchmark issue 45's encoder-decoder corpus analysis against the plain forward pass, tiny BART and T5, CPU.

The models are the test suite's tiny random ones (``tests/support/tiny_models.py``: BART 3 + 2 layers, T5
2 + 2, 4 heads, d_model 32, real tokenizer kinds). The corpus: the packaged sample corpus's paragraphs as
sources, each with its first sentence as the target (JSONL), repeated to ``--sources``; sources are cut to
``--max-len`` tokens. Three timings over the same sources and batches (``--batch-size``):

- forward: encode the sources and targets and run the model once per batch (``use_cache=False``), nothing
  recorded: the floor any analysis pays;
- analysis: :func:`~bertology.analysis.seq2seq.analyze_seq2seq_corpus` with the targets (teacher forcing);
- greedy: the same sources without targets, each decoded greedily first (``--max-new-tokens``).

Memory: the peak resident set (``ru_maxrss``) after the model is loaded and after each part; run with two
``--sources`` values to see that it does not grow with the corpus.

Run: ``.venv/bin/python benchmarks/bench_seq2seq.py [--sources 400] [--threads 1]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.tiny_models import save_tiny_model

from bertology.analysis.seq2seq import analyze_seq2seq_corpus, decoder_inputs, read_sources
from bertology.corpus.batching import PAD_MULTIPLE
from bertology.corpus.encoding import encode
from bertology.models.loading import LoadedModel, load_model

SAMPLE = Path(__file__).resolve().parents[1] / "src" / "bertology" / "data" / "sample_corpus.txt"


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_corpus(folder: Path, count: int, *, targets: bool) -> Path:
    paragraphs = [line.strip() for line in SAMPLE.read_text().splitlines() if line.strip()]
    records = []
    for paragraph in itertools.islice(itertools.cycle(paragraphs), count):
        record = {"text": paragraph}
        if targets:
            record["target"] = paragraph.split(". ")[0] + "."
        records.append(json.dumps(record))
    path = folder / ("targets.jsonl" if targets else "sources.jsonl")
    path.write_text("\n".join(records) + "\n")
    return path


def forward_only(loaded: LoadedModel, corpus: Path, max_length: int, batch_size: int) -> float:
    """Seconds to encode every batch and run the model once on it, nothing recorded."""
    start = time.perf_counter()
    sources = read_sources(corpus)
    with torch.inference_mode():
        while batch := list(itertools.islice(sources, batch_size)):
            encoded = encode(
                loaded.tokenizer,
                [item.source for item in batch],
                max_length=max_length,
                pad_to_multiple_of=PAD_MULTIPLE,
                warn=False,
            )
            decoded = decoder_inputs(loaded, batch, max_length, encoded, 1)
            loaded.model(
                input_ids=encoded.model_inputs["input_ids"],
                attention_mask=encoded.model_inputs["attention_mask"],
                decoder_input_ids=decoded.model_inputs["input_ids"],
                decoder_attention_mask=decoded.model_inputs["attention_mask"],
                use_cache=False,
            )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    folder = Path(tempfile.mkdtemp())
    with_targets = write_corpus(folder, arguments.sources, targets=True)
    without = write_corpus(folder, arguments.sources, targets=False)
    print("| model | part | sources | s | sources / s | x forward | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for architecture in ("bart", "t5"):
        loaded = load_model(save_tiny_model(architecture, folder))
        options = {"max_length": arguments.max_len, "batch_size": arguments.batch_size}
        forward_only(loaded, with_targets, arguments.max_len, arguments.batch_size)  # warm-up
        forward = forward_only(loaded, with_targets, arguments.max_len, arguments.batch_size)
        rows = [("forward", forward)]
        analysis = analyze_seq2seq_corpus(with_targets, loaded, **options)
        rows.append(("analysis (targets)", analysis.seconds))
        greedy = analyze_seq2seq_corpus(without, loaded, max_new_tokens=arguments.max_new_tokens, **options)
        rows.append((f"analysis (greedy, {arguments.max_new_tokens} new tokens)", greedy.seconds))
        for part, seconds in rows:
            print(
                f"| {architecture} | {part} | {arguments.sources} | {seconds:.2f} | "
                f"{arguments.sources / seconds:.0f} | {seconds / forward:.1f} | {peak_mb():.0f} |"
            )


if __name__ == "__main__":
    main()
