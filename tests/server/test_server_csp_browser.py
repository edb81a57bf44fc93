"""The runs folder's files in real headless Chromium against a live server on 127.0.0.1: a page planted
there, opened at its address, comes inside the server's sandboxed frame; it tries to load and send things
elsewhere (image, script, stylesheet, CSS import and font, fetch, XHR, WebSocket, beacon, frame, media,
prefetch) and reaches nothing, its own script does not run, and none of the six ways to navigate or open
a window (window.open, location.href=, meta refresh, an anchor's click(), a target=_blank click, a
download link) nor WebRTC reaches a listener on another loopback address, even when the navigations are
forced from outside the page; a training run's watch page, served the same way, still draws."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import ViewPage, listening_trap, received, serving
from support.run_folders import write_synthetic_run

from bertology.models.loading import LoadedModel
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
    with listening_trap() as listener:
        yield listener


def _report_frame(page: Any, timeout_ms: float = WAIT_MS) -> Any:
    """The frame in which the server shows a page of the runs folder opened at its address, loaded."""
    page.wait_for_selector("iframe[sandbox='allow-scripts']", timeout=WAIT_MS)
    frame = page.main_frame.child_frames[0]
    frame.wait_for_load_state(timeout=timeout_ms)
    return frame


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
        frame = _report_frame(page)
        time.sleep(TRY_S)
        title = frame.evaluate("document.title")
        context.close()
    assert title == "waiting"  # its inline script did not run
    assert sent == [f"{base}/runs/planted/report.html"] * 2  # the frame page, then the page in its frame
    assert len(blocked) >= 7  # the markup's stylesheets, prefetch, script, font, images...: each refused
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
        response = page.goto(f"{base}/runs/run/", wait_until="domcontentloaded")
        assert response is not None and "frame-src 'self'" in response.headers["content-security-policy"]
        ViewPage(page=_report_frame(page), url=f"{base}/runs/run/").wait_ready(WAIT_MS)  # type: ignore[arg-type]
        steps = _report_frame(page).evaluate("document.querySelectorAll('input[type=range]').length")
        context.close()
    assert steps >= 1
    assert errors == []  # no Content-Security-Policy violation, no script error


# --- Navigations, windows, downloads and WebRTC ------------------------------------------------------

#: Each way a page could reach another address without loading a resource: the planted page's markup and
#: script, and what the test then does in its frame, as a script of the page would or as a user clicks
#: (not WebRTC: once a script runs, no policy stops it in Chromium, so the page's own script must not run).
ESCAPES = {
    "window.open": ("", 'window.open("{http}/open")', "script"),
    "location": ("", 'location.href = "{http}/location"', "script"),
    "meta refresh": ('<meta http-equiv="refresh" content="0; url={http}/refresh">', "", ""),
    "anchor click()": (
        '<a id="a" href="{http}/anchor">a</a>',
        'document.getElementById("a").click()',
        "script",
    ),
    "target=_blank click": ('<a id="a" href="{http}/blank" target="_blank">a</a>', "", "click"),
    "download link": ('<a id="a" href="{http}/download" download="x.bin">a</a>', "", "click"),
    "WebRTC": (
        "",
        "const peer = new RTCPeerConnection({{iceServers: [{{urls: 'stun:{stun}'}}]}});"
        "peer.createDataChannel('x'); peer.createOffer().then((offer) => peer.setLocalDescription(offer))",
        "",
    ),
}


def escape_page(name: str, http: str, stun: str) -> str:
    """A planted page that tries the escape ``name`` at once from its own script (and markup)."""
    markup, script, _ = ESCAPES[name]
    markup, code = markup.format(http=http), script.format(http=http, stun=stun)
    head, body = (markup, "") if markup.startswith("<meta") else ("", markup)
    return (
        f"<!DOCTYPE html><html><head><title>waiting</title>{head}</head><body>{body}"
        f"<script>document.title = 'ran'; {code}</script></body></html>"
    )


@pytest.fixture
def udp_trap() -> Iterator[socket.socket]:
    """A UDP socket on another loopback address, as a STUN server would listen."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.2", 0))
        listener.setblocking(False)
        yield listener


def datagrams(listener: socket.socket) -> int:
    """How many datagrams reached ``listener``."""
    count = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            listener.recv(2048)
            count += 1
    return count


@pytest.mark.slow
def test_a_planted_page_can_neither_navigate_nor_open_nor_download_nor_start_webrtc_elsewhere(
    chromium_browser: object,
    default_model: LoadedModel,
    tmp_path: Path,
    trap: socket.socket,
    udp_trap: socket.socket,
) -> None:
    host, port = trap.getsockname()
    http, stun = f"http://{host}:{port}", "{}:{}".format(*udp_trap.getsockname())
    runs = tmp_path / "runs"
    (runs / "planted").mkdir(parents=True)
    names = {name: f"escape_{index}.html" for index, name in enumerate(ESCAPES)}
    for name, file in names.items():
        (runs / "planted" / file).write_text(escape_page(name, http, stun), encoding="utf-8")
    outcomes = {}
    with serving(create_app([default_model], runs=runs)) as base:
        context = chromium_browser.new_context(accept_downloads=True)  # type: ignore[attr-defined]
        popups: list[str] = []
        downloads: list[str] = []
        for name, file in names.items():
            page = context.new_page()
            page.on("popup", lambda opened: popups.append(opened.url))
            page.on("download", lambda download: downloads.append(download.url))
            page.goto(f"{base}/runs/planted/{file}", wait_until="domcontentloaded")
            ran = None
            with contextlib.suppress(Exception):  # the page may have gone elsewhere (as it should not)
                frame = _report_frame(page, timeout_ms=5_000)
            with contextlib.suppress(Exception):  # a refresh may have replaced the frame's document
                ran = frame.evaluate("document.title") == "ran"
            _, script, forced = ESCAPES[name]
            with contextlib.suppress(Exception):  # the frame may be gone, or refuse, as it should
                if forced == "script":  # as if the page's script had run
                    frame.evaluate(script.format(http=http, stun=stun))
                elif forced == "click":  # as a user clicks the link
                    frame.click("#a", timeout=2_000)
            time.sleep(TRY_S)
            outcomes[name] = (ran is True, received(trap), datagrams(udp_trap))
            page.close()
        context.close()
    assert outcomes == {name: (False, b"", 0) for name in ESCAPES}
    assert (popups, downloads) == ([], [])
