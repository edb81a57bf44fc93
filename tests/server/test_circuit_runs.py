"""A circuit run in the web app: listed with its kind, opening on its ``circuit.html`` with a link to its
curves, and (in Chromium, through the runs folder's sandboxed frame and policy) its page's script runs
and draws the circuit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from support.browser import serving
from support.circuit_runs import PERCENTS, write_run

from bertology.models.loading import LoadedModel
from bertology.report.circuit import circuit_script_hash, write_circuit_page
from bertology.server import create_app

WAIT_MS = 30_000


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs folder with one circuit run, ``ioi circuit``: its page written, a stand-in for its curves."""
    root = tmp_path_factory.mktemp("circuit_runs")
    ranked = write_run(root / "ioi circuit", model="gpt2-small")
    write_circuit_page(root / "ioi circuit")
    (root / "ioi circuit" / "curves.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    assert len(ranked) == 75  # the 2 x 3 graph the sizes below count
    return root


def test_a_circuit_run_is_listed_with_its_page_and_curves(default_model: LoadedModel, runs: Path) -> None:
    with TestClient(create_app([default_model], runs=runs)) as client:
        assert client.get("/api/runs").json()["runs"] == [
            {
                "path": "ioi circuit",
                "kind": "circuit",
                "model": "gpt2-small",
                "url": "/runs/ioi%20circuit/circuit.html",
                "explore": None,
                "links": {"curves": "/runs/ioi%20circuit/curves.png"},
            }
        ]
        folder = client.get("/runs/ioi circuit/", follow_redirects=False)
        assert (folder.status_code, folder.headers["location"]) == (307, "/runs/ioi%20circuit/circuit.html")
        page = client.get("/runs/ioi%20circuit/circuit.html")
        assert page.status_code == 200
        assert circuit_script_hash() in page.headers["content-security-policy"]


@pytest.fixture(scope="module")
def live_url(default_model: LoadedModel, runs: Path) -> Iterator[str]:
    with serving(create_app([default_model], runs=runs)) as url:
        yield url


@pytest.mark.browser
def test_the_circuit_page_opens_from_the_run_list(chromium_browser: Any, live_url: str) -> None:
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    for tab in (page, context):  # the app's page, and the tab the run opens in
        tab.on("console", lambda msg: msg.type == "error" and errors.append(f"console: {msg.text}"))
    page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
    page.goto(live_url + "/")
    page.wait_for_selector("body[data-state=idle]", timeout=WAIT_MS)
    item = page.locator("#runs-list li")
    assert item.locator(".kind").inner_text() == "circuit"
    assert item.locator("a.run-link").inner_text() == "curves"
    assert item.locator("a.run-link").get_attribute("href") == "/runs/ioi%20circuit/curves.png"
    with page.expect_popup() as popup:
        item.locator("a").first.click()
    tab = popup.value
    tab.on("console", lambda msg: msg.type == "error" and errors.append(f"tab console: {msg.text}"))
    tab.wait_for_load_state()
    assert tab.url.endswith("/runs/ioi%20circuit/circuit.html")
    frame = tab.frame_locator("iframe[sandbox='allow-scripts']")
    ready = frame.locator("#circuit[data-state=ready]")
    ready.wait_for(timeout=WAIT_MS)  # its script ran under the runs folder's policy
    assert ready.get_attribute("data-drawn-edges") == str(int(PERCENTS[1] / 100 * 75))  # opens on 10 %
    assert errors == []
    context.close()
