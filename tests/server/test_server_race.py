"""The runs folder under attack: while requests are answered, another process swaps an entry of the runs
folder with a symbolic link to a file or folder outside, over and over (``renameat2`` with
``RENAME_EXCHANGE``, atomic), so any server that checks a name and then opens it by name would now and
then read the outside file. A real uvicorn server on loopback; every answer must be whole, 200 or 403,
and never hold the outside content: static files, the explorer's inputs and watch pages."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from support.browser import serving
from support.run_folders import write_synthetic_run

from bertology.models.loading import LoadedModel
from bertology.server import Limits, create_app

SECRET = "the-secret-outside-the-runs-folder"
INSIDE = "harmless content inside the runs folder"
#: Each scenario's bounds: it stops at whichever comes first.
SECONDS = 4.0
REQUESTS = 3000

# Swaps argv[1] and argv[2] (paths) with renameat2(RENAME_EXCHANGE) until SIGTERM or argv[3] seconds;
# prints "swapping" once the first swap is done, and leaves both as they were at the start.
_SWAPPER = """
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
first, second, end = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), time.monotonic() + float(sys.argv[3])
AT_FDCWD, RENAME_EXCHANGE = -100, 2
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
swaps = 0
while (not stop and time.monotonic() < end) or swaps % 2:
    if libc.renameat2(AT_FDCWD, first, AT_FDCWD, second, RENAME_EXCHANGE) != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    swaps += 1
    if swaps == 1:
        print("swapping", flush=True)
"""


@contextmanager
def swapping(entry: Path, outside: Path) -> Iterator[None]:
    """``entry`` (inside the runs folder) and a symbolic link to ``outside`` swapped over and over by
    another process for the block (at most :data:`SECONDS` + 30 s), which is stopped afterwards with
    ``entry`` as it was."""
    link = entry.with_name(entry.name + ".swap")
    link.symlink_to(outside, target_is_directory=outside.is_dir())
    process = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(entry), str(link), str(SECONDS + 30)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "swapping"
        yield
    finally:
        process.terminate()
        assert process.wait(10) == 0
        process.stdout.close()
    assert link.is_symlink() and not entry.is_symlink()


#: The servers' limits here: a request may take up to 600 s (a watch page takes seconds to build, far more
#: on a loaded machine), so an answer is a 200 or a 403, never the limit's 503.
LIMITS = Limits(timeout_s=600)


def hammer(base: str, method: str, path: str, body: dict[str, object] | None = None) -> Counter[int]:
    """Ask for ``path`` until :data:`SECONDS` pass or :data:`REQUESTS` answers came; the statuses counted.
    Fails on an answer that holds :data:`SECRET`, or one cut short of its length."""
    host, port = base.removeprefix("http://").split(":")
    statuses: Counter[int] = Counter()
    # a guard against a hang, never a measure of speed (a loaded machine builds a page slowly)
    connection = http.client.HTTPConnection(host, int(port), timeout=LIMITS.timeout_s)
    end = time.monotonic() + SECONDS
    payload = None if body is None else json.dumps(body)
    headers = {} if body is None else {"Content-Type": "application/json"}
    try:
        while time.monotonic() < end and sum(statuses.values()) < REQUESTS:
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            content = response.read()  # http.client.IncompleteRead: an answer cut short
            assert SECRET.encode() not in content, (
                f"{path} answered with the outside file ({response.status})"
            )
            statuses[response.status] += 1
    finally:
        connection.close()
    assert set(statuses) <= {200, 403}, statuses
    return statuses


def write_analysis(folder: Path, note: str) -> Path:
    """A small analysis folder (2 layers x 2 heads) whose ``summary.json`` carries ``note``, which the
    explorer's overview repeats."""
    folder.mkdir(parents=True)
    heads = pd.DataFrame(
        {"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "label": "none", "previous": [0.1, 0.2, 0.3, 0.4]}
    )
    heads.to_csv(folder / "heads.csv", index=False)
    names = [f"{layer}-{head}" for layer, head in zip(heads["layer"], heads["head"], strict=True)]
    divergence = pd.DataFrame(
        [[abs(i - j) * 0.1 for j in range(4)] for i in range(4)], index=names, columns=names
    )
    divergence.rename_axis("layer-head").to_csv(folder / "head_js_divergence.csv")
    (folder / "summary.json").write_text(json.dumps({"seed": 0, "note": note}))
    (folder / "report.html").write_text(f"<title>{note}</title>")
    return folder


def test_static_files_never_leak(default_model: LoadedModel, tmp_path: Path) -> None:
    runs, outside = tmp_path / "runs", tmp_path / "outside"
    (runs / "files").mkdir(parents=True)
    outside.mkdir()
    (outside / "passwd").write_text(SECRET * 1000)  # longer than the inside file, as /etc/passwd was
    (runs / "files" / "passwd").write_text(INSIDE)
    with serving(create_app([default_model], runs=runs, limits=LIMITS)) as base:
        with swapping(runs / "files" / "passwd", outside / "passwd"):
            by_file = hammer(base, "GET", "/runs/files/passwd")
        with swapping(runs / "files", outside):
            by_folder = hammer(base, "GET", "/runs/files/passwd")
    for statuses in (by_file, by_folder):
        assert statuses[200] > 0 and statuses[403] > 0, statuses  # both states were met


@pytest.mark.slow
def test_explorer_inputs_never_leak(default_model: LoadedModel, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_analysis(runs / "analysis", INSIDE)
    outside = write_analysis(tmp_path / "outside", SECRET)
    request = ("POST", "/api/explore/analysis", {"run": "analysis"})
    with serving(create_app([default_model], runs=runs, limits=LIMITS)) as base:
        with swapping(runs / "analysis" / "summary.json", outside / "summary.json"):
            by_file = hammer(base, *request)
        with swapping(runs / "analysis", outside):
            by_folder = hammer(base, *request)
    for statuses in (by_file, by_folder):
        assert statuses[200] > 0 and statuses[403] > 0, statuses


@pytest.mark.slow
def test_watch_pages_never_leak(default_model: LoadedModel, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_synthetic_run(runs / "run")
    outside = write_synthetic_run(tmp_path / "outside")
    info = json.loads((outside / "run.json").read_text())
    (outside / "run.json").write_text(json.dumps({**info, "task": SECRET}))
    # a page takes seconds: few answers
    with serving(create_app([default_model], runs=runs, limits=LIMITS)) as base:
        with swapping(runs / "run" / "run.json", outside / "run.json"):
            hammer(base, "GET", "/runs/run/")
        with swapping(runs / "run", outside):
            hammer(base, "GET", "/runs/run/")
