"""The head-ablation study of a decoder by its language-model loss on a corpus (``bertology ablate MODEL
--lm-corpus FILE``): single-head ablation, Michel et al.'s importance, pruning curves and structural
pruning, every score the mean next-token cross-entropy (:mod:`~bertology.interventions.language_model`).
An encoder-decoder's study is the same on its three stacks' heads, scored by the target's loss
(:mod:`~bertology.interventions.target_loss`; a corpus of sources and targets), without structural pruning.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertology.errors import BertologyError
from bertology.interventions.decoder_pruning import DecoderPruning, prune_decoder
from bertology.interventions.language_model import LanguageModelTask, TokenSequences, require_language_model
from bertology.interventions.pruning import save_model
from bertology.interventions.study import HeadStudy, measure_heads
from bertology.interventions.target_loss import SourceTargets, TargetLossTask
from bertology.interventions.task import Task
from bertology.models.loading import LoadedModel
from bertology.models.surgery import check_prunable
from bertology.progress import Progress


@dataclass(repr=False, kw_only=True)
class LanguageModelAblationRun(HeadStudy):
    """Everything ``bertology ablate --lm-corpus`` measures, for one decoder on one corpus
    (:class:`~bertology.interventions.study.HeadStudy`: the scores are losses in nats per token; the curves
    by ``"ablation"``, ``"importance"`` and ``"random"``).

    corpus: the corpus file's name. sequences, tokens: corpus segments read and tokens predicted.
    """

    corpus: str
    sequences: int
    tokens: int
    pruning: DecoderPruning | None = None

    def summary(self) -> dict[str, object]:
        summary: dict[str, object] = {
            "model": self.model_name,
            "corpus": self.corpus,
            "sequences": self.sequences,
            "predicted tokens": self.tokens,
            "ablation": self.ablation_description,
            "loss (nats per token)": self.ablation.baseline,
            "perplexity": float(np.exp(self.ablation.baseline)),
            "seconds": round(self.seconds, 1),
        }
        if self.pruning is not None:
            summary["pruned heads"] = self.pruning.removed
            summary["pruned loss"] = self.pruning.loss
        return summary


def run_language_model_ablation(
    loaded: LoadedModel,
    corpus: str | Path,
    *,
    max_length: int = 128,
    max_segments: int | None = None,
    batch_size: int = 8,
    prune_fraction: float = 0.5,
    pruned_dir: str | Path | None = None,
    random_seed: int = 0,
    ablation: str = "zero",
    resample_seed: int = 0,
    on_progress: Progress | None = None,
) -> LanguageModelAblationRun:
    """Run every measurement of :class:`LanguageModelAblationRun` for the decoder ``loaded`` (loaded with
    ``language_model=True``) on the first ``max_segments`` segments of ``max_length`` tokens of ``corpus``;
    for an encoder-decoder, on the first ``max_segments`` sources and targets of ``corpus`` (JSON Lines),
    its heads in all three stacks, scored by the target's loss.

    prune_fraction: share of heads to remove structurally, least important (Michel et al.) first; 0 skips
        pruning. pruned_dir: where to save the pruned model as a run folder (not saved if ``None``).
    ablation: what a removed head's output becomes in the single-head sweep and the pruning curves,
        ``"zero"``, ``"mean"`` or ``"resample"`` over the corpus segments
        (:mod:`~bertology.interventions.replacement`; resample seeded by ``resample_seed``); the
        importance stays Michel et al.'s gradient at gate 1.
    on_progress: told each stage's progress under the stage's name.

    Raises:
        BertologyError: a model without a language-modelling head, a corpus without text (an
            encoder-decoder's: a source without a target), a fraction outside 0..1, pruning asked of a model
            whose heads cannot be removed (GPT-2's ``Conv1D``, an encoder-decoder), or an unknown ablation.
    """
    if not 0 <= prune_fraction < 1:
        raise BertologyError(
            f"The share of heads to prune must be at least 0 and below 1, not {prune_fraction}."
        )
    seq2seq = loaded.kind == "encoder-decoder"
    if seq2seq and prune_fraction > 0:
        raise BertologyError(
            f"Structural pruning is for encoders and decoders; '{loaded.name}' is an encoder-decoder "
            "(give --prune 0)."
        )
    if not seq2seq:
        require_language_model(loaded)
    if prune_fraction > 0:
        check_prunable(loaded.model)
    started = time.perf_counter()
    task: Task
    if seq2seq:
        pairs = SourceTargets.of_corpus(loaded, corpus, max_length=max_length, max_segments=max_segments)
        task = TargetLossTask(loaded, pairs)
    else:
        data = TokenSequences.of_corpus(loaded, corpus, max_length=max_length, max_segments=max_segments)
        task = LanguageModelTask(loaded, data)
    replacement = task.replacement(ablation, seed=resample_seed, batch_size=batch_size)
    measured = measure_heads(
        task,
        batch_size=batch_size,
        replacement=replacement,
        random_seed=random_seed,
        importance_batch_size=batch_size,
        on_progress=on_progress,
    )
    pruning = None
    removed = round(prune_fraction * loaded.num_layers * loaded.num_heads)
    if removed > 0 and isinstance(task, LanguageModelTask):
        pruned, pruning = prune_decoder(
            loaded, measured.orders["importance"][:removed], task.data, batch_size=batch_size
        )
        if pruned_dir is not None:
            save_model(pruned, pruned_dir)
    return LanguageModelAblationRun(
        model_name=loaded.name,
        corpus=Path(corpus).name,
        sequences=len(task),
        tokens=measured.ablation.count,
        ablation=measured.ablation,
        importance=measured.importance,
        counts=measured.counts,
        curves=measured.curves,
        random_seed=random_seed,
        pruning=pruning,
        pruned_dir=Path(pruned_dir) if pruning is not None and pruned_dir is not None else None,
        seconds=time.perf_counter() - started,
        ablation_kind=replacement.kind,
        ablation_description=replacement.description,
    )
