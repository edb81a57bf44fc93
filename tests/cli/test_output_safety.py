"""Output folders keep the user's files: the commands that write a folder (`analyze`, `compare`, `probe ...`,
`ablate`, all through :func:`bertology.files.outputs.output_folder`) switch the folder whole, keeping a
user's own files in it and in the subfolders the tool writes (`plots/`, `examples/`, `pruned/`); and no
file beside an output file (`relevance -o X.html` writes `X.json`) is replaced unless the tool wrote it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cli import run_child_killed_at_switch
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.files.outputs import output_folder

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
    from bertology.files.outputs import check_output_file
    from bertology.interventions.saliency import JSON_MARKS

    page = tmp_path / "why.html"
    text = beside if isinstance(beside, str) else json.dumps(beside)
    page.with_suffix(".json").write_text(text, encoding="utf-8")
    if replaced:
        assert check_output_file(page, beside=(".json",), marks=JSON_MARKS) == page
    else:
        with pytest.raises(BertologyError, match=r"why\.json exists and is not a file bertology wrote"):
            check_output_file(page, beside=(".json",), marks=JSON_MARKS)


# --- Staging folders: none outlives a later successful run; SIGTERM cleans up ------------------------

#: Enters output_folder(argv[1]), writes a file, says where its staging folder is, then waits to be killed.
_HOLD_STAGING = """
import sys, time
from bertology.files.outputs import output_folder
with output_folder(sys.argv[1]) as staging:
    (staging / "half.txt").write_text("half", encoding="utf-8")
    print(staging, flush=True)
    time.sleep(600)
"""


def _holding(target: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that holds a staging folder of ``target`` (its lock included), and that folder."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD_STAGING, str(target)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def _staging_folders(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*.partial") if path.is_dir())


def test_a_later_run_removes_the_staging_folders_killed_runs_left_but_not_a_live_runs(
    tmp_path: Path,
) -> None:
    target = tmp_path / "runs" / "out"
    before, killed_before = _holding(target)  # killed before the target existed (its parent is made)
    before.send_signal(signal.SIGKILL)
    before.wait(timeout=60)
    target.mkdir()
    (tmp_path / "runs" / ".other.abc.partial").mkdir()  # another output's: not ours to remove
    (target / ".out.legacy.partial").mkdir()  # where earlier versions staged (issue 43 found 7 there)
    killed, killed_beside = _holding(target)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    live, live_staging = _holding(target)
    try:
        assert killed_before.parent == killed_beside.parent == target.parent
        assert {killed_before, killed_beside, live_staging} <= set(_staging_folders(tmp_path))
        with output_folder(target) as folder:
            (folder / "report.html").write_text("done", encoding="utf-8")
        assert _staging_folders(tmp_path) == sorted([tmp_path / "runs" / ".other.abc.partial", live_staging])
        assert (live_staging / "half.txt").read_text(encoding="utf-8") == "half"  # the live run's, intact
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=60)
    with output_folder(target) as folder:
        (folder / "report.html").write_text("again", encoding="utf-8")
    assert _staging_folders(tmp_path) == [tmp_path / "runs" / ".other.abc.partial"]
    assert _contents(target) == {"report.html": "again"}


def _analyze_until_staged(args: list[str], output: Path) -> subprocess.Popen[bytes]:
    """``bertology analyze ARGS -o OUTPUT`` in a new process, once it has made a staging folder."""
    earlier = set(_staging_folders(output.parent))
    command = [sys.executable, "-m", "bertology", "analyze", *args, "-o", str(output)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600

    def staged() -> bool:
        return bool(set(_staging_folders(output.parent)) - earlier)

    while not staged() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert staged(), "the run never staged its output"
    return process


#: What an earlier analysis left (the files issue 43 found mixed with a killed run's new ones).
OLD_ANALYSIS = {"report.html": "old", "heads.csv": "old", "summary.json": "old", "head_examples.npz": "old"}


@pytest.mark.slow
def test_analyze_killed_at_its_switch_or_terminated_leaves_a_whole_run_and_a_later_run_cleans_up(
    tmp_path: Path, sample_corpus_head: Callable[[int], Path], tiny_model_dirs: dict[str, Path]
) -> None:
    """One SIGKILL at the switch of the folder, just after the names are exchanged: the point where the
    old file-by-file move left a new report.html beside the old heads.csv (issue 43), and the one that
    leaves the old run under a staging name for a later run to remove. The switch's every step is killed
    in tests/files/test_swap.py, cheaply; here it is the real command's (a tiny model, 6 segments). Then
    a SIGTERM while the run stages (issue 34: it removes its own staging folder), and a later run."""
    output = tmp_path / "analysis"
    _plant(output, USER_FILES | OLD_ANALYSIS)
    args = [
        str(sample_corpus_head(6)),
        "--limit",
        "6",
        "--model",
        str(tiny_model_dirs["bert"]),
        "--max-len",
        "64",
    ]
    killed = run_child_killed_at_switch("after", "analyze", *args, "-o", str(output))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    found = _contents(output)
    assert found.items() >= USER_FILES.items() and "plots/head_map.png" in found, sorted(found)
    assert not [name for name in OLD_ANALYSIS if found[name] == "old"]  # the new run, whole
    assert len(_staging_folders(tmp_path)) == 1  # the old run, under the staging name
    terminated = _analyze_until_staged(args, output)
    terminated.send_signal(signal.SIGTERM)
    _, stderr = terminated.communicate(timeout=120)
    assert terminated.returncode == 143
    assert "Terminated: stopped by SIGTERM; nothing more was written." in stderr.decode()
    assert len(_staging_folders(tmp_path)) == 1  # the SIGTERM'd run removed its own
    assert _contents(output) == found
    result = CliRunner().invoke(app, ["analyze", *args, "-o", str(output)])
    assert result.exit_code == 0, result.output
    assert _staging_folders(tmp_path) == []
    assert _contents(output).items() >= USER_FILES.items()


# --- Output files: a page path is a regular file or absent, checked before the model loads -----------

#: Every command that writes a file path (-o), with the rest of its arguments.
FILE_WRITERS = {
    "view": ["view", "The cat sat."],
    "relevance": ["relevance", "The cat sat."],
    "explain": ["explain", "default", "The cat sat."],
    "attack": ["attack", "default", "The cat sat."],
    "attribute": ["attribute", "default", "The cat sat."],
}


@pytest.mark.parametrize(
    ("command", "fifo_at"),
    [(command, "page") for command in sorted(FILE_WRITERS)]
    + [(command, "json") for command in sorted(FILE_WRITERS) if command != "view"],  # view: no JSON
)
def test_a_named_pipe_as_output_is_refused_before_the_model_loads(
    command: str, fifo_at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bertology.models.loading

    def no_loading(*args: object, **options: object) -> None:
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(bertology.models.loading, "load_model", no_loading)
    page = tmp_path / "page.html"
    fifo = page if fifo_at == "page" else page.with_suffix(".json")
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, [*FILE_WRITERS[command], "-o", str(page)])
    assert isinstance(result.exception, BertologyError), result.output
    assert str(result.exception) == (
        f"Cannot write the file {fifo}: it is a named pipe, not a regular file; choose a file path."
    )


def test_watch_refuses_a_named_pipe_and_a_device_as_its_page(tmp_path: Path) -> None:
    from support.run_folders import write_synthetic_run

    run = tmp_path / "run"
    write_synthetic_run(run)
    os.mkfifo(tmp_path / "pipe.html")
    for output, kind in ((tmp_path / "pipe.html", "a named pipe"), (Path("/dev/null"), "a device")):
        result = CliRunner().invoke(app, ["watch", str(run), "-o", str(output)])
        assert isinstance(result.exception, BertologyError), result.output
        assert str(result.exception) == (
            f"Cannot write the file {output}: it is {kind}, not a regular file; choose a file path."
        )


def test_an_error_while_writing_a_page_names_the_file() -> None:
    from bertology.files.outputs import write_text

    with pytest.raises(BertologyError) as raised:
        write_text("/dev/full", "<html></html>")
    assert str(raised.value) == "Could not write /dev/full: No space left on device."
