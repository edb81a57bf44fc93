"""Browsing the runs folder: what is listed, what is served and how, and that no path outside the
folder is reachable (``..``, absolute paths, symlinks pointing out, encoded variants)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import zarr
from fastapi.testclient import TestClient
from support.run_folders import write_synthetic_run

from bertology.errors import BertologyError
from bertology.files.beneath import OpenFolder
from bertology.files.run_files import mark_run
from bertology.models.loading import LoadedModel
from bertology.server import Limits, create_app, watch_pages
from bertology.server.errors import RequestError
from bertology.server.runs import RunsFolder
from bertology.training.archive import ARCHIVE_FOLDER, ArchiveWriter

SECRET = "the secret outside the runs folder"
T = TypeVar("T")
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def make_runs(base: Path) -> Path:
    """A runs folder with an analysis, a probe report, a training run, other files and hostile links;
    beside it, a secret file that must stay out of reach."""
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    root = base / "runs"
    analysis = root / "analysis"
    (analysis / "plots").mkdir(parents=True)
    (analysis / "report.html").write_text("<!DOCTYPE html><title>Analysis</title><p>heads</p>")
    (analysis / "heads.csv").write_text("layer,head,previous\n0,0,0.5\n")
    mark_run(analysis, "analysis", model="default")
    (analysis / "plots" / "heads.png").write_bytes(PNG)
    probe = root / "probes" / "deps"
    probe.mkdir(parents=True)
    (probe / "report.html").write_text("<!DOCTYPE html><title>Dependency probe</title>")
    mark_run(probe, "probe", model="default", probe="dependency")
    run = root / "training" / "run 1"
    (run / "checkpoint" / "nested").mkdir(parents=True)
    (run / "run.json").write_text('{"steps": 3, "model": "runs/sst2"}')
    (run / "checkpoint" / "nested" / "report.html").write_text("inside a run: not listed on its own")
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("plain notes")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "report.html").write_text("hidden")
    (root / "link_out").symlink_to(outside, target_is_directory=True)
    (root / "secret_link.txt").symlink_to(outside / "secret.txt")
    (root / "report_link").symlink_to(analysis, target_is_directory=True)  # inside, yet not followed
    return root


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runs(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def client(default_model: LoadedModel, runs_root: Path) -> Iterator[TestClient]:
    with TestClient(create_app([default_model], runs=runs_root)) as test_client:
        yield test_client


@pytest.fixture
def watch_stub(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand in for building a watch page (``bertology.training.watch.watch_html``, tested in
    test_watch.py); records the opened run folders it is called with, by their paths in the runs folder."""
    calls: list[str] = []

    def build(run: OpenFolder) -> str:
        calls.append(run.label)
        return f"<!DOCTYPE html><title>watch</title><input type=range id=step> {run.label.split('/')[-1]}"

    monkeypatch.setattr(watch_pages, "_build", build)
    return calls


# --- Listing ------------------------------------------------------------------------------------------


def test_runs_are_listed_by_kind(client: TestClient, runs_root: Path) -> None:
    answer = client.get("/api/runs").json()
    assert answer["root"] == str(runs_root.resolve())
    assert answer["runs"] == [
        {
            "path": "analysis",
            "kind": "analysis",
            "model": "default",
            "url": "/runs/analysis/report.html",
            "explore": "/explore?run=analysis",
            "links": {},
        },
        {
            "path": "probes/deps",
            "kind": "probe",
            "model": "default",
            "url": "/runs/probes/deps/report.html",
            "explore": None,
            "links": {},
        },
        {
            "path": "training/run 1",
            "kind": "training",
            "model": "runs/sst2",
            "url": "/runs/training/run%201/",
            "explore": None,
            "links": {},
        },
    ]  # not the hidden folder, not what is inside a run, no symlinked folders


def test_no_runs_folder(default_model: LoadedModel) -> None:
    with TestClient(create_app([default_model])) as bare:
        assert bare.get("/api/runs").json() == {"root": None, "runs": []}
    with pytest.raises(BertologyError, match="does not exist"):
        RunsFolder("/no/such/folder")


# --- Serving ------------------------------------------------------------------------------------------


def test_files_are_served_with_their_content_types(client: TestClient) -> None:
    report = client.get("/runs/analysis/report.html")
    assert report.status_code == 200
    assert report.headers["content-type"] == "text/html; charset=utf-8"
    assert report.text.endswith("<p>heads</p>")
    assert report.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert report.headers["x-content-type-options"] == "nosniff"
    image = client.get("/runs/analysis/plots/heads.png")
    assert (image.headers["content-type"], image.content) == ("image/png", PNG)
    assert client.get("/runs/analysis/heads.csv").headers["content-type"].startswith("text/csv")
    assert client.get("/runs/report_link/heads.csv").status_code == 403  # links are not followed at all


def test_a_page_opened_in_a_browser_comes_in_a_sandboxed_frame_and_only_the_frame_gets_it(
    client: TestClient,
) -> None:
    url = "/runs/analysis/report.html"
    opened = client.get(url, headers={"Sec-Fetch-Dest": "document"})
    assert opened.status_code == 200 and "<p>heads</p>" not in opened.text
    assert f'<iframe src="{url}" sandbox="allow-scripts" title="report.html"></iframe>' in opened.text
    assert f'<a href="{url}" target="_blank" rel="noopener noreferrer">Open in a new tab</a>' in opened.text
    policy = opened.headers["content-security-policy"]
    assert "frame-src 'self'" in policy and "script-src" not in policy  # the frame page runs no script
    framed = client.get(url, headers={"Sec-Fetch-Dest": "iframe"})
    assert framed.text.endswith("<p>heads</p>")
    assert framed.headers["content-security-policy"].startswith("sandbox allow-scripts; default-src 'none'")
    assert "unsafe-inline" not in framed.headers["content-security-policy"].split("style-src")[0]
    for other in ("embed", "object", "script", "worker"):
        refused = client.get(url, headers={"Sec-Fetch-Dest": other})
        assert refused.status_code == 403, other
        assert refused.json()["error"] == (
            "A page of the runs folder is shown only in its sandboxed frame; open its address instead."
        )
    image = client.get("/runs/analysis/plots/heads.png", headers={"Sec-Fetch-Dest": "document"})
    assert image.headers["content-type"] == "image/png"  # not a page: itself, wherever it is asked from


def test_a_report_folder_leads_to_its_report(client: TestClient) -> None:
    response = client.get("/runs/probes/deps", follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (307, "/runs/probes/deps/report.html")
    assert "Dependency probe" in client.get("/runs/probes/deps/").text


def test_a_training_run_is_shown_by_its_watch_page(client: TestClient, watch_stub: list[str]) -> None:
    response = client.get("/runs/training/run%201/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "<input type=range id=step> run 1" in response.text
    assert watch_stub == ["training/run 1"]


def test_missing_things_are_404(client: TestClient) -> None:
    assert "nothing at 'analysis/nope.html'" in client.get("/runs/analysis/nope.html").json()["error"]
    response = client.get("/runs/notes/")
    assert response.status_code == 404
    assert response.json() == {"error": "There is no report or training run at 'notes/' in the runs folder."}


# --- Nothing outside the folder -----------------------------------------------------------------------

ESCAPES = [
    "%2e%2e/outside/secret.txt",
    "%2E%2E%2Foutside%2Fsecret.txt",
    "..%2foutside%2fsecret.txt",
    "analysis/%2e%2e/%2e%2e/outside/secret.txt",
    "%252e%252e/outside/secret.txt",
    "%2fetc%2fpasswd",
    "/etc/passwd",
    "..%5coutside%5csecret.txt",
    "analysis%00/report.html",
    "link_out/secret.txt",
    "secret_link.txt",
    "link_out",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_paths_out_of_the_folder_are_refused(client: TestClient, path: str) -> None:
    response = client.get(f"/runs/{path}")
    assert response.status_code == 403, response.text
    assert response.json() == {"error": "That path is refused: only files inside the runs folder are served."}


@pytest.mark.parametrize(
    "relative",
    ["../outside/secret.txt", "analysis/../../outside/secret.txt", "/etc/passwd", "C:/Windows", "a\\..\\b",
     "a\x00b", "%2e%2e/x", "link_out/secret.txt", "secret_link.txt"],
)  # fmt: skip
def test_open_refuses_escapes(runs_root: Path, relative: str) -> None:
    with pytest.raises(RequestError) as refused:
        RunsFolder(runs_root).open(relative)
    assert refused.value.status == 403


def test_open_finds_what_is_inside(runs_root: Path) -> None:
    folder = RunsFolder(runs_root)
    with folder.open("analysis/plots/heads.png") as image:
        assert not isinstance(image, OpenFolder) and image.read() == PNG
    with folder.open("") as root:
        assert isinstance(root, OpenFolder) and os.path.samestat(os.fstat(root.fd), os.stat(runs_root))
    with pytest.raises(RequestError) as missing:
        folder.open("analysis/missing.csv")
    assert missing.value.status == 404


# --- Training runs: links out, limits, cache, damaged files ------------------------------------------

RUN_SECRET = "a task name outside the runs folder"


def link_run(base: Path, layout: str) -> Path:
    """A runs folder with one training run ``linked`` whose files are symbolic links to a run outside:
    ``files`` its run.json and monitor.zarr, ``chunk`` one attention chunk of an archive copied inside,
    ``archive`` the archive's own files placed in the run folder itself."""
    outside = write_synthetic_run(base / "outside_run")
    info = json.loads((outside / "run.json").read_text())
    (outside / "run.json").write_text(json.dumps({**info, "task": RUN_SECRET}))
    run = base / "runs" / "linked"
    run.mkdir(parents=True)
    archive = outside / ARCHIVE_FOLDER
    if layout == "files":
        (run / "run.json").symlink_to(outside / "run.json")
        (run / ARCHIVE_FOLDER).symlink_to(archive, target_is_directory=True)
    elif layout == "chunk":
        (run / "run.json").write_text("{}")
        shutil.copytree(archive, run / ARCHIVE_FOLDER)
        chunk = run / ARCHIVE_FOLDER / "attention" / "c" / "1" / "0" / "0" / "0" / "0" / "0"
        chunk.unlink()
        chunk.symlink_to(archive / "attention" / "c" / "1" / "0" / "0" / "0" / "0" / "0")
    else:
        (run / "run.json").write_text("{}")
        for entry in archive.iterdir():
            (run / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return base / "runs"


@pytest.mark.parametrize("layout", ["files", "chunk", "archive"])
def test_a_run_whose_files_lead_outside_is_refused(
    default_model: LoadedModel, tmp_path: Path, layout: str
) -> None:
    with TestClient(create_app([default_model], runs=link_run(tmp_path, layout))) as linked:
        response = linked.get("/runs/linked/")
    assert response.status_code == 403, response.text[:300]
    assert "leads outside the runs folder" in response.json()["error"]
    assert RUN_SECRET not in response.text


def _in_own_loop(scenario: Coroutine[Any, Any, T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as runner:  # the session's Playwright loop runs in this thread
        return runner.submit(asyncio.run, scenario).result()


def test_watch_pages_are_built_within_the_timeout_and_the_parallel_limit(
    default_model: LoadedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    for index in range(3):
        (runs / f"run{index}").mkdir(parents=True)
        (runs / f"run{index}" / "run.json").write_text("{}")
    lock, building, most = threading.Lock(), [0], [0]
    answered = threading.Event()  # set once the test has run2's answer: its build never ends before

    def slow_build(run: OpenFolder) -> str:
        with lock:
            building[0] += 1
            most[0] = max(most[0], building[0])
        if run.label == "run2":
            answered.wait(120)  # past any limit: the server must answer 503 while it still builds
        else:
            time.sleep(0.4)  # long enough for the two builds to overlap if the limit let them
        with lock:
            building[0] -= 1
        return f"<title>{run.label}</title>"

    monkeypatch.setattr(watch_pages, "_build", slow_build)
    # 5 s: run0 and run1 take 0.8 s in all, one after the other, with room for a loaded machine
    app = create_app([default_model], runs=runs, limits=Limits(parallel=1, timeout_s=5))

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as http:
            first = await asyncio.gather(http.get("/runs/run0/"), http.get("/runs/run1/"))
            late = await http.get("/runs/run2/")
            return [*first, late]

    try:
        first, second, late = _in_own_loop(scenario())
    finally:
        answered.set()
    assert (first.status_code, second.status_code) == (200, 200)
    assert most[0] == 1  # one build at a time with --parallel 1
    assert late.status_code == 503 and "longer than the server's limit of 5 s" in late.json()["error"]


def test_watch_pages_are_cached_until_the_archive_changes(
    default_model: LoadedModel, tmp_path: Path, watch_stub: list[str]
) -> None:
    runs = tmp_path / "runs"
    for index in range(6):
        write_synthetic_run(runs / f"run{index}")
    with TestClient(create_app([default_model], runs=runs)) as browsing:
        for _ in range(3):
            for index in range(6):
                assert browsing.get(f"/runs/run{index}/").text.endswith(f"run{index}")
        assert len(watch_stub) == 6  # six runs browsed three times: each page built once
        writer = ArchiveWriter(zarr.open_group(str(runs / "run3" / ARCHIVE_FOLDER), mode="r+"))
        writer.append(
            20, np.full((2, 2, 3, 6, 6), 1 / 6), np.zeros((len(writer.group.attrs["statistics"]), 2, 3))
        )
        for index in range(6):
            browsing.get(f"/runs/run{index}/")
    assert watch_stub[6:] == ["run3"]  # a new record: that page only is rebuilt


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda run: _cut(run / "run.json"), "run.json cannot be read as JSON"),
        (lambda run: _cut(run / ARCHIVE_FOLDER / "attention/c/1/0/0/0/0/0"), "attention/c/1/0/0/0/0/0"),
        (lambda run: (run / ARCHIVE_FOLDER / "attention/c/2/1/0/0/0/0").unlink(), "attention/c/2/1/0/0/0/0"),
        (lambda run: (run / ARCHIVE_FOLDER / "stats/c/1/0/0/0").unlink(), "stats/c/1/0/0/0"),
        (lambda run: _cut(run / ARCHIVE_FOLDER / "zarr.json"), "zarr.json cannot be read"),
    ],
    ids=["run.json cut", "chunk cut", "chunk missing", "stats chunk missing", "zarr.json cut"],
)
def test_a_damaged_run_gets_a_message_naming_the_file(
    default_model: LoadedModel, tmp_path: Path, damage: Callable[[Path], object], named: str
) -> None:
    run = write_synthetic_run(tmp_path / "runs" / "run")
    damage(run)
    with TestClient(create_app([default_model], runs=tmp_path / "runs")) as browsing:
        response = browsing.get("/runs/run/")
    assert response.status_code == 422, response.text[:300]
    assert named in response.json()["error"]


# --- The real command ---------------------------------------------------------------------------------


def test_startup_line_and_refusals_of_the_real_command(tmp_path: Path) -> None:
    """``bertology serve`` in its own process: it says where it listens and refuses raw traversal paths."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "secret.txt").write_text(SECRET)
    command = [sys.executable, "-m", "bertology", "serve", "--port", "0", "--runs", str(tmp_path / "runs")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline() if process.stdout else ""
        assert line.startswith("bertology serve: listening on http://127.0.0.1:"), process.stderr
        assert f"(models: all-MiniLM-L6-v2; runs: {(tmp_path / 'runs').resolve()})" in line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        for raw in ("/runs/../secret.txt", "/runs/%2e%2e/secret.txt", "/runs/..%2fsecret.txt",
                    "/runs/%252e%252e/secret.txt", "/runs//etc/passwd", "/runs/..\\secret.txt"):  # fmt: skip
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", raw)
            answer = connection.getresponse()
            body = answer.read().decode()
            assert 400 <= answer.status < 500 and SECRET not in body, (raw, body)
            connection.close()
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/api/health")
        assert connection.getresponse().status == 200
        connection.close()
        # DNS rebinding: a page of another site whose name now points at 127.0.0.1 sends its own Host.
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("GET", "/api/health", headers={"Host": f"attacker.example:{port}"})
        answer = connection.getresponse()
        assert answer.status == 400 and "is not this server's" in answer.read().decode()
    finally:
        process.terminate()
        process.wait(30)


# --- Fine-tuned runs as models -----------------------------------------------------------------------


def test_a_fine_tuned_run_is_offered_and_answers_as_a_model(
    default_model: LoadedModel, tiny_model_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A folder as ``bertology finetune`` writes it (``run.json`` and ``model/``) is a model of the server,
    named by its path in the runs folder; one whose ``model`` is a link out of the folder is not."""
    root = tmp_path / "runs"
    run = root / "tasks" / "sst2"
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"steps": 3, "model": "runs/sst2"}')
    shutil.copytree(tiny_model_dirs["bert"], run / "model")
    linked = root / "linked"
    linked.mkdir()
    (linked / "run.json").write_text('{"steps": 3}')
    (linked / "model").symlink_to(tiny_model_dirs["bert"], target_is_directory=True)
    with TestClient(create_app([default_model], runs=root)) as client:
        listed = client.get("/api/models").json()
        assert listed["default"] == default_model.name
        shapes = {model["name"]: (model["layers"], model["heads"]) for model in listed["models"]}
        assert shapes == {default_model.name: (6, 12), "runs/tasks/sst2": (3, 4)}
        answer = client.post("/api/attention", json={"text": "The cat sat.", "model": "runs/tasks/sst2"})
        assert answer.status_code == 200, answer.text
        attention = np.array(answer.json()["attention"])
        assert attention.shape[:2] == (3, 4)  # [layers, heads, query, key] of the tiny BERT
        # float32 softmax rows, summed: 1e-5
        np.testing.assert_allclose(attention.sum(axis=-1), 1.0, atol=1e-5)
        refused = client.post("/api/attention", json={"text": "The cat sat.", "model": "runs/linked"})
        assert refused.status_code == 422
