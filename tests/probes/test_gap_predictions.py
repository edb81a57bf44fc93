"""``probe gap`` writes every system's answers as GAP's own scorer reads system output, and that scorer
(``gap_scorer.py`` of google-research-datasets/gap-coreference, re-implemented below from its published
definition) scores them to the F1s of the probe's ``table.csv``."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.files.run_files import gap_predictions_file
from bertology.probes.gap import GapAccumulator, GapWords
from bertology.probes.gap_scorer import FEMININE, MASCULINE

# --- GAP's scorer: its reading of the files and its counting, as published -------------------------

GOLD_FIELDNAMES = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset"]
GOLD_FIELDNAMES += ["B-coref", "URL"]
SYSTEM_FIELDNAMES = ["ID", "A-coref", "B-coref"]
GENDER_OF = {"she": "feminine", "her": "feminine", "hers": "feminine", "he": "masculine"}
GENDER_OF |= {"his": "masculine", "him": "masculine"}


def read_annotations(path: Path, is_gold: bool) -> dict[str, dict[str, object]]:
    """ID -> {gender, a, b}: the gold file's header line is skipped, a system file's every line is read;
    a label is True for "true", False for "false" (any case), None otherwise; a repeated ID is ignored."""

    def is_true(value: str) -> bool | None:
        return {"true": True, "false": False}.get(value.lower())

    annotations: dict[str, dict[str, object]] = {}
    with path.open(encoding="utf-8", newline="") as file:
        reader = csv.DictReader(
            file, fieldnames=GOLD_FIELDNAMES if is_gold else SYSTEM_FIELDNAMES, delimiter="\t"
        )
        if is_gold:
            next(reader, None)
        for row in reader:
            if row["ID"] in annotations:
                continue
            annotation: dict[str, object] = {"a": is_true(row["A-coref"]), "b": is_true(row["B-coref"])}
            if is_gold:
                annotation["gender"] = GENDER_OF[row["Pronoun"].lower()]
            annotations[row["ID"]] = annotation
    return annotations


def official_scorecard(gold_path: Path, system_path: Path) -> dict[str, dict[str, float]]:
    """Per "overall", "masculine", "feminine": recall, precision and F1 in percent, as the scorer prints
    them; and "bias" (F1 feminine / masculine, NaN where the scorer prints "-")."""
    gold, system = read_annotations(gold_path, True), read_annotations(system_path, False)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("tp", "fp", "fn", "tn"), 0))
    for example_id, truth in gold.items():
        answer = system.get(example_id, {"a": None, "b": None})
        for gender in ("overall", str(truth["gender"])):
            for name in ("a", "b"):
                said, right = answer[name], truth[name]
                if said is None:
                    counts[gender]["fn"] += 1
                elif right and said:
                    counts[gender]["tp"] += 1
                elif said:
                    counts[gender]["fp"] += 1
                elif not right:
                    counts[gender]["tn"] += 1
                else:
                    counts[gender]["fn"] += 1
    card: dict[str, dict[str, float]] = {}
    for gender in ("overall", "masculine", "feminine"):
        c = counts[gender]
        recall = 100.0 * c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 0.0
        precision = 100.0 * c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        card[gender] = {"recall": recall, "precision": precision, "f1": f1}
    masculine, feminine = card["masculine"]["f1"], card["feminine"]["f1"]
    card["bias"] = {"f_m": feminine / masculine if masculine and feminine else float("nan")}
    return card


# --- The files --------------------------------------------------------------------------------------


def test_constructed_answers_are_written_as_the_scorer_reads_them() -> None:
    """Three examples, one head [1, 1]: it picks A, then B; the third was cut to fit (no answer)."""
    accumulator = GapAccumulator(["always_b", "neither"])
    for number, (gender, answer) in enumerate([(MASCULINE, "A"), (FEMININE, "B"), (FEMININE, None)]):
        words = GapWords(["A", "B", "she"], 2, [0], [1], (True, False), gender, f"test-{number + 1}")
        row = None if answer is None else np.array([[[0.6, 0.1, 0.3] if answer == "A" else [0.1, 0.6, 0.3]]])
        accumulator.update(words, row, [(False, True), (False, False)])
    probe = accumulator.result()
    head = probe.predictions("head 0-0")
    assert head.to_dict("list") == {
        "ID": ["test-1", "test-2"],
        "A-coref": ["TRUE", "FALSE"],
        "B-coref": ["FALSE", "TRUE"],
    }
    always_b = probe.predictions("always_b")
    assert always_b["ID"].tolist() == ["test-1", "test-2", "test-3"]
    assert set(always_b["A-coref"]) == {"FALSE"} and set(always_b["B-coref"]) == {"TRUE"}
    with pytest.raises(BertologyError, match="has no system 'head 1-1'; it has: head 0-0, always_b, neither"):
        probe.predictions("head 1-1")


@pytest.mark.slow
def test_official_scorer_gives_the_table_on_real_gap(shared_data: Path, tmp_path: Path) -> None:
    examples = 60
    source = shared_data / "gap" / "gap-development.tsv"
    output = tmp_path / "gap"
    result = CliRunner().invoke(
        app, ["probe", "gap", str(source), "--limit", str(examples), "-o", str(output)]
    )
    assert result.exit_code == 0, result.stderr or result.exception
    # the gold file holds the examples probed: the header and the first ones
    gold = tmp_path / "gold.tsv"
    gold.write_text("".join(source.read_text(encoding="utf-8").splitlines(keepends=True)[: examples + 1]))
    table = pd.read_csv(output / "table.csv")
    assert table["system"].iloc[0].startswith("head ") and len(table) >= 6
    for row in table.itertuples():
        path = output / gap_predictions_file(row.system)
        lines = path.read_text(encoding="utf-8").splitlines()
        assert all(len(line.split("\t")) == 3 for line in lines) and not lines[0].startswith("ID")
        card = official_scorecard(gold, path)
        for gender in ("overall", "masculine", "feminine"):  # the same counts' ratios in float64: 1e-12
            assert card[gender]["f1"] / 100 == pytest.approx(getattr(row, f"{gender}_f1"), abs=1e-12)
            assert card[gender]["precision"] / 100 == pytest.approx(getattr(row, f"{gender}_p"), abs=1e-12)
            assert card[gender]["recall"] / 100 == pytest.approx(getattr(row, f"{gender}_r"), abs=1e-12)
        assert card["bias"]["f_m"] == pytest.approx(row.bias_f_m, nan_ok=True)
    # every baseline answers every example; "both" says TRUE twice
    both = pd.read_csv(output / gap_predictions_file("both"), sep="\t", header=None, dtype=str)
    assert len(both) == examples and (both[[1, 2]] == "TRUE").all().all()
    assert "predictions/" in (output / "report.html").read_text(encoding="utf-8")
