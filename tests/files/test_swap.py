"""The switch of an output folder (bertology.files.swap through bertology.files.outputs.output_folder), the
one every writer of a run folder uses (analyze, compare, probes, patch, ablate; finetune over an earlier run
with ``replace``): killed at every one of its steps, the folder is the old run or the new one, whole, and a
later run of any kind removes only what killed runs left, never a kept run."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bertology.files import swap
from bertology.files.outputs import output_folder

#: The user's own files in an output folder: every run keeps them.
USER = {"notes.txt": "the user's", "plots/mine.png": "the user's plot", "mine/deep/x.txt": "the user's"}
#: An earlier run there, and what the new run writes (a file replaced, a folder merged, a new folder).
OLD = {"report.html": "old", "heads.csv": "old heads", "plots/a.png": "old a", "model/w.bin": "old w"}
NEW = {"report.html": "new", "plots/a.png": "new a", "plots/b.png": "new b", "examples/h.html": "new h"}

#: Runs output_folder(argv[1], replace=argv[3]) writing NEW, SIGKILLed just before its argv[2]-th step: a
#: call that changes the file system (a folder made, a file linked, renamed, removed, a mode set, the
#: swap). Writing the run's files is counted too (folders made), so the kills cover the run's own work,
#: the links of the target's other files, the swap and the removals after it. Run whole, it prints its
#: steps.
_KILLED_AT = """
import json, os, signal, sys
from pathlib import Path
from bertology.files import swap
from bertology.files.outputs import output_folder

target, kill_at, replace = Path(sys.argv[1]), int(sys.argv[2]), [n for n in sys.argv[3].split(",") if n]
steps = []

def counted(name, function):
    def step(*args, **kwargs):
        steps.append(name)
        if len(steps) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return step

for name in ("mkdir", "rename", "replace", "link", "chmod", "unlink", "rmdir"):
    setattr(os, name, counted(name, getattr(os, name)))
swap._renameat2 = counted("renameat2", swap._renameat2)
with output_folder(target, replace=replace) as staging:
    for name, text in json.loads(sys.argv[4]).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text(text, encoding="utf-8")
print(json.dumps(steps))
"""


def _plant(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")


def _tree(folder: Path) -> dict[str, str] | None:
    """Every file below ``folder`` and its text (``None``: no folder)."""
    if not folder.is_dir():
        return None
    return {
        path.relative_to(folder).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _killed_at(step: int, target: Path, replace: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", _KILLED_AT, str(target), str(step), ",".join(replace), json.dumps(NEW)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def _leftovers(root: Path) -> list[str]:
    return sorted(path.name for path in root.rglob("*.partial*"))


@pytest.mark.parametrize(
    ("case", "replace"),
    [
        ("over an earlier run", ()),  # analyze, compare, probes, patch, ablate: folders merged
        ("over an earlier run", ("model", "run.json")),  # finetune --overwrite: its outputs replaced whole
        ("into a new folder", ()),  # the first run (its parent missing too)
    ],
)
def test_killed_at_every_step_the_folder_is_the_old_run_or_the_new_one_and_later_runs_keep_it(
    tmp_path: Path, case: str, replace: tuple[str, ...]
) -> None:
    """Each step is killed in a fresh copy (a cheap child process, about 50 ms each; some 40 steps). After
    each kill, a run into a sibling folder (another output beside it) and then a run into the same folder
    must leave it whole: the first removes the killed run's staging folder when it is stale, but not the
    kept run; the second replaces it and leaves no staging folder anywhere."""
    old = {} if case == "into a new folder" else USER | OLD
    new = {name: text for name, text in old.items() if name.split("/")[0] not in replace} | NEW
    steps = 0
    while True:
        steps += 1
        root = tmp_path / f"step_{steps}"
        target = root / "runs" / "out"
        if old:
            _plant(target, old)
        _plant(root / "runs" / "kept", {"report.html": "kept"})  # another output beside it
        result = _killed_at(steps, target, replace)
        found = _tree(target)
        assert found == (old or None) or found == new, f"{case}, killed at step {steps}: {found}"
        if result.returncode == 0:
            break
        assert result.returncode == -signal.SIGKILL, result.stderr
        with output_folder(root / "runs" / "sibling") as staging:
            _plant(staging, {"report.html": "a sibling"})
        assert _tree(target) == found and _tree(root / "runs" / "kept") == {"report.html": "kept"}
        with output_folder(target, replace=replace) as staging:
            _plant(staging, {"report.html": "later"})
        assert _tree(target) == {
            name: text for name, text in (found or {}).items() if name.split("/")[0] not in replace
        } | {"report.html": "later"}
        assert _leftovers(root) == [], f"{case}, killed at step {steps}"
        assert _tree(root / "runs" / "kept") == {"report.html": "kept"}
    done = json.loads(result.stdout)
    assert steps == len(done) + 1 and (steps > 25 or not old)
    assert ("renameat2" in done) == bool(old) and ("rename" in done) != bool(old)  # one swap, or one rename
    assert _leftovers(tmp_path) == []


def test_where_names_cannot_be_exchanged_the_old_run_is_moved_aside_then_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(source: Path, target: Path, flags: int) -> None:
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(swap, "_renameat2", refused)
    target = tmp_path / "out"
    _plant(target, USER | OLD)
    with output_folder(target) as staging:
        _plant(staging, NEW)
    assert _tree(target) == USER | OLD | NEW
    assert _leftovers(tmp_path) == []


def test_a_link_to_a_folder_switches_the_folder_it_points_to(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _plant(real, USER | OLD)
    (tmp_path / "link").symlink_to(real)
    with output_folder(tmp_path / "link") as staging:
        _plant(staging, NEW)
    assert (tmp_path / "link").is_symlink() and _tree(real) == USER | OLD | NEW
    assert _leftovers(tmp_path) == []


def test_a_process_working_in_the_folder_goes_on_in_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    _plant(target, USER | OLD)
    monkeypatch.chdir(target / "plots")
    with output_folder("..") as staging:
        _plant(staging, NEW)
    assert Path.cwd() == target / "plots" and Path("b.png").read_text(encoding="utf-8") == "new b"
