"""Files and HTML page of a decoder's head-ablation study by its language-model loss (``bertology ablate
MODEL --lm-corpus FILE``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bertology.files.run_files import REPORT_FILE
from bertology.interventions.decoder_pruning import DecoderPruning
from bertology.interventions.language_model_run import LanguageModelAblationRun
from bertology.report import page
from bertology.report.interventions import StudyWording, pruning_section, write_study


def _pruning_section(outcome: DecoderPruning, pruned_dir: Path | None) -> page.Section:
    frame = pd.DataFrame(
        {
            "model": ["original", "original, heads gated to 0", "pruned"],
            "query heads": [outcome.total_heads] + [outcome.total_heads - outcome.removed] * 2,
            "key/value heads": [outcome.total_key_value_heads] * 2 + [outcome.key_value_heads],
            "parameters": [outcome.baseline_parameters, outcome.baseline_parameters, outcome.parameters],
            "loss": [outcome.baseline_loss, outcome.gated_loss, outcome.loss],
            "inference seconds": [outcome.baseline_seconds, np.nan, outcome.seconds],
        }
    )
    explanation = (
        f"The {outcome.removed} least important query heads (Michel et al.'s normalised importance) were "
        "removed from the weights: their rows of the query projection and their columns of the output "
        "projection, and a key/value head's rows of the key and value projections once all the query "
        "heads sharing it were removed. Where the key/value heads kept serve different numbers of query "
        "heads, some removed query heads stay with zero output columns (every key/value head of a layer "
        f"serves the same number). The pruned model's logits differ from the gated original's by at most "
        f"{outcome.largest_difference:.2g}; it ran {outcome.speedup:.2f}x as fast (the fastest of 3 "
        "passes over the same batches, the two models taking turns)."
    )
    return pruning_section(outcome, frame, explanation, pruned_dir, "language_model")


def write_language_model_ablation_report(
    run: LanguageModelAblationRun, outdir: str | Path, *, dpi: int = 110
) -> Path:
    """Write the results of :func:`~bertology.interventions.language_model_run.run_language_model_ablation`
    into ``outdir``: ``ablation.csv``, ``importance.csv``, ``pruning_curve.csv``, ``summary.json`` (with
    ``pruning``), the PNGs in ``plots/`` and ``report.html``; return the report."""
    wording = StudyWording(
        baseline=f"Language-model loss with every head: {run.ablation.baseline:.4f} nats per token (the mean "
        f"next-token cross-entropy over {run.tokens} predicted tokens of {run.sequences} corpus segments).",
        head="query head",
        examples="corpus segments x",
        loss="the segment's mean next-token cross-entropy",
        axis_label="next-token cross-entropy (nats)",
        sign=": positive where the head helped",
    )
    if run.ablation.stacks is not None:
        wording = StudyWording(
            baseline=f"Target loss with every head: {run.ablation.baseline:.4f} nats per token (the mean "
            f"cross-entropy of {run.tokens} target tokens given their sources, {run.sequences} pairs). The "
            "heads are those of the encoder's self-attention, the decoder's self-attention and "
            "cross-attention, one after the other: the rows of the plots are the encoder's layers, then "
            "the decoder's, then cross-attention's (the CSV files' stack column).",
            head="head",
            examples="pairs x",
            loss="the target's mean cross-entropy",
            axis_label="target cross-entropy (nats)",
            sign=": positive where the head helped",
        )
    target = Path(outdir)
    sections = write_study(run, target, dpi, wording)
    if run.pruning is not None:
        sections.append(_pruning_section(run.pruning, run.pruned_dir))
    report = target / REPORT_FILE
    title = f"Head ablation: {run.model_name} on {run.corpus} (language-model loss)"
    header = [page.definitions(run.summary())]
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report
