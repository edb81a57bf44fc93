"""The token index folder (bertology.index.store): a rebuild killed at any moment leaves the old index or
the new one, whole; old generations are removed and other files kept; every damaged index file is named
in one sentence (CLI: exit 1; web app: refused at start); `index -o` refuses a file and a folder that
holds files but no index."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.cli import run_command

from bertology import cli
from bertology.errors import BertologyError
from bertology.index.store import MANIFEST, new_generation
from bertology.index.token_index import TokenIndex, build_index
from bertology.models.loading import LoadedModel
from bertology.server.app import create_app

LAYERS = [2, 5]
#: Rebuilds killed, each at a seeded moment: two at a random moment of the whole run (mostly while the
#: model runs, before anything is written: the old index must open) and two while the finished files are
#: written and the manifest switched (the only steps where a kill could leave a mix). More trials of the
#: same two kinds cover no other code path; the manifest's switch is one atomic rename either way.
KILLS = 4
Signature = tuple[list[int], list[list[str]], list[int]]


def signature(index: TokenIndex) -> Signature:
    """What tells two indexes apart: layers, every segment's words, every token's id."""
    return index.layers, [segment.words for segment in index.segments], index.tables["token_id"].tolist()


@pytest.fixture(scope="module")
def old_and_new(
    default_model: LoadedModel,
    sample_corpus_head: Callable[[int], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[TokenIndex, TokenIndex, Path]:
    """Two known indexes of different corpora (the old: 3 lines, the new: 8), and the new one's corpus."""
    root = tmp_path_factory.mktemp("indexes")
    old = build_index(sample_corpus_head(3), root / "old", model=default_model, layers=LAYERS, threads=1)
    corpus = sample_corpus_head(8)
    new = build_index(corpus, root / "new", model=default_model, layers=LAYERS, threads=1)
    assert signature(old) != signature(new)
    return old, new, corpus


def _index_command(corpus: Path, folder: Path) -> list[str]:
    layers = ",".join(map(str, LAYERS))
    return [sys.executable, "-m", "bertology", "index", str(corpus), "-o", str(folder), "--layers", layers]


def _writing_started(folder: Path, old: Path) -> bool:
    """Whether a build has begun writing its finished files (the graphs come first) into a new generation
    (any but ``old``'s)."""
    return any(path.parent.name != old.name for path in folder.glob("generation-*/layer_*.usearch"))


@pytest.mark.slow
def test_index_killed_at_any_moment_opens_as_the_old_or_the_new_index(
    old_and_new: tuple[TokenIndex, TokenIndex, Path], tmp_path: Path
) -> None:
    old, new, corpus = old_and_new
    expected = {"old": signature(old), "new": signature(new)}
    full = tmp_path / "full"
    shutil.copytree(old.folder, full)
    started = time.monotonic()
    subprocess.run(_index_command(corpus, full), check=True, capture_output=True, timeout=300)
    duration = time.monotonic() - started
    assert signature(TokenIndex.open(full)) == expected["new"]
    rng = np.random.default_rng(28)
    seen = []
    for trial in range(KILLS):
        folder = tmp_path / f"killed_{trial}"
        shutil.copytree(old.folder, folder)
        current = folder / json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["generation"]
        process = subprocess.Popen(
            _index_command(corpus, folder), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            if trial % 2:  # at a random moment of the whole run
                time.sleep(rng.uniform(0.3, 1.0) * duration)
            else:  # while the files are written and the manifest switched: poll, then a few ms more
                deadline = time.monotonic() + 2 * duration + 30
                while (
                    process.poll() is None
                    and not _writing_started(folder, current)
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.04))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=60)
        found = signature(TokenIndex.open(folder))
        assert found in expected.values(), f"trial {trial}: the folder is neither index"
        seen.append("old" if found == expected["old"] else "new")
    # A build over the last folder removes what the killed one left: one manifest, one generation.
    rebuilt = build_index(corpus, folder, layers=LAYERS, threads=1)
    assert signature(rebuilt) == expected["new"]
    generations = [entry.name for entry in folder.iterdir() if entry.name != MANIFEST]
    assert len(generations) == 1 and generations[0].startswith("generation-"), (generations, seen)


def test_rebuild_removes_the_old_generation_keeps_other_files_and_open_readers(
    old_and_new: tuple[TokenIndex, TokenIndex, Path], default_model: LoadedModel, tmp_path: Path
) -> None:
    old, new, corpus = old_and_new
    folder = tmp_path / "index"
    shutil.copytree(old.folder, folder)
    (folder / "notes.txt").write_text("the user's", encoding="utf-8")
    reader = TokenIndex.open(folder)
    vectors = reader.vectors(np.arange(5), 5)
    rebuilt = build_index(corpus, folder, model=default_model, layers=LAYERS, threads=1)
    assert signature(rebuilt) == signature(new)
    assert sorted(entry.name for entry in folder.iterdir()) == sorted(
        ["manifest.json", "notes.txt", json.loads((folder / MANIFEST).read_text())["generation"]]
    )
    assert (folder / "notes.txt").read_text(encoding="utf-8") == "the user's"
    # A reader that opened the old generation keeps reading it (its files were unlinked, not rewritten).
    np.testing.assert_array_equal(reader.vectors(np.arange(5), 5), vectors)
    assert reader.search(vectors[:2], 5, k=1)[0][:, 0].tolist() == [0, 1]


def test_a_failed_build_leaves_the_index_and_a_new_folder_as_they_were(
    old_and_new: tuple[TokenIndex, TokenIndex, Path], default_model: LoadedModel, tmp_path: Path
) -> None:
    old, _, _ = old_and_new
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    folder = tmp_path / "index"
    shutil.copytree(old.folder, folder)
    before = sorted(path.relative_to(folder) for path in folder.rglob("*"))
    with pytest.raises(BertologyError, match="contains no text"):
        build_index(empty, folder, model=default_model, layers=LAYERS, threads=1)
    assert sorted(path.relative_to(folder) for path in folder.rglob("*")) == before
    with pytest.raises(BertologyError, match="contains no text"):
        build_index(empty, tmp_path / "new" / "index", model=default_model, layers=LAYERS, threads=1)
    assert not (tmp_path / "new" / "index").exists()


@pytest.mark.slow
def test_index_refuses_a_file_and_a_folder_without_an_index(
    sample_corpus_head: Callable[[int], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = sample_corpus_head(3)
    plain = tmp_path / "plain.txt"
    plain.write_text("the user's", encoding="utf-8")
    result = run_command(["index", str(corpus), "-o", str(plain)], capsys)
    assert (result.returncode, result.stderr) == (
        1,
        f"Error: The output folder {plain} is a file; choose a folder.\n",
    )
    foreign = tmp_path / "web"
    foreign.mkdir()
    files = {"manifest.json": '{"name": "my web app"}', "tokens.npz": "mine", "segments.jsonl": "mine"}
    for name, text in files.items():
        (foreign / name).write_text(text, encoding="utf-8")
    result = run_command(["index", str(corpus), "-o", str(foreign)], capsys)
    assert (result.returncode, result.stderr) == (
        1,
        f"Error: '{foreign}' holds files but no token index; choose a new or empty folder, or an index to "
        "replace.\n",
    )
    assert {path.name: path.read_text(encoding="utf-8") for path in foreign.iterdir()} == files


#: (case, the file damaged and then named, relative to the generation folder unless it is the manifest,
#: the damage: bytes written over it, or "cut" (its first half kept), "drop" (its last line dropped) or
#: "remove", and the word the sentence uses).
DAMAGE = [
    ("manifest not JSON", MANIFEST, b'{"format": 3,', "damaged"),
    ("tokens not a zip", "tokens.npz", b"not a zip", "damaged"),
    ("tokens cut", "tokens.npz", "cut", "damaged"),
    ("segments line broken", "segments.jsonl", b"{broken\n", "damaged"),
    ("segments short", "segments.jsonl", "drop", "damaged"),
    ("graph not usearch", "layer_5.usearch", b"hello world" * 10, "damaged"),
    ("graph cut", "layer_5.usearch", "cut", "damaged"),
    ("graph missing", "layer_5.usearch", "remove", "missing"),
    ("tokenizer broken", "tokenizer/tokenizer.json", b"{]", "damaged"),
]


def damaged_copy(index: TokenIndex, root: Path, name: str, damage: bytes | str) -> tuple[Path, Path]:
    """A copy of ``index``'s folder under ``root`` with its file ``name`` damaged: (the copy, the path the
    sentence must name: the file, or the tokenizer folder for a file in it)."""
    folder = root / "damaged"
    shutil.copytree(index.folder, folder)
    generation = folder / json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["generation"]
    path = folder / name if name == MANIFEST else generation / name
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    elif damage == "cut":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "drop":
        path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:-1]))
    else:
        path.unlink()
    return folder, path.parent if path.parent.name == "tokenizer" else path


def sentence(path: Path, state: str) -> str:
    """The pattern of the one sentence that names the damaged or missing index file ``path``."""
    problem = r"damaged \([^\n]+\)" if state == "damaged" else "missing"
    again = r"build the index again \(`bertology index`\)\."
    return rf"The token index file {re.escape(str(path))} is {problem}; {again}"


@pytest.mark.parametrize(("case", "name", "damage", "state"), DAMAGE, ids=[case[0] for case in DAMAGE])
def test_a_damaged_index_file_is_named_in_one_sentence(
    case: str,
    name: str,
    damage: bytes | str,
    state: str,
    old_and_new: tuple[TokenIndex, TokenIndex, Path],
    default_model: LoadedModel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, named = damaged_copy(old_and_new[0], tmp_path, name, damage)
    with pytest.raises(BertologyError) as raised:
        TokenIndex.open(folder)
    assert re.fullmatch(sentence(named, state), str(raised.value)), str(raised.value)
    # The web app refuses the index at start with the same sentence (no 500 at the first search).
    with pytest.raises(BertologyError, match=sentence(named, state)):
        create_app([default_model], index=folder)
    # The command line: one line on stderr, exit code 1 (before the server would listen).
    monkeypatch.setattr(sys, "argv", ["bertology", "serve", "--index", str(folder), "--port", "0"])
    threads = torch.get_num_threads()  # serve sets the process's torch threads
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main()
    finally:
        torch.set_num_threads(threads)
    stderr = capsys.readouterr().err
    assert exited.value.code == 1
    assert re.fullmatch("Error: " + sentence(named, state) + "\n", stderr), stderr


def test_a_second_build_of_one_folder_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    folder = tmp_path / "index"
    with new_generation(folder) as first:
        with (
            pytest.raises(
                BertologyError, match=r"Another `bertology index` is writing '.*index'; wait until"
            ),
            new_generation(folder),
        ):
            pass
        assert [entry.name for entry in folder.iterdir()] == [first.folder.name]  # the first's untouched
        first.manifest.update(model="m", layers=[0], width=4, tokens=0, segments=0)
    assert json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["generation"] == first.folder.name
