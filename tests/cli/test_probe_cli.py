"""`bertology probe deps`: files written from a real treebank, the arc diagram, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from support.cli import run_command

from bertology.models.loading import LoadedModel
from bertology.probes.gap import BASELINES
from bertology.report.arcs import arc_diagram


@pytest.mark.slow
def test_probe_deps_writes_table_accuracies_and_report(
    tmp_path: Path, ewt_dev: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_command(["probe", "deps", str(ewt_dev), "--limit", "40", "-o", str(tmp_path)], capsys)
    assert result.returncode == 0, result.stderr
    assert "Probed 40 sentences" in result.stdout
    table = pd.read_csv(tmp_path / "table.csv")
    assert table.loc[0, "relation"] == "all"
    assert table["accuracy"].between(0, 1).all() and table["baseline_offset"].abs().between(1, 5).all()
    accuracies = pd.read_csv(tmp_path / "accuracies.csv")
    assert len(accuracies) == len(table) * 2 * 6 * 12  # every relation, direction, layer and head
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.count("<svg") >= 3 and "data:image/png;base64," in page
    assert (tmp_path / "plots" / "relation_heatmaps.png").read_bytes().startswith(b"\x89PNG")


def test_probe_deps_broken_line_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    treebank = tmp_path / "broken.conllu"
    treebank.write_text("1\tHello\thello\tINTJ\tUH\t_\t0\troot\t_\t_\n2\tthere\n\n", encoding="utf-8")
    result = run_command(["probe", "deps", str(treebank), "-o", str(tmp_path / "out")], capsys)
    assert result.returncode == 1
    assert "broken.conllu line 2" in result.stderr and "Traceback" not in result.stderr


def test_arc_diagram_draws_gold_and_predicted_arcs_and_escapes_words() -> None:
    words = ["<b>The</b>", "cat", "sat", "."]
    gold = [1, 2, -1, 2]
    predicted = [1, 0, -1, 1]  # "The" right; "cat" and "." wrong
    svg = str(arc_diagram(words, gold, predicted, caption="<i>x</i>"))
    assert "&lt;b&gt;The&lt;/b&gt;" in svg and "<b>" not in svg and "&lt;i&gt;x&lt;/i&gt;" in svg
    assert svg.count('stroke="#555555"') == 3  # a gold arc per non-root word
    assert svg.count('stroke="#1a7f37"') == 1 and svg.count('stroke="#cf222e"') == 2
    skipped = str(arc_diagram(words, gold, predicted, skip=[False, False, False, True]))
    assert skipped.count('stroke="#555555"') == 2


@pytest.mark.slow
def test_probe_parser_trains_scores_and_writes_files(
    tmp_path: Path, ewt_dev: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_command(
        [
        "probe", "parser", "--train", str(ewt_dev), "--eval", str(ewt_dev.with_name("en_ewt-ud-test.conllu")),
        "--limit-train", "120", "--limit-eval", "60", "-o", str(tmp_path),
        ],
        capsys,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    scores = pd.read_csv(tmp_path / "uas.csv")
    assert scores["predictor"].tolist()[:2] == ["parser (argmax)", "right-branching"]
    assert scores["uas"].between(0, 1).all()
    assert scores.loc[0, "uas"] > scores.loc[1, "uas"], "the parser beats right-branching on real data"
    assert len(pd.read_csv(tmp_path / "parser_weights.csv")) == 6 * 12
    assert (tmp_path / "report.html").read_text(encoding="utf-8").count("data:image/png;base64,") == 2


@pytest.mark.slow
def test_probe_coref_writes_table_with_baselines(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gum = shared_data / "gum_v5.1_sd"
    result = run_command(
        [
        "probe", "coref", str(gum / "coref_conll"), "--treebank", str(gum / "dep_stanford"),
        "--limit", "1", "-o", str(tmp_path),
        ],
        capsys,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "table.csv")
    assert table["type"].tolist() == ["pronoun", "proper", "other", "all"]
    for column in ("accuracy", "nearest", "same_head", "sieve"):
        assert table[column].dropna().between(0, 1).all()
    assert table.loc[3, "count"] == table.loc[:2, "count"].sum()
    assert "Best head" in result.stdout and (tmp_path / "plots" / "heads.png").is_file()


@pytest.mark.slow
def test_probe_gap_reports_the_best_head(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gap_dev = shared_data / "gap" / "gap-development.tsv"
    result = run_command(["probe", "gap", str(gap_dev), "--limit", "30", "-o", str(tmp_path)], capsys)
    assert result.returncode == 0, result.stderr
    assert "Best head" in result.stdout and "bias F/M" in result.stdout
    table = pd.read_csv(tmp_path / "table.csv")
    assert table["system"].tolist()[1:] == list(BASELINES)
    assert {"overall_f1", "masculine_f1", "feminine_f1", "bias_f_m"} <= set(table.columns)
    assert len(pd.read_csv(tmp_path / "heads.csv")) == 6 * 12
    assert (tmp_path / "plots" / "gender_split.png").is_file()
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "GAP scorecard" in page and page.count("data:image/png;base64,") == 2


def test_unknown_decode_is_refused_before_any_treebank_is_read(default_model: LoadedModel) -> None:
    from bertology.errors import BertologyError
    from bertology.probes.run import probe_parser

    # The treebanks do not exist: reaching them would raise "Could not open" instead.
    with pytest.raises(BertologyError, match="Unknown decode 'foo'"):
        probe_parser("/no/train.conllu", "/no/eval.conllu", default_model, decode="foo")  # type: ignore[arg-type]
