"""The runs folder's files in real headless Chromium against a live server on 127.0.0.1: a page planted
there that tries to load and send things elsewhere (image, script, stylesheet, CSS import and font,
fetch, XHR, WebSocket, beacon, frame, media, prefetch) reaches nothing, while its own inline script runs;
and a training run's watch page, served under the same policy, still draws."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import ViewPage, serving
from support.run_folders import write_synthetic_run

from bertology.models import LoadedModel
from bertology.server import create_app

pytestmark = pytest.mark.browser

WAIT_MS = 30_000
#: How long the planted page is given to try.
TRY_S = 2.0


def planted_page(trap: str) -> str:
    """A page that asks ``trap`` (``host:port``) for things in every way a page can without a click, and
    says in its title that its own script ran."""
    http, ws = f"http://{trap}", f"ws://{trap}"
    return f"""<!DOCTYPE html>
<html><head><title>waiting</title>
<link rel="stylesheet" href="{http}/style.css">
<link rel="prefetch" href="{http}/prefetch">
<script src="{http}/script.js"></script>
<style>@import url("{http}/import.css"); @font-face {{ font-family: trap; src: url("{http}/font.woff"); }}
body {{ background: url("{http}/background.png"); font-family: trap; }}</style>
</head><body><p>planted</p>
<img src="{http}/image.png"><iframe src="{http}/frame.html"></iframe><video src="{http}/video.mp4"></video>
<object data="{http}/object"></object>
<script>
fetch("{http}/fetch").catch(() => {{}});
const xhr = new XMLHttpRequest(); try {{ xhr.open("GET", "{http}/xhr"); xhr.send(); }} catch (e) {{}}
try {{ new WebSocket("{ws}/socket"); }} catch (e) {{}}
try {{ navigator.sendBeacon("{http}/beacon", "x"); }} catch (e) {{}}
new Image().src = "{http}/new-image.png";
document.title = "ran";
</script></body></html>"""


@pytest.fixture
def trap() -> Iterator[socket.socket]:
    """A listening socket on another loopback address: whatever reaches it waits in the kernel's backlog,
    whether or not the browser reports it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen(64)
        listener.setblocking(False)
        yield listener


def received(listener: socket.socket) -> bytes:
    """Every byte sent to ``listener`` over the connections waiting in its backlog (accepted and closed
    here). Chromium may open a connection ahead of a navigation it then refuses, sending nothing on it."""
    data = b""
    while True:
        try:
            accepted, _ = listener.accept()
        except BlockingIOError:
            return data
        with accepted:
            accepted.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # connected, nothing sent
                data += accepted.recv(65536)


def test_a_planted_page_reaches_nothing(
    chromium_browser: object,
    default_model: LoadedModel,
    tmp_path: Path,
    trap: socket.socket,
) -> None:
    host, port = trap.getsockname()
    runs = tmp_path / "runs"
    (runs / "planted").mkdir(parents=True)
    (runs / "planted" / "report.html").write_text(planted_page(f"{host}:{port}"))
    with serving(create_app([default_model], runs=runs)) as base:
        context = chromium_browser.new_context()  # type: ignore[attr-defined]
        page = context.new_page()
        asked: list[str] = []
        blocked: list[str] = []  # refused by the browser before anything was sent
        sent: list[str] = []  # answered: the request went out
        page.on("request", lambda request: asked.append(request.url))
        page.on("requestfailed", lambda request: request.failure == "csp" and blocked.append(request.url))
        page.on("requestfinished", lambda request: sent.append(request.url))
        page.goto(f"{base}/runs/planted/report.html")
        page.wait_for_function("document.title === 'ran'", timeout=WAIT_MS)  # its inline script runs
        time.sleep(TRY_S)
        context.close()
    assert sent == [f"{base}/runs/planted/report.html"]
    assert len(blocked) >= 8  # image, script, stylesheets, font, XHR, prefetch...: each refused
    assert sorted(url for url in asked if not url.startswith(base)) == sorted(blocked)
    assert received(trap) == b""


def test_a_watch_page_draws_under_the_runs_policy(
    chromium_browser: object, default_model: LoadedModel, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    write_synthetic_run(runs / "run")
    with serving(create_app([default_model], runs=runs)) as base:
        context = chromium_browser.new_context()  # type: ignore[attr-defined]
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("pageerror", lambda error: errors.append(str(error)))
        response = page.goto(f"{base}/runs/run/")
        assert response is not None and "default-src 'none'" in response.headers["content-security-policy"]
        ViewPage(page=page, url=f"{base}/runs/run/").wait_ready(WAIT_MS)
        steps = page.evaluate("document.querySelectorAll('input[type=range]').length")
        context.close()
    assert steps >= 1
    assert errors == []  # no Content-Security-Policy violation, no script error
