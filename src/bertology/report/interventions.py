"""Files and HTML pages of the interventions: the ablation study (``bertology ablate``) and saliency
explanations (``bertology explain``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bertology.files.outputs import write_text
from bertology.files.run_files import ATTRIBUTION_IMPORTANCE_FILE, REPORT_FILE, SUMMARY_FILE, mark_run
from bertology.interventions import direct_logit
from bertology.interventions.attention_gradients import CATEGORIES, AttentionGradients
from bertology.interventions.direct_logit import DirectLogitAttribution
from bertology.interventions.run import AblationRun
from bertology.interventions.saliency import Explanation
from bertology.report import page, plots
from bertology.report.analysis import docstring
from bertology.stats.base import HeadTable

#: Display names of the saliency methods.
METHOD_TITLES = {
    "gradient": "Gradient",
    "input-x-gradient": "Input × gradient",
    "integrated-gradients": "Integrated gradients",
    "smoothgrad": "SmoothGrad",
}

#: Background colours (RGB) of positive and negative attributions.
POSITIVE_RGB = (214, 39, 40)
NEGATIVE_RGB = (31, 119, 180)


#: The legend of each order of a pruning curve.
ORDER_LEGENDS = {
    "ablation": "ranked by single-head ablation",
    "importance": "ranked by importance",
    "attribution": "ranked by self-attention attribution",
    "random": "in a seeded random order",
}


def _curve_figure(run: AblationRun, frame: pd.DataFrame, axis_label: str) -> Figure:
    """The score (``axis_label``) against the number of heads removed, one line per order (Michel et al.
    2019, Fig. 2)."""
    figure = plots.new_figure(6.0, 3.6)
    ax = figure.subplots()
    for order, column in zip(run.curves, frame.columns[2:], strict=True):
        index = list(ORDER_LEGENDS).index(order)
        ax.plot(
            frame["heads_removed"],
            frame[column],
            marker=plots.MARKERS[index],
            ms=4,
            lw=1.6,
            label=ORDER_LEGENDS[order],
        )
    ax.set_xlabel("heads removed (least useful first)", fontsize=9)
    ax.set_ylabel(axis_label, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3, lw=0.5)
    ax.legend(fontsize=8, frameon=False)
    return figure


def _gradient_figure(run: AblationRun, gradients: AttentionGradients) -> Figure:
    """Mean |dL/dA| per layer by key category (Clark et al. 2019, Fig. 3): heads as points, layer means
    as lines."""
    per_head = gradients.per_head
    table = HeadTable(
        columns={name: per_head[:, :, index] for index, name in enumerate(CATEGORIES)},
        defined_segments={},
        segments=run.examples,
    )
    figure = plots.layer_summary(table, {"gradient of the loss by attended-to token": list(CATEGORIES)})
    ax = figure.axes[0]
    ax.set_ylabel(f"mean |∂L/∂attention| ({gradients.loss} loss)", fontsize=9)
    return figure


def _save_png(outdir: Path, name: str, figure: Figure, dpi: int) -> bytes:
    png = plots.to_png(figure, dpi=dpi)
    (outdir / "plots").mkdir(parents=True, exist_ok=True)
    (outdir / "plots" / f"{name}.png").write_bytes(png)
    return png


def _attribution_section(run: AblationRun, outdir: Path, dpi: int) -> page.Section:
    """Hao et al.'s head scores (``run.attribution``, not ``None``) as a heatmap."""
    attribution = run.attribution
    assert attribution is not None
    png = plots.heatmap_png(
        outdir, "attribution", {"self-attention attribution": attribution.scores}, dpi, unit="E[max Attr]"
    )
    text = (
        "Hao et al. (2021)'s head score: the largest entry of the head's attribution matrix Attr(A) = A ⊙ "
        "∫₀¹ ∂F(αA)/∂A dα (F the probability of the gold label, only that layer's attention scaled by α; "
        f"{attribution.rule} integral, {attribution.steps} steps), averaged over the first "
        f"{attribution.examples} dev examples ({attribution.seconds / max(attribution.examples, 1):.2f} s "
        "per example). Heads of low score are pruned first in the curve by attribution."
    )
    return page.Section(
        "Self-attention attribution",
        "attribution",
        [
            page.paragraph(text),
            page.figure(png, alt="attribution per head", caption="Layer x head, 0-based."),
        ],
    )


def _pruning_section(run: AblationRun) -> page.Section:
    """The "Structural pruning" section: the original, the original with the removed heads gated to 0 and
    the pruned copy compared, the removed heads and, where it was saved, where the pruned model is and how to
    load it."""
    outcome, terms = run.pruning, run.terms
    assert outcome is not None
    heads = f"{terms.head}s"
    kept = outcome.total_heads - outcome.removed
    frame = pd.DataFrame(
        {
            "model": ["original", "original, heads gated to 0", "pruned"],
            heads: [outcome.total_heads, kept, kept],
            **(
                {"key/value heads": [outcome.total_key_value_heads] * 2 + [outcome.key_value_heads]}
                if outcome.grouped
                else {}
            ),
            "parameters": [outcome.baseline_parameters, outcome.baseline_parameters, outcome.parameters],
            outcome.score.name: [outcome.baseline, outcome.gated, outcome.value],
            "inference seconds": [outcome.baseline_seconds, np.nan, outcome.seconds],
            "speed-up": [1.0, np.nan, outcome.speedup],
        }
    )
    grouped = (
        ", and a key/value head's rows of the key and value projections once all the query heads sharing it "
        "were removed. Where the key/value heads kept serve different numbers of query heads, some removed "
        "query heads stay with zero output columns (every key/value head of a layer serves the same number)"
    )
    explanation = (
        f"The {outcome.removed} least important {heads} (Michel et al.'s normalised importance) were removed "
        f"from the weights: their rows of the query{'' if outcome.grouped else ', key and value'} "
        f"projection{'' if outcome.grouped else 's'} and their columns of the output projection"
        f"{grouped if outcome.grouped else ''}. The pruned model's logits differ from the gated original's "
        f"by at most {outcome.largest_difference:.2g}; it ran {outcome.speedup:.2f}x as fast (the fastest of "
        "3 passes over the same batches, forward passes only, the two models taking turns, after a warm-up "
        "round)."
    )
    removed = "; ".join(
        f"layer {layer}: {', '.join(map(str, heads))}" for layer, heads in outcome.heads.items()
    )
    blocks = [
        page.paragraph(explanation),
        page.table(frame, float_format="{:.4g}"),
        page.paragraph(f"Removed {heads} (0-based): {removed}.", class_="muted"),
    ]
    if run.pruned_dir is not None:
        blocks.append(
            page.paragraph(
                f"The pruned model is saved as a run folder in {run.pruned_dir} "
                f"(load it with load_model('{run.pruned_dir}', {terms.pruned_as}=True))."
            )
        )
    return page.Section("Structural pruning", "pruning", blocks)


def how_removed(kind: str, description: str) -> str:
    """How the study removed a head, for its report: the gate for zero ablation, else the replacement's
    ``description`` (:mod:`~bertology.interventions.replacement`)."""
    if kind == "zero":
        return "its output multiplied by 0 before the output projection"
    return f"{description}, before the output projection"


def _write_study(run: AblationRun, target: Path, dpi: int) -> list[page.Section]:
    """What every ablation folder holds, a classifier's or a language model's: ``ablation.csv``,
    ``importance.csv``, ``pruning_curve.csv``, ``summary.json`` (with the curve and ``pruning``), the
    folder's mark, and in ``plots/`` the heatmaps of the single-head change and of the importance and the
    pruning curves. Returns the report's sections on them: single-head ablation, head importance and
    pruning curves, in the run's terms."""
    terms = run.terms
    target.mkdir(parents=True, exist_ok=True)
    ablation, importance = run.ablation, run.importance
    ablation.to_frame().to_csv(target / "ablation.csv", index=False)
    importance.to_frame().to_csv(target / "importance.csv", index=False)
    curve = run.curve_frame()
    curve.to_csv(target / "pruning_curve.csv", index=False)
    summary = {
        **run.summary(),
        "pruning_curve": curve.to_dict(orient="list"),
        "pruning": None if run.pruning is None else run.pruning.to_dict(),
    }
    (target / SUMMARY_FILE).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    mark_run(target, "ablation", model=run.model_name)
    score = ablation.score
    ablation_png = plots.heatmap_png(
        target,
        "ablation",
        {f"{score.name} change when removed": ablation.change},
        dpi,
        unit=f"{score.name} change" if score.unit == score.name else score.unit,
        value_range=plots.value_range_of(ablation.change, symmetric=True),
        cmap=plots.DIVERGING_COLORMAP,
    )
    importance_png = plots.heatmap_png(
        target,
        "importance",
        {"importance, normalised per layer": importance.normalized, "importance": importance.raw},
        dpi,
        columns=2,
        unit="E|dL/dξ|",
    )
    curve_png = _save_png(target, "pruning_curve", _curve_figure(run, curve, terms.axis), dpi)
    removal = how_removed(run.ablation_kind, run.ablation_description)
    best = "highest" if score.higher_is_better else "lowest"
    orders = [
        f"by the {score.name} left when the head alone is removed ({best} first)",
        "by normalised importance (lowest first)",
        *(
            ["by self-attention attribution (lowest first, where measured)"]
            if "attribution" in run.curves
            else []
        ),
        f"in a random order (seed {run.random_seed})",
    ]
    return [
        page.Section(
            "Single-head ablation",
            "ablation",
            [
                page.paragraph(
                    f"{run.words('sentence')} Each cell is the {score.name} with only that {terms.head} "
                    f"removed ({removal}) minus that baseline{terms.sign} (Michel et al. 2019)."
                ),
                page.figure(
                    ablation_png, alt=f"{score.name} change per head", caption="Layer x head, 0-based."
                ),
            ],
        ),
        page.Section(
            "Head importance",
            "importance",
            [
                page.paragraph(
                    "Michel et al.'s importance I_h = E_x |∂L(x)/∂ξ_h|: the mean over "
                    f"{terms.averaged} of the magnitude of the gradient of {terms.loss} with respect to "
                    "the head's gate ξ_h (1 = unchanged). Left: normalised by the L2 norm of its layer's "
                    "scores, as in the paper; right: raw."
                ),
                page.figure(importance_png, alt="head importance", caption="Layer x head, 0-based."),
            ],
        ),
        page.Section(
            "Pruning curves",
            "curves",
            [
                page.paragraph(
                    f"{terms.axis.capitalize()} after removing ({run.ablation_kind} ablation) more "
                    f"and more heads, least useful first: {', '.join(orders[:-1])} and {orders[-1]}."
                ),
                page.table(curve, float_format="{:.4f}"),
                page.figure(curve_png, alt="pruning curves"),
            ],
        ),
    ]


#: Summary entries the report's header leaves out: the warning (shown apart) and the score's machine keys
#: (the task's own key shows it).
HIDDEN_IN_HEADER = ("warning", "score", "score_name", "higher_is_better")


def write_ablation_report(run: AblationRun, outdir: str | Path, *, dpi: int = 110) -> Path:
    """Write the results of :func:`~bertology.interventions.run.run_ablation` into ``outdir``:
    ``ablation.csv``, ``importance.csv``, ``pruning_curve.csv``, ``summary.json`` (with ``pruning``), the
    PNGs in ``plots/`` and ``report.html``, and for a classifier ``attention_gradients.csv`` (per head),
    ``attention_gradients_by_layer.csv`` and, where measured, ``attribution_importance.csv``; return the
    report."""
    target = Path(outdir)
    sections = _write_study(run, target, dpi)
    if run.attribution is not None:
        run.attribution.to_frame().to_csv(target / ATTRIBUTION_IMPORTANCE_FILE, index=False)
        sections.insert(2, _attribution_section(run, target, dpi))
    if run.attention_gradients is not None:
        sections.append(_gradients_section(run, run.attention_gradients, target, dpi))
    if run.pruning is not None:
        sections.append(_pruning_section(run))
    report = target / REPORT_FILE
    title = f"Head ablation: {run.model_name} on {run.source}{run.terms.title}"
    shown = {key: value for key, value in run.summary().items() if key not in HIDDEN_IN_HEADER}
    header = [page.definitions(shown)]
    if run.warning is not None:
        header.insert(0, page.paragraph(f"Warning: {run.warning}", class_="warning"))
    report.write_text(page.render_page(title, sections, header=header), encoding="utf-8")
    return report


def _gradients_section(
    run: AblationRun, gradients: AttentionGradients, target: Path, dpi: int
) -> page.Section:
    """A classifier's attention gradients by key category: their CSV files, plot and section."""
    gradients.to_frame().to_csv(target / "attention_gradients.csv", index=False)
    by_layer = pd.DataFrame(gradients.per_layer, columns=list(CATEGORIES)).rename_axis("layer").reset_index()
    by_layer.to_csv(target / "attention_gradients_by_layer.csv", index=False)
    gradient_png = _save_png(target, "attention_gradients", _gradient_figure(run, gradients), dpi)
    return page.Section(
        "Attention gradients",
        "gradients",
        [
            page.paragraph(
                "Mean magnitude of the gradient of the loss with respect to the attention weights, by "
                'what the weight attends to: [SEP], punctuation ("." and ",") or any other token (Clark '
                f"et al. 2019, Figure 3). Loss: {gradients.loss} (for a classifier, the cross-entropy of "
                "each example's gold label). Points: heads; lines: the mean over each layer's heads."
            ),
            page.table(by_layer, float_format="{:.3g}"),
            page.figure(gradient_png, alt="attention gradients per layer"),
        ],
    )


def _colour(value: float, scale: float) -> str:
    """CSS style of an attribution: a red (positive) or blue (negative) background of opacity
    |value| / scale, with white text on the strongest."""
    red, green, blue = POSITIVE_RGB if value >= 0 else NEGATIVE_RGB
    alpha = 0.0 if scale <= 0 else min(1.0, abs(value) / scale)
    text = "color: #fff; " if alpha > 0.6 else ""
    background = f"background-color: rgba({red}, {green}, {blue}, {alpha:.3f})"
    return f"{text}{background}; padding: 0 .15em; border-radius: 3px"


def _coloured_tokens(tokens: list[str], values: np.ndarray) -> page.Markup:
    """The tokens as text, each on a background of its attribution's colour (hover: the value)."""
    scale = float(np.abs(values).max()) if values.size else 0.0
    return page.coloured_tokens(
        [
            (token, _colour(float(value), scale), f"{value:+.4g}")
            for token, value in zip(tokens, values, strict=True)
        ]
    )


#: The strongest direct contributions listed (largest in size, either sign).
TOP_HEADS = 10


def _direct_logit_section(heads: DirectLogitAttribution, label: str, dpi: int = 144) -> page.Section:
    """A layer x head heatmap of the heads' direct contributions, the strongest heads and the remaining
    terms of the logit."""
    table = HeadTable(columns={"direct contribution": heads.heads}, defined_segments={}, segments=1)
    largest = float(np.abs(heads.heads).max()) or 1.0
    figure = plots.heatmaps(
        table,
        ["direct contribution"],
        value_range=(-largest, largest),
        unit="logit",
        cmap=plots.DIVERGING_COLORMAP,
    )
    frame = heads.to_frame()
    strongest = frame.iloc[
        np.argsort(-np.abs(frame["logit_contribution"].to_numpy()), kind="stable")[:TOP_HEADS]
    ]
    terms = pd.DataFrame(
        {
            "term": ["all heads", "MLPs", "embedding", "output projection biases", "unembedding bias", "sum",
                     "the model's logit"],
            "logit": [heads.heads.sum(), heads.mlps.sum(), heads.embedding, heads.biases.sum(),
                      heads.unembedding_bias, heads.total, heads.logit],
        }
    )  # fmt: skip
    return page.Section(
        "Direct logit attribution",
        "heads",
        [
            page.figure(
                plots.to_png(figure, dpi=dpi),
                alt="Layer by head heatmap of each head's direct contribution to the target's logit",
                caption=f"Each head's direct contribution to the logit of {label!r}: red raises it, blue "
                "lowers it; layers top to bottom, heads left to right, both 0-based.",
                width=round(figure.get_figwidth() * 96),
            ),
            page.heading("Strongest heads"),
            page.table(strongest, float_format="{:+.4g}"),
            page.heading("The logit, term by term"),
            page.table(terms, float_format="{:+.6g}"),
            page.docstring_html(docstring(direct_logit, summary=False)),
        ],
    )


#: How the pages name each convention.
CONVENTION_NAMES = {
    "bertology": "bertology (ours)",
    "allennlp": "allennlp (AllenNLP Interpret's definitions)",
}


def _reading(explanation: Explanation, methods: list[str], what: str) -> str:
    """How to read the coloured tokens of ``explanation``, in its convention."""
    if explanation.convention == "allennlp":
        notes = {
            "integrated-gradients": f" Integrated gradients: the mean gradient at {explanation.steps} points "
            "from the zero embedding (a left Riemann sum) times the input.",
            "smoothgrad": " SmoothGrad: the mean gradient over noisy copies of the input's embeddings, not "
            "times the input.",
        }
        return (
            f"AllenNLP Interpret's convention: the gradient of the loss of the {what} with respect to the "
            "word embeddings, summed over the embedding dimension per token, its absolute value divided by "
            "the sum over the tokens (each method's scores are at least 0 and sum to 1); the stronger the "
            "colour, the larger the share." + "".join(note for m, note in notes.items() if m in methods)
        )
    baseline = (
        "every token but the first is the padding token"
        if explanation.heads is not None
        else "every non-special token is [PAD]"
    )
    notes = {
        "integrated-gradients": f" Integrated gradients start from a baseline where {baseline}; their "
        "attributions sum to the logit difference between input and baseline.",
        "smoothgrad": " SmoothGrad is the gradient averaged over noisy copies of the input's embeddings.",
    }
    return (
        f"Red: the token pushes towards the target {what}; blue: away from it; the stronger the colour, "
        "the larger the attribution relative to the largest of that method (hover a token for its value, "
        "in logit units)." + "".join(note for method, note in notes.items() if method in methods)
    )


def write_explanation(explanation: Explanation, path: str | Path) -> tuple[Path, Path]:
    """Write ``explanation`` as an HTML page at ``path`` (coloured tokens per method and a table; for a
    decoder also the heads' direct logit attribution as a layer x head heatmap) and as JSON beside it (same
    name, ``.json``, the heads' grid included); return both paths."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    json_path = target.with_suffix(".json")
    write_text(json_path, explanation.to_json())
    methods = list(explanation.attributions)
    decoder = explanation.heads is not None
    what = "next token" if decoder else "label"
    blocks = [page.paragraph(_reading(explanation, methods, what))]
    for method in methods:
        blocks += [
            page.heading(METHOD_TITLES[method]),
            _coloured_tokens(explanation.tokens, explanation.attributions[method]),
        ]
    frame = pd.DataFrame(
        {"token": explanation.tokens, **{METHOD_TITLES[m]: explanation.attributions[m] for m in methods}}
    )
    details: dict[str, object] = {
        "text": explanation.text,
        "second text": explanation.text_b,
        f"target {what}": explanation.label,
        f"predicted {what}": explanation.predicted,
        "probability": round(explanation.probability, 4),
        "logit": f"{explanation.logit:.4g}",
        "convention": CONVENTION_NAMES[explanation.convention],
    }
    gap = explanation.completeness_gap
    if gap is not None:
        details["integrated gradients"] = (
            f"{explanation.steps} steps, baseline logit {explanation.baseline_logit:.4g}, completeness gap "
            f"{gap:.2g}"
        )
    elif "integrated-gradients" in methods:
        details["integrated gradients"] = f"{explanation.steps} steps"
    if "smoothgrad" in methods:
        details["SmoothGrad"] = (
            f"{explanation.samples} samples, noise level {explanation.noise:g}, seed {explanation.seed}"
        )
    header = [page.definitions(details)]
    sections = [
        page.Section("Attributions", "attributions", blocks),
        page.Section("Values", "values", [page.table(frame, float_format="{:+.4g}")]),
    ]
    if explanation.heads is not None:
        sections.append(_direct_logit_section(explanation.heads, explanation.label))
    write_text(target, page.render_page("Saliency", sections, header=header))
    return target, json_path
