"""What a newcomer reads first: the help names every probe and how to install Ray, a repeated fine-tuning
names the option that replaces the run, and comparing an encoder with a decoder needs no text pair."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli import run_in_process
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.training.run_folder import check_run_dir


def shown(arguments: list[str]) -> str:
    """The help text as words, without rich's box drawing and line wrapping."""
    output = CliRunner().invoke(app, arguments).output
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


def test_the_probe_help_names_all_four_probes_and_the_ray_help_its_install() -> None:
    summary = shown(["probe", "--help"]).split("Options")[0]
    assert all(f"({name})" in summary for name in ("deps", "parser", "coref", "gap")), summary
    assert "(pip install 'bertology[ray]')" in shown(["analyze", "--help"])


def test_a_run_folder_in_use_names_the_option_that_replaces_it(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"model": "default"}), encoding="utf-8")
    with pytest.raises(
        BertologyError, match=r"already holds a training run; .* --overwrite \(overwrite=True"
    ):
        check_run_dir(tmp_path, overwrite=False)


def test_comparing_an_encoder_with_a_decoder_draws_single_texts(
    tiny_model_dirs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The corpus's first segment is read as the comparison reads it: one text, not a pair the decoder
    would refuse ("has no template for a pair of texts")."""
    corpus = tmp_path / "two_paragraphs.txt"  # for an encoder alone: one segment, a pair of the two
    corpus.write_text("The cat sat on the mat.\nIt was happy there.\n", encoding="utf-8")
    output = tmp_path / "out"
    arguments = ["compare", "default", str(tiny_model_dirs["llama"]), "--corpus", str(corpus)]
    code, stderr = run_in_process([*arguments, "--max-len", "48", "-o", str(output)], capsys)
    assert code == 0, stderr
    assert "template for a pair" not in stderr and (output / "views.html").is_file()
    report = (output / "report.html").read_text(encoding="utf-8")  # two models, not one model's changes
    assert "<h2>Heads that differ most between the two models</h2>" in report
    assert "Most changed heads" not in report and "different architectures (bert and llama)" in report


def test_the_models_table_is_one_line_per_type_in_80_columns() -> None:
    from bertology.models.model_types import FEATURES, MODEL_TYPES, features

    lines = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"}).stdout.splitlines()
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in MODEL_TYPES}
    assert set(rows) == set(MODEL_TYPES)
    assert all(len(line) <= 80 and "…" not in line for line in lines[: lines.index(rows["bert"]) + len(rows)])
    assert rows["bert"].split()[-len(FEATURES) :] == ["✓"] * len(FEATURES)
    decoder = next(name for name, entry in MODEL_TYPES.items() if entry.kind == "decoder")
    marks = ["✓" if present else "·" for present in features(decoder).values()]
    assert rows[decoder].split()[-len(FEATURES) :] == marks
    assert (
        "Features (V: views, N: neuron view, A: analysis, P: probes, I: interventions, W: norm weights)"
        in (" ".join(lines))
    )
