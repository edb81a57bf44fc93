"""The head-ablation study of a decoder by its language-model loss on a corpus (``bertology ablate MODEL
--lm-corpus FILE``): single-head ablation, Michel et al.'s importance, pruning curves and structural
pruning, every score the mean next-token cross-entropy (:mod:`~bertology.interventions.language_model`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.errors import BertologyError
from bertology.interventions.curves import Head, removal_counts
from bertology.interventions.decoder_pruning import DecoderPruning, prune_decoder
from bertology.interventions.importance import HeadImportance
from bertology.interventions.language_model import (
    LossAblation,
    TokenSequences,
    loss_ablation_sweep,
    loss_importance,
    loss_pruning_curve,
    require_language_model,
    sequence_replacement,
)
from bertology.interventions.pruning import save_model
from bertology.interventions.replacement import ZeroReplacement
from bertology.models.loading import LoadedModel
from bertology.models.surgery import check_prunable
from bertology.progress import Progress, part_of
from bertology.summaries import Summarised


@dataclass(repr=False)
class LanguageModelAblationRun(Summarised):
    """Everything ``bertology ablate --lm-corpus`` measures, for one decoder on one corpus.

    model_name, corpus: what was measured. sequences, tokens: corpus segments read and tokens predicted.
    ablation: :class:`~bertology.interventions.language_model.LossAblation`. importance: Michel et al.'s
    importance by the loss. counts: heads removed at each point of the pruning curves; curve_by_ablation,
    curve_by_importance, curve_at_random: [len(counts)] loss (nats per token) with that many heads removed
    in each order (least useful first; random: seeded by ``random_seed``). pruning: the structurally
    pruned copy (``None`` when not asked for); pruned_dir: its run folder. ablation_kind: how the
    single-head sweep and the pruning curves remove a head (``"zero"``, ``"mean"``, ``"resample"``);
    ablation_description: one sentence saying what a removed head's output becomes.
    """

    model_name: str
    corpus: str
    sequences: int
    tokens: int
    ablation: LossAblation
    importance: HeadImportance
    counts: list[int]
    curve_by_ablation: np.ndarray
    curve_by_importance: np.ndarray
    curve_at_random: np.ndarray
    random_seed: int
    pruning: DecoderPruning | None
    pruned_dir: Path | None
    seconds: float
    ablation_kind: str = "zero"
    ablation_description: str = ZeroReplacement.description

    def curve_frame(self) -> pd.DataFrame:
        """The pruning curves: ``heads_removed``, ``fraction_removed``, ``loss_by_ablation``,
        ``loss_by_importance``, ``loss_at_random``."""
        return pd.DataFrame(
            {
                "heads_removed": self.counts,
                "fraction_removed": np.array(self.counts) / self.ablation.loss.size,
                "loss_by_ablation": self.curve_by_ablation,
                "loss_by_importance": self.curve_by_importance,
                "loss_at_random": self.curve_at_random,
            }
        )

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


def random_order(layers: int, heads: int, seed: int) -> list[Head]:
    """Every head of a ``layers`` x ``heads`` model in a seeded random order."""
    return [
        (int(i // heads), int(i % heads)) for i in np.random.default_rng(seed).permutation(layers * heads)
    ]


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
    ``language_model=True``) on the first ``max_segments`` segments of ``max_length`` tokens of ``corpus``.

    prune_fraction: share of heads to remove structurally, least important (Michel et al.) first; 0 skips
        pruning. pruned_dir: where to save the pruned model as a run folder (not saved if ``None``).
    ablation: what a removed head's output becomes in the single-head sweep and the pruning curves,
        ``"zero"``, ``"mean"`` or ``"resample"`` over the corpus segments
        (:mod:`~bertology.interventions.replacement`; resample seeded by ``resample_seed``); the
        importance stays Michel et al.'s gradient at gate 1.
    on_progress: told each stage's progress under the stage's name.

    Raises:
        BertologyError: a model without a language-modelling head, a corpus without text, a fraction
            outside 0..1, pruning asked of a model whose heads cannot be removed (GPT-2's ``Conv1D``), or
            an unknown ablation.
    """
    if not 0 <= prune_fraction < 1:
        raise BertologyError(
            f"The share of heads to prune must be at least 0 and below 1, not {prune_fraction}."
        )
    require_language_model(loaded)
    if prune_fraction > 0:
        check_prunable(loaded.model)
    started = time.perf_counter()
    data = TokenSequences.of_corpus(loaded, corpus, max_length=max_length, max_segments=max_segments)
    replacement = sequence_replacement(loaded, data, ablation, seed=resample_seed, batch_size=batch_size)
    single = loss_ablation_sweep(
        loaded,
        data,
        ablation=replacement,
        batch_size=batch_size,
        on_progress=part_of(on_progress, stage="Single-head ablation"),
    )
    importance = loss_importance(
        loaded, data, batch_size=batch_size, on_progress=part_of(on_progress, stage="Head importance")
    )
    heads = loaded.num_layers * loaded.num_heads
    counts = removal_counts(heads)
    orders = {
        "ablation": single.removal_order(),
        "importance": importance.removal_order(),
        "random": random_order(loaded.num_layers, loaded.num_heads, random_seed),
    }
    curves = {
        name: loss_pruning_curve(
            loaded,
            data,
            order,
            counts,
            replacement=replacement,
            batch_size=batch_size,
            on_progress=part_of(on_progress, stage=f"Pruning curve ({name})"),
        )
        for name, order in orders.items()
    }
    pruning = None
    removed = round(prune_fraction * heads)
    if removed > 0:
        pruned, pruning = prune_decoder(loaded, orders["importance"][:removed], data, batch_size=batch_size)
        if pruned_dir is not None:
            save_model(pruned, pruned_dir)
    return LanguageModelAblationRun(
        model_name=loaded.name,
        corpus=Path(corpus).name,
        sequences=len(data),
        tokens=single.tokens,
        ablation=single,
        importance=importance,
        counts=counts,
        curve_by_ablation=curves["ablation"],
        curve_by_importance=curves["importance"],
        curve_at_random=curves["random"],
        random_seed=random_seed,
        pruning=pruning,
        pruned_dir=Path(pruned_dir) if pruning is not None and pruned_dir is not None else None,
        seconds=time.perf_counter() - started,
        ablation_kind=replacement.kind,
        ablation_description=replacement.description,
    )
