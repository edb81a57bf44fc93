"""The whole ablation study of a task's model, as ``bertology ablate`` runs it: of a classifier on a task's
dev set (accuracy), of a decoder on a corpus (its next-token loss: ``--lm-corpus``), of an encoder-decoder on
sources and targets (the target's loss; its heads in all three stacks, not removed structurally).

Single-head ablation, Michel et al.'s importance, pruning curves by both rankings and a structurally pruned
copy with its score and speed, on any :class:`~bertology.interventions.task.Task`; for a classifier also
attention-gradient importance by key category and the ranking by self-attention attribution. What differs
between the kinds of task is data on the task (its :class:`~bertology.interventions.task.Terms`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.corpus.readers.glue import read_glue
from bertology.errors import BertologyError
from bertology.interventions.ablation import AblationResult, ablation_sweep
from bertology.interventions.attention_attribution import AttributionImportance, attribution_importance
from bertology.interventions.attention_gradients import AttentionGradients, attention_gradients
from bertology.interventions.curves import Head
from bertology.interventions.data import LabelledTexts
from bertology.interventions.importance import HeadImportance
from bertology.interventions.language_model import LanguageModelTask, TokenSequences
from bertology.interventions.pruning import Pruning, prune_and_measure, save_model
from bertology.interventions.replacement import ZeroReplacement
from bertology.interventions.study import ImportanceMeasure, SweepMeasure, measure_heads
from bertology.interventions.target_loss import SourceTargets, TargetLossTask
from bertology.interventions.task import ClassifierTask, Task, Terms
from bertology.models.classify import predict_logits
from bertology.models.loading import KIND_PHRASES, LoadedModel, require_encoder
from bertology.models.surgery import check_prunable
from bertology.progress import Progress, part_of
from bertology.summaries import Summarised


@dataclass(repr=False, kw_only=True)
class AblationRun(Summarised):
    """Everything ``bertology ablate`` measures, in the task's score.

    model_name: the model. ablation: the score with each single head removed. importance: Michel et al.'s
    importance. counts: heads removed at each point of the pruning curves; curves: by order (``"ablation"``,
    ``"importance"``, ``"attribution"`` where measured, and ``"random"``, seeded by ``random_seed``),
    [len(counts)] the score with that many heads removed, least useful first. pruning: the structurally
    pruned copy (``None`` when not asked for); pruned_dir: its run folder (``None`` when not saved).
    ablation_kind: how the single-head sweep and the pruning curves remove a head (``"zero"``, ``"mean"``,
    ``"resample"``); ablation_description: one sentence saying what a removed head's output becomes.
    terms: how the task's study words its numbers. source: the task folder's or corpus file's name.
    examples: the examples scored (dev examples, corpus segments, pairs). For a classifier only (else
    ``None``): attention_gradients, the loss's gradient by key category; attribution, Hao et al.'s
    self-attention attribution score of every head on the first dev examples (``None`` when not asked for;
    its curve removes heads lowest score first); constant_label, the label the classifier gives every dev
    example with all its heads (a classifier that learned nothing from its inputs; :attr:`warning` says
    what it means).
    """

    model_name: str
    ablation: AblationResult
    importance: HeadImportance
    counts: list[int]
    curves: dict[str, np.ndarray]
    pruning: Pruning | None = None
    random_seed: int = 0
    pruned_dir: Path | None = None
    seconds: float = 0.0
    ablation_kind: str = "zero"
    ablation_description: str = ZeroReplacement.description
    terms: Terms
    source: str
    examples: int
    attention_gradients: AttentionGradients | None = None
    attribution: AttributionImportance | None = None
    constant_label: str | None = None

    @property
    def warning(self) -> str | None:
        """What a constant classifier (:attr:`constant_label`) does to the study's numbers, or ``None``."""
        if self.constant_label is None:
            return None
        return (
            f"The classifier predicts '{self.constant_label}' for every one of the {self.examples} dev "
            f"examples (accuracy {self.ablation.baseline:.4f}: the share of that label), so it has learned "
            "nothing from its inputs; removing heads can hardly change its answers, and the ablation map and "
            "pruning curves are flat for that reason, not because the heads are unimportant. Fine-tune it "
            "again (more epochs, another learning rate) before ablating."
        )

    def curve_frame(self) -> pd.DataFrame:
        """The pruning curves: ``heads_removed``, ``fraction_removed`` and per order the score named
        ``<score>_by_<order>`` (``<score>_at_random``), e.g. ``accuracy_by_importance``."""
        name = self.ablation.score.name
        return pd.DataFrame(
            {
                "heads_removed": self.counts,
                "fraction_removed": np.array(self.counts) / self.ablation.scores.size,
                **{
                    f"{name}_{'at' if order == 'random' else 'by'}_{order}": curve
                    for order, curve in self.curves.items()
                },
            }
        )

    def words(self, sentence: str) -> str:
        """One of :attr:`terms`' sentences (``sentence``, ``headline``) with this run's numbers."""
        text: str = getattr(self.terms, sentence)
        return text.format(score=self.ablation.baseline, count=self.ablation.count, examples=self.examples)

    def summary(self) -> dict[str, object]:
        """The settings and scores: the score with every head as ``score`` (``score_name``,
        ``higher_is_better``) and under the task's own key (:class:`~bertology.interventions.task.Terms`),
        e.g. ``dev accuracy, all heads``."""
        terms, score, baseline = self.terms, self.ablation.score, self.ablation.baseline

        def shown(value: float) -> float:  # accuracies to 4 places, losses in full
            return round(value, 4) if score.higher_is_better else value

        layers, heads = self.ablation.scores.shape
        summary: dict[str, object] = {
            "model": self.model_name,
            terms.source: self.source,
            terms.examples: self.examples,
            **({} if terms.counted is None else {terms.counted: self.ablation.count}),
            "layers x heads": f"{layers} x {heads}",
            "ablation": self.ablation_description,
            "score_name": score.name,
            "higher_is_better": score.higher_is_better,
            "score": baseline,
            terms.baseline: shown(baseline),
            **({} if score.higher_is_better else {"perplexity": float(np.exp(baseline))}),
            "seconds": round(self.seconds, 1),
        }
        if self.attention_gradients is not None:
            summary["attention-gradient loss"] = self.attention_gradients.loss
        if self.attribution is not None:
            attribution = self.attribution
            summary["self-attention attribution"] = (
                f"{attribution.examples} examples, {attribution.rule} x {attribution.steps}, "
                f"{attribution.seconds / max(attribution.examples, 1):.2f} s per example"
            )
        if self.warning is not None:
            summary["warning"] = self.warning
        if self.pruning is not None:
            summary |= {
                "heads removed structurally": f"{self.pruning.removed} of {self.pruning.total_heads}",
                f"pruned {score.name}": shown(self.pruning.value),
                "pruned speed-up": round(self.pruning.speedup, 2),
            }
        return summary


def classifier_task(
    loaded: LoadedModel, task_dir: str | Path, max_dev: int | None
) -> tuple[ClassifierTask, str]:
    """The classifier ``loaded`` scored on the first ``max_dev`` dev examples of the GLUE-style task in
    ``task_dir``, and the task's name.

    Raises:
        BertologyError: a bad task folder or labels the classifier does not have.
    """
    task = read_glue(task_dir, max_dev=max_dev)
    return ClassifierTask(loaded, LabelledTexts.of_split(loaded, task, task.dev)), task.name


def corpus_task(
    loaded: LoadedModel, corpus: str | Path, *, max_length: int = 128, max_segments: int | None = None
) -> Task:
    """The decoder ``loaded`` (loaded with ``language_model=True``) scored by its next-token loss on the
    first ``max_segments`` segments of ``max_length`` tokens of ``corpus``; an encoder-decoder by its
    target's loss on the first ``max_segments`` sources and targets of ``corpus`` (JSON Lines).

    Raises:
        BertologyError: a model without a language-modelling head, or a corpus without text (an
            encoder-decoder's: a source without a target).
    """
    if loaded.kind == "encoder-decoder":
        pairs = SourceTargets.of_corpus(loaded, corpus, max_length=max_length, max_segments=max_segments)
        return TargetLossTask(loaded, pairs)
    data = TokenSequences.of_corpus(loaded, corpus, max_length=max_length, max_segments=max_segments)
    return LanguageModelTask(loaded, data)


def constant_label(loaded: LoadedModel, data: LabelledTexts, *, batch_size: int = 32) -> str | None:
    """The label the classifier ``loaded`` (every head on) predicts for every example of ``data`` (at least
    two), or ``None`` when its predictions differ."""
    predicted = np.unique(predict_logits(loaded, data.texts, data.texts_b, batch_size=batch_size).argmax(-1))
    if len(data) < 2 or len(predicted) > 1:
        return None
    return str(loaded.model.config.id2label[int(predicted[0])])


def single_head_ablation(
    loaded: LoadedModel,
    task_dir: str | Path,
    *,
    max_dev: int | None = 100,
    batch_size: int = 32,
    on_progress: Progress | None = None,
) -> AblationResult:
    """Accuracy of the classifier ``loaded`` with each single head removed (Michel et al. 2019), on the
    first ``max_dev`` dev examples of the GLUE-style task in ``task_dir`` (the first part of
    :func:`run_ablation`, e.g. for ``bertology compare --task``).

    on_progress: told the example passes done, out of ``layers * heads * examples``.

    Raises:
        BertologyError: a bad task folder or labels the classifier does not have.
    """
    task, _ = classifier_task(loaded, task_dir, max_dev)
    return ablation_sweep(task, batch_size=batch_size, on_progress=on_progress)


def run_ablation(
    task: Task,
    source: str,
    *,
    batch_size: int = 32,
    prune_fraction: float = 0.5,
    pruned_dir: str | Path | None = None,
    on_progress: Progress | None = None,
    sweep: SweepMeasure | None = None,
    importance: ImportanceMeasure | None = None,
    attribution_examples: int = 200,
    random_seed: int = 0,
    ablation: str = "zero",
    resample_seed: int = 0,
) -> AblationRun:
    """Run every measurement of :class:`AblationRun` on ``task`` (from :func:`classifier_task` or
    :func:`corpus_task`), read from ``source`` (its name).

    prune_fraction: share of heads to remove structurally, least important (Michel et al.) first; 0 skips
        pruning. pruned_dir: where to save the pruned model as a run folder (not saved if ``None``).
        sweep, importance: where the single-head ablation and the importance run (default: here).
        on_progress: told each stage's progress under the stage's name. attribution_examples: a classifier's
        first so many dev examples score the heads by self-attention attribution (the paper's 200; 0 skips
        it). random_seed: the order of the random pruning curve. ablation: what a removed head's output
        becomes in the single-head sweep and the pruning curves, ``"zero"``, ``"mean"`` or ``"resample"``
        over the task's examples (:mod:`~bertology.interventions.replacement`; resample seeded by
        ``resample_seed``); the importance stays Michel et al.'s gradient at gate 1.

    Raises:
        BertologyError: a classifier that is not an encoder, a fraction outside 0..1, pruning asked of a
            model whose heads cannot be removed (ALBERT, GPT-2's ``Conv1D``, an encoder-decoder), an
            unknown ablation, or mean or resample ablation with a sweep elsewhere.
    """
    loaded = task.loaded
    classifier = task if isinstance(task, ClassifierTask) else None
    if classifier is not None:  # its attention gradients and attribution read an encoder's attention
        require_encoder(loaded, "Head ablation")
    if not 0.0 <= prune_fraction < 1.0:
        raise BertologyError(
            f"The share of heads to prune must be at least 0 and below 1, not {prune_fraction}."
        )
    if prune_fraction > 0 and task.terms.pruned_as is None:
        raise BertologyError(
            f"Structural pruning is for encoders and decoders; '{loaded.name}' is "
            f"{KIND_PHRASES[loaded.kind]} model (give --prune 0)."
        )
    if prune_fraction > 0:
        check_prunable(loaded.model)
    started = time.perf_counter()
    replacement = task.replacement(ablation, seed=resample_seed, batch_size=batch_size)
    if sweep is not None and replacement.kind != "zero":
        raise BertologyError("Mean and resample ablation run here only, not on a cluster.")
    constant = None if classifier is None else constant_label(loaded, classifier.data, batch_size=batch_size)

    attribution = None

    def by_attribution() -> dict[str, list[Head]]:
        nonlocal attribution
        if classifier is None or attribution_examples <= 0:
            return {}
        attribution = attribution_importance(
            loaded,
            classifier.data.part(0, attribution_examples),
            on_progress=part_of(on_progress, stage="Self-attention attribution"),
        )
        return {"attribution": attribution.removal_order()}

    measured = measure_heads(
        task,
        batch_size=batch_size,
        replacement=replacement,
        random_seed=random_seed,
        importance_batch_size=task.importance_batch or batch_size,
        sweep=sweep,
        importance=importance,
        more_orders=by_attribution,
        on_progress=on_progress,
    )
    gradients = None
    if classifier is not None:
        stage = part_of(on_progress, stage="Attention gradients")
        gradients = attention_gradients(loaded, classifier.data, on_progress=stage)
    pruning = None
    if prune_fraction > 0:
        if on_progress is not None:
            on_progress(0, 1, stage="Pruning and timing")
        chosen = measured.orders["importance"][: round(prune_fraction * loaded.num_layers * loaded.num_heads)]
        pruned, pruning = prune_and_measure(task, chosen, batch_size=batch_size)
        if pruned_dir is not None:
            save_model(pruned, pruned_dir)
        if on_progress is not None:
            on_progress(1, 1, stage="Pruning and timing")
    return AblationRun(
        model_name=loaded.name,
        terms=task.terms,
        source=source,
        examples=len(task),
        ablation=measured.ablation,
        importance=measured.importance,
        counts=measured.counts,
        curves=measured.curves,
        attention_gradients=gradients,
        pruning=pruning,
        pruned_dir=Path(pruned_dir) if pruning is not None and pruned_dir is not None else None,
        seconds=time.perf_counter() - started,
        constant_label=constant,
        attribution=attribution,
        random_seed=random_seed,
        ablation_kind=replacement.kind,
        ablation_description=replacement.description,
    )
