"""``bertology attribute``: the page with the attribution tree and the JSON beside it, and clear errors (a
BertologyError, which the entry point prints as one line)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError


def test_attribute_writes_the_tree_page_and_json(classifier_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "attribution.html"
    arguments = [
        "attribute",
        str(classifier_run),
        "A <b>gripping</b> film.",
        "-o",
        str(output),
        "--steps",
        "2",
    ]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "Wrote" in result.output and "the tree has" in result.output
    content = json.loads(output.with_suffix(".json").read_text())
    tokens, tree = content["tokens"], content["tree"]
    assert content["steps"] == 2 and content["rule"] == "riemann" and content["label"] in ("0", "1")
    assert len(content["head_scores"]) == 6 and len(content["head_scores"][0]) == 12
    assert len(content["layer_attribution"]) == 6 and len(content["layer_attribution"][0]) == len(tokens)
    assert 0 < tree["root"] < len(tokens) and tree["edges"]
    page = output.read_text()
    assert "<svg" in page and "bt-attribution-tree" in page and "Completeness" in page
    assert "<b>" not in page and "&lt;b&gt;" in page  # token text is escaped
    assert len(page.split("<line ")) - 1 == len(tree["edges"])  # one drawn edge per edge of the tree

    again = CliRunner().invoke(app, [*arguments, "--rule", "gauss-legendre", "--label", "1"])
    assert again.exit_code == 0, again.output
    assert json.loads(output.with_suffix(".json").read_text())["label"] == "1"


def test_attribute_errors_are_sentences(classifier_run: Path, tmp_path: Path) -> None:
    output = tmp_path / "attribution.html"
    result = CliRunner().invoke(
        app, ["attribute", str(classifier_run), "A film.", "-o", str(output), "--label", "x"]
    )
    assert isinstance(result.exception, BertologyError) and "has no label 'x'" in str(result.exception)
    result = CliRunner().invoke(app, ["attribute", str(classifier_run), "A film.", "--rule", "simpson"])
    assert result.exit_code == 2 and "simpson" in result.output
    output.with_suffix(".json").write_text("[1, 2]")  # not a file bertology wrote
    result = CliRunner().invoke(app, ["attribute", str(classifier_run), "A film.", "-o", str(output)])
    assert isinstance(result.exception, BertologyError) and "not a file bertology wrote" in str(
        result.exception
    )
