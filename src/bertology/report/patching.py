"""The folder of a patching run (``bertology patch``): tables, heatmaps, ``summary.json`` and the report.

- ``effects.csv`` (every run): one column per axis of the granularity's grid
  (:data:`~bertology.interventions.patch_grid.GRIDS`: ``layer``, ``head``, ``position``, 0-based) and
  ``effect`` (with ``--method both`` also ``attribution``, attribution patching's estimate of the same
  effect); an encoder-decoder's site (``encoder:z``) puts its stack first, a ``stack`` column
  (``encoder``, ``decoder`` or ``cross``), its positions being that stack's (the source's, or the target
  prefix's: :mod:`~bertology.interventions.patching_pairs`).
- ``head_effects.csv``: ``layer``, ``head``, ``effect`` (and ``attribution``) for a layer x head grid
  (granularity ``head``).
- ``position_effects.csv``: ``layer`` (and ``head``), ``position``, ``clean_token`` (the word-start marks
  Ġ and ▁ shown as spaces, as in the plots and the views), ``effect`` (granularities ``head-position`` and
  ``position``).
- ``pair_effects.csv``: every patch's ``ld_patched`` and ``effect`` for each pair (``pair``: 0-based, the
  file's order), by method.
- ``summary.json``: the settings (``site``, ``granularity``, ``ablation``: ``counterfactual``, ``zero`` or
  ``mean``, and ``ablation_description``, ``metric``: ``logit-diff``, ``prob-diff`` or ``kl``, and
  ``metric_description``), the metric's mean clean and corrupted (``ld_clean``,
  ``ld_corrupted``, named for the default logit difference ``LD``), each pair with its texts (an
  encoder-decoder's pair with its ``target`` prefix) and values,
  the largest effects by size with their sign (``top``; heads also by ``name``, ``"layer-head"``
  0-based), and with both methods their agreement on that set.
- ``plots/effects_<method>.png`` (diverging colours centred at 0, positions labelled with the first pair's
  clean tokens) and ``report.html`` with the inputs (and, for a model with a note such as a quantised
  file's, the note first); a layer x head grid is also an interactive heatmap there
  (:mod:`bertology.report.head_grid`: the value on hover, a click opens the head's attention on the first
  pair's clean and corrupted input).

Path patching (``--senders``/``--receivers``) writes ``path_patching.json`` (with ``frozen``, the run kept
frozen and patched, and ``metric``) and its report instead; with each sender alone (``--senders each``,
``--sweep``) also ``path_effects.csv`` (``layer``, ``head``, ``effect``) and ``plots/path_effects.png``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup
from matplotlib.figure import Figure

from bertology.files.run_files import REPORT_FILE, SUMMARY_FILE, mark_run
from bertology.interventions.patching import PatchingResult, PatchingStudy, largest, roles
from bertology.interventions.patching_metrics import METRICS
from bertology.interventions.path_patching import PathPatching, PathPatchingSweep
from bertology.models.heads import head_name
from bertology.models.sites import site_of
from bertology.options import PatchDirection
from bertology.report import page, plots
from bertology.report.head_grid import head_grid
from bertology.views.bertviz import prettify

EFFECTS_FILE = "effects.csv"
HEAD_EFFECTS_FILE = "head_effects.csv"
POSITION_EFFECTS_FILE = "position_effects.csv"
PAIR_EFFECTS_FILE = "pair_effects.csv"
PATH_PATCHING_FILE = "path_patching.json"
#: How many heads (or cells) the summary and the report list, by the size of their effect.
TOP = 10


def _cells(result: PatchingResult) -> list[str]:
    """The index columns of ``result``'s grid: its axes."""
    return list(result.grid.axes)


def _grid_frame(result: PatchingResult, values: np.ndarray, name: str) -> pd.DataFrame:
    """One row per cell of ``values`` (shaped as ``result``'s grid): its index columns and ``name``."""
    index = np.indices(values.shape).reshape(values.ndim, -1)
    return pd.DataFrame({**dict(zip(_cells(result), index, strict=True)), name: values.ravel()})


def effects_frame(study: PatchingStudy, tokens: bool = True) -> pd.DataFrame:
    """Each patch's effect (exact where computed, else attribution's), with attribution's beside it when
    both ran (``effects.csv``); ``tokens``: positions with their clean token (``head_effects.csv``,
    ``position_effects.csv``)."""
    main = study.exact or study.attribution
    assert main is not None
    frame = _grid_frame(main, main.effect, "effect")
    if study.exact is not None and study.attribution is not None:
        frame["attribution"] = study.attribution.effect.ravel()
    if tokens and "position" in frame:
        frame.insert(
            frame.columns.get_loc("position") + 1,
            "clean_token",
            [prettify(study.tokens[0][0][p]) for p in frame["position"]],
        )
    return frame


def pair_frame(study: PatchingStudy) -> pd.DataFrame:
    """Every patch's ``LD`` and effect for every pair, by method (``pair_effects.csv``)."""
    frames = []
    for result in study.results:
        pairs = result.ld_patched.shape[-1]
        cells = np.indices(result.ld_patched.shape[:-1]).reshape(result.ld_patched.ndim - 1, -1)
        frame = pd.DataFrame(
            {
                "method": result.method,
                **{
                    name: np.repeat(column, pairs) for name, column in zip(_cells(result), cells, strict=True)
                },
                "pair": np.tile(np.arange(pairs), cells.shape[1]),
                "ld_patched": result.ld_patched.ravel(),
                "effect": result.effect_per_pair.ravel(),
            }
        )
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def top_cells(result: PatchingResult, count: int = TOP) -> list[dict[str, Any]]:
    """The ``count`` patches of largest effect by absolute size, with its sign, largest first
    (:func:`~bertology.interventions.patching.largest`: the set the agreement is computed on): each its
    cell (0-based), the head's name (``"layer-head"``) where the cell is a head's, and ``effect``."""
    effect = result.effect
    cells = []
    for i in largest(effect, count):
        cell = dict(zip(_cells(result), map(int, np.unravel_index(i, effect.shape)), strict=True))
        name = {"name": head_name(cell["layer"], cell["head"])} if "head" in cell else {}
        cells.append({**name, **cell, "effect": float(effect.ravel()[i])})
    return cells


def largest_effects_text(result: PatchingResult, count: int = 5) -> str:
    """``"23-3 +0.652, 24-4 -0.301, ..."``: the ``count`` largest effects by size, for a command's output."""
    return ", ".join(
        f"{cell.get('name', 'layer ' + str(cell['layer']))}"
        + (f" at {cell['position']}" if "position" in cell else "")
        + f" {cell['effect']:+.3f}"
        for cell in top_cells(result, count)
    )


def ablation_text(ablation: str, direction: PatchDirection) -> str:
    """What a patch writes, in words (``summary.json``'s ``ablation_description`` and the report)."""
    source, target = roles(direction)
    if ablation == "zero":
        return f"zero: 0 in place of the site's activation in the {target} run"
    if ablation == "mean":
        return (
            f"mean: the site's activation in the {source} run averaged over every pair and every position of "
            f"its texts, in place of the site's activation in the {target} run"
        )
    return f"counterfactual: the {source} run's activation in place of the {target} run's"


def colour_caption(direction: PatchDirection, ablation: str = "counterfactual") -> str:
    """What the heatmap's colours mean under ``direction`` and ``ablation``."""
    if ablation != "counterfactual":
        run = roles(direction)[1]
        if direction == "noising":
            return (
                f"Blue: {ablation}-ablating the site in the clean run removes the answer (-1: all of it), so "
                "the answer needs the site's information; red: ablating it raises the answer's lead above "
                "the clean run's."
            )
        return (
            f"Red: {ablation}-ablating the site in the {run} run raises the answer's lead toward the clean "
            "run's (1: all the way), so the site's information there works against the answer; blue: "
            "ablating it lowers the lead further."
        )
    if direction == "denoising":
        return (
            "Red: putting the clean activation into the corrupted run restores the answer (1: all of it); "
            "blue: it works against the answer."
        )
    return (
        "Blue: putting the corrupted activation into the clean run removes the answer (-1: all of it), so "
        "the patch matters; red: it raises the answer's lead above the clean run's."
    )


def summary(study: PatchingStudy) -> dict[str, Any]:
    """``summary.json``'s content."""
    main = study.exact or study.attribution
    assert main is not None
    pairs = [
        {
            "clean": pair.clean,
            "corrupted": pair.corrupted,
            **({} if pair.target is None else {"target": pair.target}),
            "answer": answer,
            "wrong": wrong,
            "ld_clean": float(main.ld_clean[index]),
            "ld_corrupted": float(main.ld_corrupted[index]),
        }
        for index, (pair, (answer, wrong)) in enumerate(zip(study.pairs, study.labels, strict=True))
    ]
    return {
        "model": study.model_name,
        "kind": "language model" if study.language_model else "classifier",
        "direction": main.direction,
        "site": main.site,
        "granularity": main.granularity,
        "ablation": main.ablation,
        "ablation_description": ablation_text(main.ablation, main.direction),
        "methods": [result.method for result in study.results],
        "metric": main.metric,
        "metric_description": _metric_text(main.metric, study.language_model),
        "pairs": len(study.pairs),
        "ld_clean": float(main.ld_clean.mean()),
        "ld_corrupted": float(main.ld_corrupted.mean()),
        "top": {result.method: top_cells(result) for result in study.results},
        "agreement": study.agreement(TOP),
        "pair_details": pairs,
    }


def position_labels(tokens: list[str]) -> list[str]:
    """``"3 Mary"``: each position's number (0-based) and its token."""
    return [f"{position} {token}" for position, token in enumerate(tokens)]


def positions_figure(
    values: np.ndarray,
    rows: list[str],
    tokens: list[str],
    title: str,
    columns: list[str] | None = None,
    column_axis: str = "position: token of the first pair's clean input",
) -> Figure:
    """A rows x positions heatmap of effects, diverging colours centred at 0 (``columns``: other column
    labels than :func:`position_labels` of ``tokens``, under ``column_axis``)."""
    columns = position_labels(tokens) if columns is None else columns
    figure = plots.new_figure(min(12.0, 2.5 + 0.45 * len(columns)), min(40.0, 1.5 + 0.16 * len(rows)))
    ax = figure.subplots()
    low, high = plots.value_range_of(values, symmetric=True)
    image = ax.imshow(
        values, cmap=plots.DIVERGING_COLORMAP, vmin=low, vmax=high, aspect="auto", interpolation="nearest"
    )
    figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02).set_label("effect")
    ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=7)
    ax.set_xlabel(column_axis, fontsize=8)
    ticks = plots.index_ticks(len(rows), most=40)
    ax.set_yticks(ticks, [rows[t] for t in ticks], fontsize=7)
    ax.set_title(title, fontsize=9)
    return figure


def _effects_png(study: PatchingStudy, result: PatchingResult, target: Path, dpi: int) -> bytes:
    name = f"effects_{result.method}"
    ablated = "" if result.ablation == "counterfactual" else f", {result.ablation} ablation"
    title = f"{result.site}, {result.method}, {result.direction}{ablated}"
    axes = result.grid.axes
    if axes == ("layer", "head"):
        return plots.heatmap_png(
            target,
            name,
            {title: result.effect},
            dpi,
            unit="effect (1: restores all)"
            if result.direction == "denoising"
            else "effect (-1: removes all)",
            value_range=plots.value_range_of(result.effect, symmetric=True),
            cmap=plots.DIVERGING_COLORMAP,
        )
    effect = result.effect
    tokens = [prettify(token) for token in study.tokens[0][0]]
    if "head" in axes:
        rows = [head_name(layer, head) for layer in range(effect.shape[0]) for head in range(effect.shape[1])]
        figure = positions_figure(effect.reshape(len(rows), -1), rows, tokens, title)
    else:
        per_layer = site_of(result.site).per_layer
        rows = [f"layer {layer}" if per_layer else result.site for layer in range(effect.shape[0])]
        if "position" in axes:
            figure = positions_figure(effect, rows, tokens, title)
        else:
            figure = positions_figure(effect[:, None], rows, tokens, title, [result.site], "every position")
    png = plots.to_png(figure, dpi=dpi)
    (target / "plots").mkdir(parents=True, exist_ok=True)
    (target / "plots" / f"{name}.png").write_bytes(png)
    return png


def _top_table(study: PatchingStudy, result: PatchingResult) -> pd.DataFrame:
    """The report's table of :func:`top_cells`: heads by name (``layer-head``, 0-based), positions with the
    first pair's clean token, and the effect."""
    top = pd.DataFrame(top_cells(result))
    if "name" in top:
        top = top.drop(columns=["layer", "head"]).rename(columns={"name": "head (layer-head)"})
    if "position" in top:
        tokens = [prettify(study.tokens[0][0][position]) for position in top["position"]]
        top.insert(top.columns.get_loc("position") + 1, "token", tokens)
    return top


def _interactive_grid(study: PatchingStudy, result: PatchingResult, with_panels: bool) -> list[Markup]:
    """For a layer x head grid, :func:`~bertology.report.head_grid.head_grid` of its effects, the heads'
    attention on the first pair a click away where the grid's heads are the attention's (not a
    grouped-query model's key/value heads); nothing for other grids."""
    if result.grid.axes != ("layer", "head"):
        return []
    effect = result.effect
    fits = bool(study.attention) and study.attention["clean"].shape[:2] == effect.shape
    clean, corrupted = ([prettify(token) for token in run] for run in study.tokens[0])
    return [
        head_grid(
            effect, "head", study.attention if fits else {}, (clean, corrupted), with_panels=with_panels
        )
    ]


def _pairs_table(study: PatchingStudy) -> pd.DataFrame:
    main = study.exact or study.attribution
    assert main is not None
    answer, wrong = ("answer", "wrong") if study.language_model else ("label", "wrong label")
    symbol = METRICS[main.metric].symbol
    targets = [pair.target for pair in study.pairs]
    return pd.DataFrame(
        {
            "clean": [pair.clean for pair in study.pairs],
            "corrupted": [pair.corrupted for pair in study.pairs],
            **({"target": [target or "" for target in targets]} if any(targets) else {}),
            answer: [names[0] for names in study.labels],
            wrong: [names[1] for names in study.labels],
            f"{symbol} clean": main.ld_clean,
            f"{symbol} corrupted": main.ld_corrupted,
        }
    )


def _metric_text(metric: str, language_model: bool) -> str:
    """What the metric ``metric`` is, in words."""
    if metric == "logit-diff" and not language_model:
        return "the logit difference of the two labels"
    if metric == "logit-diff":
        return (
            "logit(answer) - logit(wrong) at the last token (answers of several tokens: the difference of "
            "their log-probabilities under teacher forcing)"
        )
    return METRICS[metric].description  # type: ignore[index]


def _explanation(result: PatchingResult) -> str:
    """What a cell of ``result``'s heatmap is."""
    denoising = result.direction == "denoising"
    moved = (
        "clean activations into the corrupted run"
        if denoising
        else "corrupted activations into the clean run"
    )
    baseline = "corrupted" if denoising else "clean"
    m = METRICS[result.metric].symbol
    done = f"patching site {result.site} there ({result.direction}: {moved})"
    if result.ablation != "counterfactual":
        done = (
            f"{result.ablation}-ablating site {result.site} there, removing its information "
            f"({ablation_text(result.ablation, result.direction)})"
        )
    text = (
        f"Each cell: the effect of {done}, (mean {m}_patched - mean {m}_{baseline}) / (mean {m}_clean - "
        f"mean {m}_corrupted), {m} averaged over the pairs first."
    )
    if result.method == "attribution":
        source = "source" if result.ablation == "counterfactual" else "ablated"
        text += (
            f" Estimated to first order: ({source} - target activation) · d{m}/d activation at the target "
            "run (Nanda 2023; Kramar et al. 2024)."
        )
    return text


def write_patching_report(study: PatchingStudy, outdir: str | Path, *, dpi: int = 110) -> Path:
    """Write ``study`` into ``outdir`` (module docstring) and return ``report.html``."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    main = study.exact or study.attribution
    assert main is not None
    effects = effects_frame(study, tokens=False)
    stack = main.site.rpartition(":")[0]
    if stack:
        effects.insert(0, "stack", stack)
    effects.to_csv(target / EFFECTS_FILE, index=False)
    if main.grid.axes == ("layer", "head"):
        effects_frame(study).to_csv(target / HEAD_EFFECTS_FILE, index=False)
    if main.grid.per_position:
        effects_frame(study).to_csv(target / POSITION_EFFECTS_FILE, index=False)
    pair_frame(study).to_csv(target / PAIR_EFFECTS_FILE, index=False)
    content = summary(study)
    (target / SUMMARY_FILE).write_text(json.dumps(content, indent=2), encoding="utf-8")
    mark_run(target, "patching", model=study.model_name)
    symbol = METRICS[main.metric].symbol
    sections = []
    for index, result in enumerate(study.results):
        png = _effects_png(study, result, target, dpi)
        top = _top_table(study, result)
        grid = _interactive_grid(study, result, with_panels=index == 0)
        sections.append(
            page.Section(
                f"{result.method.capitalize()} patching",
                result.method,
                [
                    page.paragraph(_explanation(result)),
                    page.figure(
                        png,
                        alt=f"{result.method} patching effects",
                        caption=(
                            f"Layers and heads 0-based. {colour_caption(result.direction, result.ablation)}"
                        ),
                    ),
                    *grid,
                    page.paragraph(
                        f"The {len(top)} largest effects by size, with their sign"
                        + (
                            ", positions with the token of the first pair's clean input:"
                            if "token" in top
                            else ":"
                        )
                    ),
                    page.table(top, float_format="{:+.3f}"),
                ],
            )
        )
    agreement = study.agreement(TOP)
    if agreement is not None:
        sections.append(
            page.Section(
                "Agreement",
                "agreement",
                [
                    page.paragraph(
                        "Pearson correlation of the exact and the attribution effects over every patch: "
                        f"{agreement['pearson']:.3f}; of the {agreement['top_k']} largest exact effects by "
                        f"size (the exact table above), {agreement['top_k_agreement']:.0%} are among "
                        f"attribution's {agreement['top_k']} largest by size."
                    )
                ],
            )
        )
    sections.append(
        page.Section(
            "Pairs",
            "pairs",
            [
                page.paragraph(f"{symbol}: {content['metric_description']}."),
                page.table(_pairs_table(study), float_format="{:.3f}"),
            ],
        )
    )
    header = [
        *page.model_note(study.model_name),
        page.definitions(
            {
                "model": study.model_name,
                "direction": main.direction,
                "ablation": ablation_text(main.ablation, main.direction),
                "site": f"{main.site}: {site_of(main.site).meaning}",
                "granularity": f"{main.granularity}: {main.grid.meaning}",
                "metric": main.metric,
                "pairs": len(study.pairs),
                f"mean {symbol} clean": content["ld_clean"],
                f"mean {symbol} corrupted": content["ld_corrupted"],
            }
        ),
    ]
    report = target / REPORT_FILE
    report.write_text(
        page.render_page(f"Patching: {study.model_name}", sections, header=header), encoding="utf-8"
    )
    return report


PATH_EFFECTS_FILE = "path_effects.csv"


def _path_content(result: PathPatching | PathPatchingSweep, model_name: str) -> dict[str, Any]:
    """What ``path_patching.json`` holds of either kind of run: the model, the direction, the receivers
    (``"23-3:q"``, ``"23-3:q@-1"`` for one position), ``frozen`` (the run frozen and patched), the metric
    and the per-pair clean and corrupted ``LD``s."""
    return {
        "model": model_name,
        "direction": result.direction,
        "receivers": [receiver.name for receiver in result.receivers],
        "frozen": roles(result.direction)[1],
        "metric": result.metric,
        "ld_clean": result.ld_clean.tolist(),
        "ld_corrupted": result.ld_corrupted.tolist(),
    }


def _path_text(result: PathPatching | PathPatchingSweep, senders: str) -> str:
    """The report's sentence of what was patched and which run was frozen."""
    source, frozen = roles(result.direction)
    m = METRICS[result.metric].symbol
    return (
        f"{senders} (heads layer-head, 0-based) take their output from the {source} run and reach receivers "
        f"{', '.join(receiver.name for receiver in result.receivers)} only ({result.direction}; @p: only "
        f"position p of the texts, negative from the end); every other head is frozen at the {frozen} run, "
        f"which is the run patched (Wang et al. 2022). {m}: {result.metric}."
    )


def _write_path_report(target: Path, model_name: str, content: dict[str, Any], blocks: list[str]) -> Path:
    (target / PATH_PATCHING_FILE).write_text(json.dumps(content, indent=2), encoding="utf-8")
    mark_run(target, "patching", model=model_name)
    report = target / REPORT_FILE
    section = page.Section("Path patching", "path", blocks)
    report.write_text(
        page.render_page(f"Path patching: {model_name}", [section], header=page.model_note(model_name)),
        encoding="utf-8",
    )
    return report


def write_path_patching_report(result: PathPatching, model_name: str, outdir: str | Path) -> Path:
    """Write ``path_patching.json`` (senders, receivers, per-pair ``LD``s, effect), the folder's mark and
    ``report.html`` into ``outdir``; return the report."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    senders = [head_name(layer, head) for layer, head in result.senders]
    content = {
        **_path_content(result, model_name),
        "senders": senders,
        "effect": result.effect,
        "ld_patched": result.ld_patched.tolist(),
    }
    m = METRICS[result.metric].symbol
    frame = pd.DataFrame(
        {
            f"{m} clean": result.ld_clean,
            f"{m} corrupted": result.ld_corrupted,
            f"{m} patched": result.ld_patched,
        }
    )
    blocks = [
        page.paragraph(f"{_path_text(result, 'Senders ' + ', '.join(senders))} Effect {result.effect:.3f}."),
        page.table(frame.rename_axis("pair").reset_index(), float_format="{:.3f}"),
    ]
    return _write_path_report(target, model_name, content, blocks)


def path_effects_frame(result: PathPatchingSweep) -> pd.DataFrame:
    """``path_effects.csv``: one row per sender swept, ``layer``, ``head`` (0-based) and ``effect``."""
    layers, heads = zip(*result.senders, strict=True)
    return pd.DataFrame({"layer": layers, "head": heads, "effect": result.effect})


def largest_path_effects(result: PathPatchingSweep, count: int = TOP) -> list[dict[str, Any]]:
    """The ``count`` senders of largest effect by size, with its sign, largest first: ``name``
    (``"layer-head"``), ``layer``, ``head`` and ``effect``."""
    effect = result.effect
    return [
        {
            "name": head_name(*result.senders[i]),
            "layer": result.senders[i][0],
            "head": result.senders[i][1],
            "effect": float(effect[i]),
        }
        for i in largest(effect, count)
    ]


def write_path_sweep_report(
    result: PathPatchingSweep, model_name: str, outdir: str | Path, *, dpi: int = 110
) -> Path:
    """Write path patching with each sender alone into ``outdir``: ``path_effects.csv``,
    ``plots/path_effects.png`` (a layer x head heatmap, the heads not swept blank), ``path_patching.json``
    (with ``senders``, every sender's ``effect`` and ``top``, the largest by size) and ``report.html``;
    return the report."""
    target = Path(outdir)
    target.mkdir(parents=True, exist_ok=True)
    path_effects_frame(result).to_csv(target / PATH_EFFECTS_FILE, index=False)
    top = largest_path_effects(result)
    content = {
        **_path_content(result, model_name),
        "senders": "each",
        "effects": {
            head_name(*sender): float(value)
            for sender, value in zip(result.senders, result.effect, strict=True)
        },
        "top": top,
        "ld_patched": result.ld_patched.tolist(),
    }
    png = plots.heatmap_png(
        target,
        "path_effects",
        {f"path patching, {result.direction}": result.grid},
        dpi,
        unit="effect (1: restores all)",
        value_range=plots.value_range_of(result.grid, symmetric=True),
        cmap=plots.DIVERGING_COLORMAP,
    )
    table = pd.DataFrame(top).drop(columns=["layer", "head"]).rename(columns={"name": "sender (layer-head)"})
    blocks = [
        page.paragraph(
            f"{_path_text(result, 'Each sender alone')} Each cell: that sender's effect, "
            "normalised as activation patching's; blank: a head not swept."
        ),
        page.figure(
            png,
            alt="path patching effect of each sender",
            caption=f"Layers and heads 0-based. {colour_caption(result.direction)}",
        ),
        page.paragraph(f"The {len(table)} largest effects by size, with their sign:"),
        page.table(table, float_format="{:+.3f}"),
    ]
    return _write_path_report(target, model_name, content, blocks)
