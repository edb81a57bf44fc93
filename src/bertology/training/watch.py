"""The watch page of a training run: attention of the probe examples at every recorded step, and what
changed, as one self-contained HTML page.

The page is a bertology view page (``bertology.views``) of kind ``"watch"``: the head view or the model
view of one probe example, a slider over the recorded steps (the page carries every step, so moving it
redraws without loading anything), then the report: loss and accuracy, each head's statistics over the
steps, the change of each head's attention from the first to the last record (mean Jensen-Shannon
divergence, :mod:`bertology.training.compare`) as a heatmap and a ranked table. The training rules'
alerts (``run.json``'s ``alerts``) are listed at the top of the report, each moving the slider to its
step and, for alerts about heads, showing those heads; they are marked on the figures too (dashed lines
on the training curves, rings on the named heads' statistic curves, crosses on the change heatmap).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bertology.errors import BertologyError
from bertology.files.beneath import OpenFolder
from bertology.files.outputs import write_text
from bertology.files.run_files import TRAINING_FILE
from bertology.report.plots import title_of, to_png, unit_of
from bertology.stats.base import HeadTable
from bertology.training import plots
from bertology.training.archive import ARCHIVE_FOLDER, MonitorArchive, open_run, read_archive
from bertology.training.compare import head_change
from bertology.training.rules import Alert
from bertology.training.run_folder import METRICS_JSONL, run_status
from bertology.views.page import render_page
from bertology.views.payload import pack_attention

#: Statistics drawn as curves over the steps and compared before / after.
CURVE_STATISTICS = ("previous", "next", "current", "cls", "sep", "punct", "entropy", "confidence")
#: Heads outlined on the change heatmap and listed first in the table.
TOP_HEADS = 10
#: Characters of an example's text shown in the example selector.
CAPTION_CHARS = 70


#: The files (relative to the run folder) whose size and modification time change whenever the run's
#: watch page would: the archive's ``zarr.json`` (in ``monitor.zarr``, or in a bare archive folder)
#: changes with every complete record.
WATCH_STAMP_FILES = (TRAINING_FILE, METRICS_JSONL, f"{ARCHIVE_FOLDER}/zarr.json", "zarr.json")


def _run_info(run: OpenFolder) -> dict[str, Any]:
    """The run's ``run.json`` ({} when there is none).

    Raises:
        BertologyError: the file is not a JSON object (e.g. cut short), naming it.
    """
    try:
        data = run.read_bytes(TRAINING_FILE)
    except (FileNotFoundError, IsADirectoryError):
        return {}
    name = run.name_of(TRAINING_FILE)
    try:
        info = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BertologyError(
            f"{name} cannot be read as JSON ({error}); it is cut short or damaged."
        ) from error
    if not isinstance(info, dict):
        raise BertologyError(f"{name} does not hold a JSON object; it is damaged.")
    return info


def _metrics(run: OpenFolder) -> pd.DataFrame | None:
    """The rows of metrics.jsonl, or None; reading stops at the first line that is not a whole row
    (``step``, ``split``, ``loss``), such as a last line cut short by a killed run."""
    try:
        text = run.read_bytes(METRICS_JSONL).decode("utf-8", errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return None
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        if not (isinstance(row, dict) and {"step", "split", "loss"} <= row.keys()):
            break
        rows.append(row)
    return pd.DataFrame(rows) if rows else None


def _alerts(run: dict[str, Any], name: str) -> list[Alert]:
    """The alerts in ``run`` (a ``run.json``; none where it has none).

    Raises:
        BertologyError: ``alerts`` is not a list of alerts, naming the file ``name``.
    """
    try:
        return [Alert.from_json(item) for item in run.get("alerts") or []]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BertologyError(
            f"The alerts in {name} cannot be read ({error}); the file is damaged."
        ) from error


def _record_at(steps: np.ndarray, step: int) -> int:
    """The index of the first record at or after ``step`` (the last record if none is)."""
    return min(int(np.searchsorted(steps, step)), len(steps) - 1)


def _figure(figure: Any, alt: str, caption: str) -> dict[str, str]:
    return {"png": base64.b64encode(to_png(figure)).decode("ascii"), "alt": alt, "caption": caption}


def _table_at(archive: MonitorArchive, record: int) -> HeadTable:
    columns = {
        name: archive.stats[record, index].astype(np.float64) for index, name in enumerate(archive.statistics)
    }
    return HeadTable(columns=columns, defined_segments={}, segments=len(archive.lengths))


def _examples(archive: MonitorArchive) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The page's probe examples (tokens and all steps' attention, 8-bit packed) and the head change."""
    examples, first, last = [], [], []
    probe = archive.probe
    for index, tokens in enumerate(probe.tokens):
        attention = archive.attention(index)  # [T, L, H, n, n]
        first.append(attention[0])
        last.append(attention[-1])
        text = probe.texts[index] + ("" if probe.texts_b is None else f" ‖ {probe.texts_b[index]}")
        label = "" if probe.labels is None else f"label {probe.labels[index]} · "
        caption = label + (text if len(text) <= CAPTION_CHARS else text[: CAPTION_CHARS - 1] + "…")
        examples.append(
            {
                "tokens": tokens,
                "segments": probe.segments[index],
                "pair": probe.texts_b is not None,
                "n": len(tokens),
                "caption": caption,
                "text": label + text,
                "attention": pack_attention(attention),
            }
        )
    return examples, head_change(first, last)


def _ranked_table(archive: MonitorArchive, change: np.ndarray) -> dict[str, Any]:
    before, after = _table_at(archive, 0), _table_at(archive, len(archive) - 1)
    order = np.argsort(-change, axis=None, kind="stable")
    columns = ["rank", "layer", "head", "change (nats)"]
    columns += [title_of(name) for name in CURVE_STATISTICS]
    rows = []
    for rank, flat in enumerate(order, start=1):
        layer, head = divmod(int(flat), archive.heads)
        cells: list[str | int] = [rank, layer, head, f"{change[layer, head]:.4f}"]
        cells += [
            f"{before[name][layer, head]:.3f} → {after[name][layer, head]:.3f}" for name in CURVE_STATISTICS
        ]
        rows.append(cells)
    caption = (
        "Every head, most changed first. Change: mean Jensen-Shannon divergence (nats, at most ln 2 ≈ 0.693) "
        "between a query token's attention at the first and the last record, over all tokens of the probe "
        "examples; each statistic as before → after (at the first record → at the last). Layers and heads "
        "are 0-based."
    )
    return {"caption": caption, "columns": columns, "rows": rows}


def _facts(archive: MonitorArchive, run: dict[str, Any]) -> list[list[str]]:
    facts = [["model", archive.model]]
    if run:
        facts += [["task", str(run.get("task", ""))], ["status", run_status(run)]]
        accuracy = run.get("dev_accuracy")
        if isinstance(accuracy, int | float):
            value = f"{accuracy:.4f}" if np.isfinite(accuracy) else "undefined (the logits are not finite)"
            facts.append(["final dev accuracy", f"{value} on {run.get('dev_examples')} examples"])
        if isinstance(run.get("seconds"), int | float):
            facts.append(["optimizer steps", f"{run.get('steps')} in {run['seconds']:.0f} s"])
        stopped = run.get("stopped_by")
        if isinstance(stopped, dict):
            facts.append(["stopped by", f"{stopped.get('rule')} at step {stopped.get('step')}"])
    steps = ", ".join(str(step) for step in archive.steps)
    facts += [
        ["probe examples", str(len(archive.lengths))],
        ["records", f"{len(archive)} (steps {steps})"],
        ["layers × heads", f"{archive.layers} × {archive.heads}"],
    ]
    return facts


def _sections(
    archive: MonitorArchive, change: np.ndarray, metrics: pd.DataFrame | None, alerts: list[Alert]
) -> list[dict[str, Any]]:
    sections = []
    if metrics is not None:
        marked = [(alert.step, alert.rule) for alert in alerts]
        figure = plots.training_curves(metrics, marked, archive.losses)
        caption = ""
        if alerts:
            key = "; ".join(
                f"{number}: step {step}, {', '.join(rules)}"
                for number, (step, rules) in enumerate(plots.alert_steps(marked), start=1)
            )
            caption = f"Dashed: the training rules' alerts ({key})."
        sections.append(
            {
                "id": "training",
                "title": "Training",
                "figures": [_figure(figure, "loss and accuracy", caption)],
            }
        )
    marks = [
        (_record_at(archive.steps, alert.step), layer, head)
        for alert in alerts
        for layer, head in alert.heads
    ]
    alerted = sorted({head for alert in alerts for head in alert.heads})
    names = [name for name in CURVE_STATISTICS if name in archive.statistics]
    ringed = " Rings: heads a training rule named, at its alert." if marks else ""
    curves = [
        _figure(
            plots.statistic_curves(archive.steps, archive.statistic(name), name, marks=marks),
            f"{title_of(name)} over training",
            f"Mean over the probe examples at each record ({unit_of(name)}).{ringed}",
        )
        for name in names
    ]
    sections.append({"id": "statistics", "title": "Head statistics over training", "figures": curves})
    flat_top = np.argsort(-change, axis=None, kind="stable")[: min(TOP_HEADS, change.size)]
    top = [divmod(int(flat), archive.heads) for flat in flat_top]
    before, after = _table_at(archive, 0), _table_at(archive, len(archive) - 1)
    first, last = int(archive.steps[0]), int(archive.steps[-1])
    comparison = [
        _figure(
            plots.change_heatmap(change, top, alerted),
            "attention change per head",
            f"Mean JS divergence between the attention at step {first} and at step {last}; "
            f"the {len(top)} most changed heads are outlined"
            + ("; heads a training rule named are crossed." if alerted else "."),
        ),
        _figure(
            plots.statistic_deltas(before, after, names),
            "statistics after minus before",
            f"Each statistic at step {last} minus at step {first}.",
        ),
    ]
    sections.append(
        {
            "id": "change",
            "title": f"Before (step {first}) and after (step {last})",
            "figures": comparison,
            "table": _ranked_table(archive, change),
        }
    )
    return sections


def watch_data(run_dir: str | Path | OpenFolder) -> dict[str, Any]:
    """The watch page's data (the ``"watch"`` contract of ``views/static/views/contract.js``).

    run_dir: a training run folder (``run.json``, ``metrics.jsonl``, ``monitor.zarr``) or an archive, as
    a path or opened (every file is then read below it without following links,
    :mod:`bertology.files.beneath`). Only complete records are used, so a run still training (or killed) can
    be watched.

    Raises:
        BertologyError: no archive, or an archive without records yet.
        LinkRefused: a file the page reads is a symbolic link.
    """
    folder = open_run(run_dir)
    archive = read_archive(folder)
    if len(archive) == 0:
        raise BertologyError(f"The attention monitor in {folder.label} has no complete record yet.")
    run = _run_info(folder)
    alerts = _alerts(run, folder.name_of(TRAINING_FILE))
    examples, change = _examples(archive)
    task = run.get("task")
    return {
        "view": "watch",
        "title": f"Training {archive.model}" + (f" on {task}" if task else ""),
        "model": archive.model,
        "layers": archive.layers,
        "heads": archive.heads,
        "layer": 0,
        "theme": "light",
        "steps": archive.steps.tolist(),
        "examples": examples,
        "facts": _facts(archive, run),
        "alerts": [alert.to_json() | {"record": _record_at(archive.steps, alert.step)} for alert in alerts],
        "sections": _sections(archive, change, _metrics(folder), alerts),
    }


def watch_html(run_dir: str | Path | OpenFolder) -> str:
    """The whole watch page of ``run_dir`` (see :func:`watch_data`) as HTML text."""
    data = watch_data(run_dir)
    return render_page(data, f"Watch · {data['title']}")


def write_watch(run_dir: str | Path, output: str | Path) -> Path:
    """Write :func:`watch_html` of ``run_dir`` to ``output``; returns the path."""
    return write_text(output, watch_html(run_dir))
