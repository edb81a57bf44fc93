"""Files and HTML page of a decoder's head-ablation study by its language-model loss (``bertology ablate
MODEL --lm-corpus FILE``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bertology.files.run_files import REPORT_FILE
from bertology.interventions.decoder_pruning import DecoderPruning
from bertology.interventions.language_model_run import LanguageModelAblationRun
from bertology.report import page, plots
from bertology.report.interventions import how_removed, write_ablation_files

#: The pruning curves' columns with their legends.
CURVES = (
    ("loss_by_ablation", "ranked by single-head ablation"),
    ("loss_by_importance", "ranked by importance"),
    ("loss_at_random", "in a seeded random order"),
)


def _curve_figure(frame: pd.DataFrame) -> Figure:
    """Loss against the number of heads removed, one line per order (Michel et al. 2019, Fig. 2)."""
    figure = plots.new_figure(6.0, 3.6)
    ax = figure.subplots()
    for index, (column, label) in enumerate(CURVES):
        ax.plot(frame["heads_removed"], frame[column], marker=plots.MARKERS[index], ms=4, lw=1.6, label=label)
    ax.set_xlabel("heads removed (least useful first)", fontsize=9)
    ax.set_ylabel("next-token cross-entropy (nats)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8, frameon=False)
    return figure


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
    removed = "; ".join(
        f"layer {layer}: {', '.join(map(str, heads))}" for layer, heads in outcome.heads.items()
    )
    blocks = [
        page.paragraph(
            f"The {outcome.removed} least important query heads (Michel et al.'s normalised importance) were "
            "removed from the weights: their rows of the query projection and their columns of the output "
            "projection, and a key/value head's rows of the key and value projections once all the query "
            "heads sharing it were removed. Where the key/value heads kept serve different numbers of query "
            "heads, some removed query heads stay with zero output columns (every key/value head of a layer "
            f"serves the same number). The pruned model's logits differ from the gated original's by at most "
            f"{outcome.largest_difference:.2g}; it ran {outcome.speedup:.2f}x as fast (the fastest of 3 "
            "passes over the same batches, the two models taking turns)."
        ),
        page.table(frame, float_format="{:.4g}"),
        page.paragraph(f"Removed query heads (0-based): {removed}.", class_="muted"),
    ]
    if pruned_dir is not None:
        blocks.append(
            page.paragraph(
                f"The pruned model is saved as a run folder in {pruned_dir} "
                f"(load it with load_model('{pruned_dir}', language_model=True))."
            )
        )
    return page.Section("Structural pruning", "pruning", blocks)


def write_language_model_ablation_report(
    run: LanguageModelAblationRun, outdir: str | Path, *, dpi: int = 110
) -> Path:
    """Write the results of :func:`~bertology.interventions.language_model_run.run_language_model_ablation`
    into ``outdir``: ``ablation.csv``, ``importance.csv``, ``pruning_curve.csv``, ``summary.json`` (with
    ``pruning``), the PNGs in ``plots/`` and ``report.html``; return the report."""
    target = Path(outdir)
    ablation = run.ablation
    curve, ablation_png, importance_png = write_ablation_files(
        run, target, dpi, change="loss change when removed", unit="nats per token"
    )
    curve_png = plots.to_png(_curve_figure(curve), dpi=dpi)
    (target / "plots" / "pruning_curve.png").write_bytes(curve_png)
    sections = [
        page.Section(
            "Single-head ablation",
            "ablation",
            [
                page.paragraph(
                    f"Language-model loss with every head: {ablation.baseline:.4f} nats per token (the mean "
                    f"next-token cross-entropy over {ablation.tokens} predicted tokens of {run.sequences} "
                    "corpus segments). Each cell is the loss with only that query head removed "
                    f"({how_removed(run.ablation_kind, run.ablation_description)}) minus that baseline: "
                    "positive where the head helped (Michel et al. 2019)."
                ),
                page.figure(ablation_png, alt="loss change per head", caption="Layer x head, 0-based."),
            ],
        ),
        page.Section(
            "Head importance",
            "importance",
            [
                page.paragraph(
                    "Michel et al.'s importance I_h = E_x |∂L(x)/∂ξ_h|: the mean over corpus segments x of "
                    "the magnitude of the gradient of the segment's mean next-token cross-entropy with "
                    "respect to the head's gate ξ_h (1 = unchanged). Left: normalised by the L2 norm of its "
                    "layer's scores, as in the paper; right: raw."
                ),
                page.figure(importance_png, alt="head importance", caption="Layer x head, 0-based."),
            ],
        ),
        page.Section(
            "Pruning curves",
            "curves",
            [
                page.paragraph(
                    f"Language-model loss after removing ({run.ablation_kind} ablation) more and more heads, "
                    "least useful first: by the loss left when the head alone is removed (lowest first), by "
                    f"normalised importance (lowest first) and in a random order (seed {run.random_seed})."
                ),
                page.table(curve, float_format="{:.4f}"),
                page.figure(curve_png, alt="pruning curves"),
            ],
        ),
    ]
    if run.pruning is not None:
        sections.append(_pruning_section(run.pruning, run.pruned_dir))
    report = target / REPORT_FILE
    title = f"Head ablation: {run.model_name} on {run.corpus} (language-model loss)"
    header = [page.definitions(run.summary())]
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report
