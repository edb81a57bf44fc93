"""Output folders keep the user's files: the commands that write a folder (`analyze`, `compare`, `probe ...`,
`ablate`, all through :func:`bertology.outputs.output_folder`) move their files in one by one, so a user's
own files in the subfolders the tool writes (`plots/`, `examples/`, `pruned/`) stay; and no file beside an
output file (`relevance -o X.html` writes `X.json`) is replaced unless the tool wrote it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.outputs import output_folder

USER_FILES = {
    "mine.txt": "the user's notes",
    "plots/mine.png": "the user's plot",
    "examples/mine.html": "the user's page",
    "examples/deeper/mine.csv": "the user's table",
    "pruned/mine.json": "the user's model notes",
}


def _plant(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")


def _contents(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (hidden staging folders would show too) and its text (bytes that are not
    UTF-8 replaced)."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes().decode("utf-8", errors="replace")
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_output_folder_replaces_its_own_files_and_keeps_every_other_one(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _plant(target, USER_FILES | {"report.html": "old", "plots/a.png": "old plot"})
    written = {
        "report.html": "new",
        "plots/a.png": "new plot",
        "plots/b.png": "another plot",
        "examples/head.html": "a page",
        "examples/deeper/head.csv": "a table",
        "pruned/model.safetensors": "weights",
        "fresh/x.txt": "a new folder",
    }
    with output_folder(target) as folder:
        _plant(folder, written)
    assert _contents(target) == USER_FILES | written


def test_output_folder_refuses_a_kind_conflict_below_before_moving_anything(tmp_path: Path) -> None:
    target = tmp_path / "out"
    _plant(target, USER_FILES | {"examples/head.html/inside.txt": "a folder where a page goes"})
    before = _contents(target)
    with (
        pytest.raises(BertologyError, match=r"examples/head\.html is a folder where bertology writes a file"),
        output_folder(target) as folder,
    ):
        _plant(folder, {"report.html": "new", "plots/a.png": "plot", "examples/head.html": "page"})
    assert _contents(target) == before  # report.html and plots/a.png were not moved either
    (tmp_path / "elsewhere").mkdir()
    (target / "linked").symlink_to(tmp_path / "elsewhere")
    with (
        pytest.raises(BertologyError, match=r"linked is a link where bertology writes a folder"),
        output_folder(target) as folder,
    ):
        _plant(folder, {"linked/a.png": "plot"})
    assert not list((tmp_path / "elsewhere").iterdir())


def test_analyze_keeps_the_users_files_in_plots_and_examples(
    tmp_path: Path, sample_corpus_head: Callable[[int], Path]
) -> None:
    output = tmp_path / "analysis"
    _plant(output, USER_FILES)
    result = CliRunner().invoke(
        app, ["analyze", str(sample_corpus_head(6)), "--limit", "6", "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert _contents(output).items() >= USER_FILES.items()
    written = set(_contents(output)) - set(USER_FILES)
    assert any(name.startswith("examples/") and name.endswith(".html") for name in written)
    assert any(name.startswith("plots/") and name.endswith(".png") for name in written)


def test_probe_deps_keeps_the_users_files_in_plots(tmp_path: Path, ewt_dev: Path) -> None:
    _plant(tmp_path, USER_FILES)
    result = CliRunner().invoke(app, ["probe", "deps", str(ewt_dev), "--limit", "20", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert _contents(tmp_path).items() >= USER_FILES.items()
    assert (tmp_path / "plots" / "relation_heatmaps.png").is_file()


def test_relevance_refuses_to_replace_a_foreign_json_beside_its_page(tmp_path: Path) -> None:
    page = tmp_path / "rollout.html"
    (tmp_path / "rollout.json").write_text('{"mine": true}', encoding="utf-8")
    args = ["relevance", "The cat sat.", "--method", "rollout", "-o", str(page)]
    refused = CliRunner().invoke(app, args)
    assert isinstance(refused.exception, BertologyError)
    assert str(refused.exception) == (
        f"{tmp_path / 'rollout.json'} exists and is not a file bertology wrote; move it away or choose "
        "another output file (nothing was written)."
    )
    assert (tmp_path / "rollout.json").read_text(encoding="utf-8") == '{"mine": true}'
    assert not page.exists()
    (tmp_path / "rollout.json").unlink()
    assert CliRunner().invoke(app, args).exit_code == 0
    first = json.loads((tmp_path / "rollout.json").read_text(encoding="utf-8"))
    again = CliRunner().invoke(app, [*args[:1], "A dog ran.", *args[2:]])  # its own earlier JSON: replaced
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "rollout.json").read_text(encoding="utf-8"))["tokens"] != first["tokens"]


@pytest.mark.parametrize(
    ("beside", "replaced"),
    [
        ({"text": "t", "tokens": [], "label": "x", "attributions": {}, "more": 1}, True),  # its own
        ({"text": "t", "tokens": []}, False),  # another JSON object
        ([1, 2], False),
        ("not json", False),
    ],
)
def test_explain_replaces_only_its_own_json_beside_its_page(
    beside: object, replaced: bool, tmp_path: Path
) -> None:
    from bertology.interventions.saliency import JSON_MARKS
    from bertology.outputs import check_output_file

    page = tmp_path / "why.html"
    text = beside if isinstance(beside, str) else json.dumps(beside)
    page.with_suffix(".json").write_text(text, encoding="utf-8")
    if replaced:
        assert check_output_file(page, beside=(".json",), marks=JSON_MARKS) == page
    else:
        with pytest.raises(BertologyError, match=r"why\.json exists and is not a file bertology wrote"):
            check_output_file(page, beside=(".json",), marks=JSON_MARKS)
