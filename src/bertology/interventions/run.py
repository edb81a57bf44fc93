"""The whole ablation study of a classifier on a task's dev set, as ``bertology ablate`` runs it.

Single-head ablation, Michel et al.'s importance, pruning curves by both rankings, attention-gradient
importance by key category, and a structurally pruned copy with its accuracy and speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertology.corpus.readers.glue import GlueTask, read_glue
from bertology.errors import BertologyError
from bertology.interventions.ablation import AblationResult, ablation_sweep
from bertology.interventions.attention_attribution import AttributionImportance, attribution_importance
from bertology.interventions.attention_gradients import AttentionGradients, attention_gradients
from bertology.interventions.curves import Head
from bertology.interventions.data import LabelledTexts
from bertology.interventions.pruning import PruningOutcome, prune_and_measure, save_model
from bertology.interventions.study import HeadStudy, ImportanceMeasure, SweepMeasure, measure_heads
from bertology.interventions.task import ClassifierTask
from bertology.models.classify import predict_logits
from bertology.models.loading import LoadedModel, require_encoder
from bertology.progress import Progress, part_of


@dataclass(repr=False, kw_only=True)
class AblationRun(HeadStudy):
    """Everything ``bertology ablate`` measures (:class:`~bertology.interventions.study.HeadStudy`: the
    scores are dev accuracies; the curves by ``"ablation"``, ``"importance"``, ``"attribution"`` where
    measured, and ``"random"``).

    attribution: Hao et al.'s self-attention attribution score of every head on the first dev examples
        (``None`` when not asked for); its curve removes heads lowest score first.
    constant_label: the label the classifier gives every dev example with all its heads (a classifier
        that learned nothing from its inputs), else ``None`` (:attr:`warning` says what it means).
    """

    task_name: str
    examples: int
    attention_gradients: AttentionGradients
    pruning: PruningOutcome | None = None
    constant_label: str | None = None
    attribution: AttributionImportance | None = None

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

    def summary(self) -> dict[str, str | int | float]:
        layers, heads = self.ablation.scores.shape
        summary: dict[str, str | int | float] = {
            "model": self.model_name,
            "task": self.task_name,
            "dev examples": self.examples,
            "layers x heads": f"{layers} x {heads}",
            "ablation": self.ablation_description,
            "dev accuracy, all heads": round(self.ablation.baseline, 4),
            "attention-gradient loss": self.attention_gradients.loss,
            "seconds": round(self.seconds, 1),
        }
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
                "pruned accuracy": round(self.pruning.accuracy, 4),
                "pruned speed-up": round(self.pruning.speedup, 2),
            }
        return summary


def dev_examples(
    loaded: LoadedModel, task_dir: str | Path, max_dev: int | None
) -> tuple[GlueTask, LabelledTexts]:
    """The GLUE-style task in ``task_dir`` and its first ``max_dev`` dev examples, encoded for the
    classifier ``loaded``.

    Raises:
        BertologyError: a bad task folder or labels the classifier does not have.
    """
    task = read_glue(task_dir, max_dev=max_dev)
    return task, LabelledTexts.of_split(loaded, task, task.dev)


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
    _, data = dev_examples(loaded, task_dir, max_dev)
    return ablation_sweep(ClassifierTask(loaded, data), batch_size=batch_size, on_progress=on_progress)


def run_ablation(
    loaded: LoadedModel,
    task_dir: str | Path,
    *,
    max_dev: int | None = None,
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
    """Run every measurement of :class:`AblationRun` for the classifier ``loaded`` on the dev set of the
    GLUE-style task in ``task_dir`` (its first ``max_dev`` examples).

    prune_fraction: share of heads to remove structurally, least important (Michel et al.) first; 0 skips
        pruning. pruned_dir: where to save the pruned model as a run folder (not saved if ``None``).
        sweep, importance: where the single-head ablation and the importance run (default: here).
        on_progress: told each stage's progress under the stage's name. attribution_examples: the first so
        many dev examples score the heads by self-attention attribution (the paper's 200; 0 skips it).
        random_seed: the order of the random pruning curve. ablation: what a removed head's output becomes
        in the single-head sweep and the pruning curves, ``"zero"``, ``"mean"`` or ``"resample"`` over the
        dev examples (:mod:`~bertology.interventions.replacement`; resample seeded by ``resample_seed``);
        the importance stays Michel et al.'s gradient at gate 1.

    Raises:
        BertologyError: a bad task folder, labels the classifier does not have, a fraction outside 0..1, an
            unknown ablation, or mean or resample ablation with a sweep elsewhere.
    """
    if not 0.0 <= prune_fraction < 1.0:
        raise BertologyError(
            f"The share of heads to prune must be at least 0 and below 1, not {prune_fraction}."
        )
    require_encoder(loaded, "Head ablation")
    started = time.perf_counter()
    task_files, data = dev_examples(loaded, task_dir, max_dev)
    task = ClassifierTask(loaded, data)
    replacement = task.replacement(ablation, seed=resample_seed, batch_size=batch_size)
    if sweep is not None and replacement.kind != "zero":
        raise BertologyError("Mean and resample ablation run here only, not on a cluster.")
    constant = constant_label(loaded, data, batch_size=batch_size)

    attribution = None

    def by_attribution() -> dict[str, list[Head]]:
        nonlocal attribution
        if attribution_examples <= 0:
            return {}
        attribution = attribution_importance(
            loaded,
            data.part(0, attribution_examples),
            on_progress=part_of(on_progress, stage="Self-attention attribution"),
        )
        return {"attribution": attribution.removal_order()}

    measured = measure_heads(
        task,
        batch_size=batch_size,
        replacement=replacement,
        random_seed=random_seed,
        sweep=sweep,
        importance=importance,
        more_orders=by_attribution,
        on_progress=on_progress,
    )
    gradients = attention_gradients(
        loaded, data, on_progress=part_of(on_progress, stage="Attention gradients")
    )
    pruning = None
    if prune_fraction > 0:
        if on_progress is not None:
            on_progress(0, 1, stage="Pruning and timing")
        chosen = measured.orders["importance"][: round(prune_fraction * loaded.num_layers * loaded.num_heads)]
        pruned, pruning = prune_and_measure(loaded, chosen, data, batch_size=batch_size)
        if pruned_dir is not None:
            save_model(pruned, pruned_dir)
        if on_progress is not None:
            on_progress(1, 1, stage="Pruning and timing")
    return AblationRun(
        model_name=loaded.name,
        task_name=task_files.name,
        examples=len(data),
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
