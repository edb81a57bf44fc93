"""Run folders the tests build, as the commands write them: a training run's files with a synthetic
monitor archive (no model), a small GLUE-style task, and a real analysis of a small corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bertology.analysis.analyze import CorpusAnalysis, analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.models.loading import LoadedModel
from bertology.report.analysis import save_analysis
from bertology.stats.surface import SURFACE_STATISTICS
from bertology.training.archive import ARCHIVE_FOLDER, ArchiveWriter, ProbeTokens
from support.synthetic_views import HOSTILE_TOKEN

# --- A training run (the watch page's input) -------------------------------------------------------

LAYERS, HEADS = 2, 3

CHANGED = (0, 1)

STEPS = (0, 5, 10)

TOKENS = [["[CLS]", "the", HOSTILE_TOKEN, "sat", ".", "[SEP]"], ["[CLS]", "a", "dog", "[SEP]"]]


def synthetic_attention(n: int, progress: float) -> np.ndarray:
    """[L, H, n, n]: uniform rows; head CHANGED mixes uniform with next-token attention by ``progress``."""
    attention = np.full((LAYERS, HEADS, n, n), 1.0 / n)
    following = np.eye(n, k=1)
    following[-1, -1] = 1.0
    attention[CHANGED] = (1 - progress) * attention[CHANGED] + progress * following
    return attention


def write_synthetic_run(folder: Path) -> Path:
    """A run folder with run.json, metrics.jsonl and a monitor archive of STEPS records."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = ProbeTokens(
        texts=["the cat sat .", "a dog"],
        texts_b=None,
        labels=["1", "0"],
        tokens=TOKENS,
        segments=[[0] * len(tokens) for tokens in TOKENS],
        truncated=[0, 0],
    )
    writer = ArchiveWriter.create(
        folder / ARCHIVE_FOLDER,
        model="synthetic",
        layers=LAYERS,
        heads=HEADS,
        probe=probe,
        statistics=list(SURFACE_STATISTICS),
        every=5,
    )
    for step in STEPS:
        progress = step / STEPS[-1]
        attention = np.zeros((len(TOKENS), LAYERS, HEADS, 6, 6))
        for index, tokens in enumerate(TOKENS):
            n = len(tokens)
            attention[index, :, :, :n, :n] = synthetic_attention(n, progress)
        stats = np.full((len(SURFACE_STATISTICS), LAYERS, HEADS), progress, dtype=np.float32)
        writer.append(step, attention, stats)
    run = {"status": "finished", "task": "SYN", "steps": 10, "seconds": 3.0, "dev_accuracy": 0.75}
    (folder / "run.json").write_text(json.dumps({**run, "dev_examples": 4}))
    rows = [{"step": s, "split": "train", "loss": 1.0 / s} for s in (2, 4, 6, 8, 10)]
    rows += [{"step": 10, "split": "dev", "loss": 0.5, "accuracy": 0.75}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 1')
    return folder


# --- A GLUE-style task ------------------------------------------------------------------------

_GOOD = ("good", "great", "fun", "lovely", "warm")
_BAD = ("bad", "dull", "awful", "cold", "boring")
_FILLER = ("the", "film", "was", "really", "quite", "and", "story", "acting", "a", "very")


def write_tiny_task(folder: Path, train_rows: int = 48, dev_rows: int = 12, seed: int = 0) -> Path:
    """A GLUE-style sentiment task (sentence, label) of short synthetic sentences."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.tsv", train_rows), ("dev.tsv", dev_rows)):
        lines = ["sentence\tlabel"]
        for _ in range(rows):
            label = int(rng.integers(2))
            words = list(rng.choice(_FILLER, size=int(rng.integers(2, 9))))
            words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(_GOOD if label else _BAD)))
            lines.append(f"{' '.join(words)} .\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


# --- An analysis folder --------------------------------------------------------------------

PER_HEAD = 3
MAX_LENGTH = 64


def write_analysis(corpus: Path, loaded: LoadedModel, folder: Path) -> CorpusAnalysis:
    """Analyse ``corpus`` (segments of at most :data:`MAX_LENGTH` tokens) and save it into ``folder``."""
    analysis = analyze_corpus(
        corpus, loaded, AnalysisSettings(max_length=MAX_LENGTH, examples_per_head=PER_HEAD)
    )
    save_analysis(analysis, loaded, folder)
    return analysis
