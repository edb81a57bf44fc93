"""The probes' one result type: each verb on a little real data gives the same interface (the grid of
scores, its best head, the files it saves, the report)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bertology.files.run_files import gap_predictions_file
from bertology.models.loading import LoadedModel
from bertology.probes import (
    BestHead,
    ProbeResult,
    probe_coreference,
    probe_dependencies,
    probe_gap,
    probe_parser,
)
from bertology.report.probes import write_probe_report

Verb = Callable[[Path, LoadedModel], ProbeResult]

#: Per kind: the verb on a little of the shared data, a key besides the default one, and the files promised.
RUNS: dict[str, tuple[Verb, str, list[str]]] = {
    "dependency": (
        lambda data, model: probe_dependencies(data / "ud_ewt" / "en_ewt-ud-dev.conllu", model, limit=20),
        "nsubj",
        ["table.csv", "accuracies.csv"],
    ),
    "parser": (
        lambda data, model: probe_parser(
            data / "ud_ewt" / "en_ewt-ud-dev.conllu",
            data / "ud_ewt" / "en_ewt-ud-test.conllu",
            model,
            limit_train=30,
            limit_eval=10,
        ),
        "w",
        ["uas.csv", "parser_weights.csv", "parser.json"],
    ),
    "coreference": (
        lambda data, model: probe_coreference(
            data / "gum_v5.1_sd" / "coref_conll",
            model,
            treebank=data / "gum_v5.1_sd" / "dep_stanford",
            limit=1,
        ),
        "pronoun",
        ["table.csv", "accuracies.csv", "antecedents.csv"],
    ),
    "gap": (
        lambda data, model: probe_gap(data / "gap" / "gap-development.tsv", model, limit=12, syntax=False),
        "feminine",
        ["table.csv", "heads.csv", "gap.json"],
    ),
}


def argmax_head(grid: np.ndarray) -> tuple[int, int]:
    """The first highest non-NaN cell of a [layers, heads] grid, found by a plain scan."""
    best, where = -np.inf, (0, 0)
    for layer, head in np.ndindex(grid.shape):
        if not np.isnan(grid[layer, head]) and grid[layer, head] > best:
            best, where = grid[layer, head], (layer, head)
    return where


@pytest.mark.parametrize("kind", list(RUNS))
def test_every_probe_gives_one_result_shape(
    kind: str, shared_data: Path, default_model: LoadedModel, tmp_path: Path
) -> None:
    verb, key, files = RUNS[kind]
    result = verb(shared_data, default_model)
    assert isinstance(result, ProbeResult) and result.kind == kind
    shape = (default_model.num_layers, default_model.num_heads)
    for asked in (None, key):
        grid = result.grid(asked)
        assert grid.shape == shape and grid.dtype == np.float64
        best = result.best(asked)
        assert isinstance(best, BestHead)
        assert (best.layer, best.head) == argmax_head(grid) and best.score == grid[best.layer, best.head]
        assert best.label == f"{best.layer}-{best.head}"
    frame = result.to_frame()
    assert {"layer", "head"} <= set(frame.columns) and frame["layer"].max() == shape[0] - 1
    summary = result.summary()
    assert summary["model"] == default_model.name and isinstance(summary["seconds"], float)

    saved = tmp_path / "saved"
    written = result.save(saved)
    assert [path.relative_to(saved).as_posix() for path in written] == result.files
    answers = [gap_predictions_file(system) for system in result.table()["system"]] if kind == "gap" else []
    assert result.files == [*files, *answers]  # a GAP probe's answers per system, as GAP's scorer reads them
    assert sorted(path.relative_to(saved).as_posix() for path in saved.rglob("*.*")) == sorted(result.files)

    report = write_probe_report(result, tmp_path / "report", dpi=40)
    assert report == tmp_path / "report" / "report.html"
    assert {*files, "report.html"} <= {path.name for path in (tmp_path / "report").iterdir()}
    text = report.read_text(encoding="utf-8")
    assert f"{result.title}: {default_model.name}" in text and "data:image/png;base64," in text
