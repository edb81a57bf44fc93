"""Benchmark: how far a corpus analysis in bfloat16 or float16 lands from one in float32.

The first ``--segments`` segments of ``--corpus`` (default: the sample corpus, 61 segments) are analysed
with the default model (all-MiniLM-L6-v2) loaded in each precision on ``--device`` (the same segments,
seed and settings as ``bertology analyze``'s defaults). Reported per precision: the largest absolute
difference from float32 of every numeric column of ``heads.csv`` (the surface statistics and the pattern
scores), of the mean JS divergence matrix (``head_js_divergence.csv``, nats), how many pattern labels
differ, and the seconds the analysis took. The README's documented tolerance is the largest of these
differences, rounded up.

Run: ``.venv/bin/python benchmarks/bench_precision.py [--corpus FILE] [--segments 300] [--device cpu]
[--threads 1]``
"""

from __future__ import annotations

import argparse
import platform

import numpy as np
import pandas as pd
import torch

from bertology.analysis.analyze import CorpusAnalysis, analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.corpus.segments import sample_corpus
from bertology.models.loading import load_model
from bertology.options import DTYPES


def analysis_in(dtype: str, device: str, corpus: str, segments: int) -> CorpusAnalysis:
    """The first ``segments`` segments of ``corpus`` analysed by the default model in ``dtype``."""
    return analyze_corpus(corpus, load_model(device=device, dtype=dtype), AnalysisSettings(limit=segments))


def differences(reference: CorpusAnalysis, other: CorpusAnalysis) -> dict[str, float]:
    """Largest absolute difference of each numeric heads.csv column and of the JS divergence matrix."""
    ours, theirs = reference.heads_frame(), other.heads_frame()
    numeric = [name for name in ours.columns if name not in ("layer", "head", "label_segment")]
    numeric = [name for name in numeric if pd.api.types.is_float_dtype(ours[name])]
    found = {name: float(np.nanmax(np.abs(ours[name] - theirs[name]))) for name in numeric}
    found["js_divergence"] = float(np.abs(reference.distances.distance - other.distances.distance).max())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(sample_corpus()))
    parser.add_argument("--segments", type=int, default=300)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    machine = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {machine}, device {arguments.device}")
    runs = {
        dtype: analysis_in(dtype, arguments.device, arguments.corpus, arguments.segments) for dtype in DTYPES
    }
    reference = runs["float32"]
    print(f"{arguments.corpus}: {reference.segments} segments; float32: {reference.seconds:.1f} s")
    for dtype in DTYPES[1:]:
        run = runs[dtype]
        found = differences(reference, run)
        labels = int((reference.heads_frame()["label"] != run.heads_frame()["label"]).sum())
        worst = max(found, key=found.__getitem__)
        print(
            f"\n{dtype}: {run.seconds:.1f} s; largest difference {found[worst]:.4f} ({worst}); "
            f"{labels} of {len(reference.heads_frame())} labels differ"
        )
        for name, value in found.items():
            print(f"  {name:32s} {value:.5f}")


if __name__ == "__main__":
    main()
