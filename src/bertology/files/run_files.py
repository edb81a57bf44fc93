"""The output folders' shared file names and the kind of run each folder holds, in one place.

Every writer of a run folder (an analysis, a comparison, a probe, an ablation, a patching study, the
decoder head scores of ``bertology heads``, the composition scores of ``bertology composition``, a
circuit of ``bertology circuit``) marks it
with :data:`KIND_FILE`, ``bertology-run.json``: ``{"written_by": "bertology", "kind": KIND, "model":
NAME, ...}`` with the model it ran (a comparison's two, ``"A vs B"``) and the details of its kind (a
probe's ``probe``: ``"dependency"``, ``"parser"``, ``"coreference"`` or ``"gap"``).
A training run is the folder with :data:`TRAINING_FILE`, the record fine-tuning keeps as it trains. The
web app reads a folder's kind from these files (:func:`read_kind`), never from which other files happen to
be there: a GAP probe's ``heads.csv`` does not make it an analysis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, get_args

RunKind = Literal[
    "analysis", "comparison", "probe", "ablation", "patching", "heads", "composition", "circuit", "training"
]
#: Every kind of :data:`RunKind`.
RUN_KINDS: tuple[RunKind, ...] = get_args(RunKind)

#: The key of the mark that says bertology wrote it, and its value.
WRITTEN_BY, WRITER = "written_by", "bertology"
#: The mark of a run folder (module docstring).
KIND_FILE = "bertology-run.json"
#: A training run's own record (``bertology.training.loop``).
TRAINING_FILE = "run.json"
#: The HTML report of every run but a training run.
REPORT_FILE = "report.html"
#: An analysis's table of heads, its heads' mean JS divergences and its summary.
HEADS_FILE = "heads.csv"
JS_DIVERGENCE_FILE = "head_js_divergence.csv"
SUMMARY_FILE = "summary.json"
#: A decoder's analysis: each head's detector scores on repeated random tokens
#: (:mod:`bertology.analysis.head_detectors`), a row per head.
DETECTORS_FILE = "head_detectors.csv"
#: The page ``bertology attribute`` writes when no ``-o`` is given (its JSON beside it, ``.json``), and an
#: ablation folder's per-head self-attention attribution scores.
ATTRIBUTION_FILE = "attribution.html"
ATTRIBUTION_IMPORTANCE_FILE = "attribution_importance.csv"
#: The pages ``bertology explain`` and ``bertology attack`` write when no ``-o`` is given; each writes its
#: JSON beside its page (the same name, ``.json``).
EXPLANATION_FILE = "explanation.html"
ATTACK_FILE = "attack.html"
#: A circuit run's edges (``upstream``, ``downstream``, ``score``; MIB's node names), its faithfulness at
#: each size (``method``, ``percent_edges``, ``edges``, ``faithfulness``), its graph in MIB's format, its
#: curves and its page (which a circuit run has instead of :data:`REPORT_FILE`).
EDGES_FILE = "edges.csv"
FAITHFULNESS_FILE = "faithfulness.csv"
GRAPH_FILE = "graph.json"
CURVES_FILE = "curves.png"
CIRCUIT_PAGE_FILE = "circuit.html"
#: A GAP probe's folder of per-example answers, a file per system of its table (:func:`gap_predictions_file`).
GAP_PREDICTIONS_FOLDER = "predictions"
#: A coreference probe's per-mention choices of the best head and the baselines.
ANTECEDENTS_FILE = "antecedents.csv"


def gap_predictions_file(system: str) -> str:
    """The path, in a GAP probe's folder, of one system's answers as GAP's scorer reads system output
    (``predictions/head_5-3.tsv`` for the system ``"head 5-3"``, ``predictions/always_a.tsv``)."""
    return f"{GAP_PREDICTIONS_FOLDER}/{system.replace(' ', '_')}.tsv"


def page_file(kind: str) -> str:
    """The page a run of ``kind`` opens on: a circuit's :data:`CIRCUIT_PAGE_FILE`, any other's
    :data:`REPORT_FILE` (a training run has neither; the web app builds its page)."""
    return CIRCUIT_PAGE_FILE if kind == "circuit" else REPORT_FILE


def mark_run(folder: str | Path, kind: RunKind, *, model: str, **details: str) -> Path:
    """Write :data:`KIND_FILE` into ``folder``: it holds a run of ``kind`` on ``model`` (with ``details``)."""
    if kind not in RUN_KINDS:
        raise ValueError(f"unknown run kind {kind!r}")
    target = Path(folder) / KIND_FILE
    mark = {WRITTEN_BY: WRITER, "kind": kind, "model": model, **details}
    target.write_text(json.dumps(mark), encoding="utf-8")
    return target


def _json_object(content: bytes | None) -> dict[str, Any] | None:
    """``content`` as a JSON object, ``None`` if it is not one (or ``None``)."""
    if content is None:
        return None
    try:
        loaded = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def read_model(record: bytes | None) -> str | None:
    """The model a run used, from the content of its :data:`KIND_FILE` or :data:`TRAINING_FILE` (both keep
    it as ``"model"``); ``None`` where neither says."""
    model = (_json_object(record) or {}).get("model")
    return model if isinstance(model, str) else None


def read_kind(mark: bytes | None, *, training: bool = False) -> dict[str, Any] | None:
    """The mark of a folder (``{"kind": ..., ...}``) from the content of its :data:`KIND_FILE` (``None``
    when it has none), or ``{"kind": "training"}`` for a folder with :data:`TRAINING_FILE`
    (``training``); ``None`` for a folder that holds no run or a mark bertology did not write."""
    if training:
        return {"kind": "training"}
    content = _json_object(mark)
    ours = content is not None and content.get(WRITTEN_BY) == WRITER
    return content if ours and content.get("kind") in RUN_KINDS else None
