"""Every spelling of a run file's address: a page of the runs folder (HTML, SVG, XHTML, XML, an upper-case
``.HTML``), a training run's folder and a report's folder, asked for by a browser as a document, gets
the sandboxed frame page, a redirect to the report, or a 403/404, and never the raw markup, whether the
address ends in ``/``, ``%2f``, ``%2F``, ``;``, holds ``./``, ``%2e``, doubled slashes or another case.
The decision is made from the file that is served (its normalised name), not from how the request
spelled it. Raw requests over a socket (``http.client`` sends the path as written; an HTTP client
library would normalise ``./`` and ``//`` away), then the same in headless Chromium, where a planted
page's ``<meta http-equiv=refresh>`` to another loopback address reaches nothing."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.browser import first_request, listening_trap, received, serving

from bertology.models.loading import LoadedModel
from bertology.server import create_app

#: Written in every planted page: the raw markup was served if it appears.
MARKER = "PLANTED-MARKUP"
#: How the frame page's Content-Security-Policy starts (bertology.server.run_frame.frame_page_policy).
FRAME_POLICY = "default-src 'none'; style-src 'sha256-"
#: The planted pages of folder ``evil`` (each a document a browser runs or lets navigate).
PAGES = {
    "noscript.html": f"<!DOCTYPE html><title>{MARKER}</title>",
    "drawing.svg": f'<svg xmlns="http://www.w3.org/2000/svg"><title>{MARKER}</title></svg>',
    "page.xhtml": f'<html xmlns="http://www.w3.org/1999/xhtml"><title>{MARKER}</title></html>',
    "feed.xml": f"<?xml version='1.0'?><feed>{MARKER}</feed>",
    "SHOUT.HTML": f"<!DOCTYPE html><title>{MARKER}</title>",
}
#: What a route that serves run files serves, as its path in the runs folder: each planted page, a
#: training run's folder (its watch page) and a report's folder (a redirect to its report.html).
TARGETS = [*(f"evil/{name}" for name in PAGES), "evil/train", "evil/rep"]

#: Each spelling of ``/runs/evil/{name}`` and what a browser opening it gets: "frame" (the frame page),
#: or the status of a refusal. Case matters on the file system (Linux): another case is another name.
SPELLINGS = {
    "plain": ("/runs/evil/{name}", "frame"),
    "trailing slash": ("/runs/evil/{name}/", "frame"),
    "trailing %2f": ("/runs/evil/{name}%2f", "frame"),
    "trailing %2F": ("/runs/evil/{name}%2F", "frame"),
    "%2F between": ("/runs/evil%2F{name}", "frame"),
    "trailing ;": ("/runs/evil/{name};", 404),
    "; parameter": ("/runs/evil/{name};type=txt", 404),
    "trailing %3b": ("/runs/evil/{name}%3b", 404),
    "./ inside": ("/runs/evil/./{name}", "frame"),
    "./ first": ("/runs/./evil/{name}", "frame"),
    "trailing /.": ("/runs/evil/{name}/.", "frame"),
    "%2e inside": ("/runs/evil/%2e/{name}", "frame"),
    "double slash inside": ("/runs/evil//{name}", "frame"),
    "double slash first": ("/runs//evil/{name}", 403),
    "trailing double slash": ("/runs/evil/{name}//", "frame"),
    "double %2f": ("/runs/evil/{name}%2f%2f", "frame"),
    "encoded letter": ("/runs/evil/%{hex}{rest}", "frame"),
    "upper-case folder": ("/runs/EVIL/{name}", 404),
    "swapped-case name": ("/runs/evil/{swapped}", 404),
    "upper-case route": ("/RUNS/evil/{name}", 404),
    "trailing %00": ("/runs/evil/{name}%00", 403),
}


def spelled(spelling: str, target: str) -> str:
    """The address of ``target`` (a path in the runs folder, ``evil/NAME``) as ``spelling`` writes it."""
    name = target.removeprefix("evil/")
    return SPELLINGS[spelling][0].format(
        name=name, swapped=name.swapcase(), hex=f"{ord(name[0]):02x}", rest=name[1:]
    )


def plant(runs: Path, refresh_to: str = "") -> None:
    """The planted pages (each with a meta refresh to ``refresh_to`` when given), a training run and a
    report folder whose report is planted markup too, all in folder ``evil``."""
    evil = runs / "evil"
    evil.mkdir(parents=True)
    refresh = f'<meta http-equiv="refresh" content="0; url={refresh_to}">' if refresh_to else ""
    for name, text in PAGES.items():
        (evil / name).write_text(text.replace("<title>", f"{refresh}<title>", 1), encoding="utf-8")
    (evil / "train").mkdir()
    (evil / "train" / "run.json").write_text('{"steps": 3}')
    (evil / "rep").mkdir()
    (evil / "rep" / "report.html").write_text(PAGES["noscript.html"], encoding="utf-8")


@pytest.fixture(scope="module")
def base(default_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tmp_path_factory.mktemp("spellings") / "runs"
    plant(runs)
    with serving(create_app([default_model], runs=runs)) as url:
        yield url


def opened_as_document(base: str, address: str) -> tuple[int, dict[str, str], str]:
    """What a browser opening ``address`` (sent exactly as written) gets: status, headers, body."""
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.request("GET", address, headers={"Sec-Fetch-Dest": "document"})
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_no_spelling_of_a_run_file_gets_its_raw_markup(base: str, spelling: str, target: str) -> None:
    address = spelled(spelling, target)
    status, headers, body = opened_as_document(base, address)
    if status == 307:  # a report's folder, whatever the spelling: to its report, by its one name
        assert target == "evil/rep" and headers["location"] == "/runs/evil/rep/report.html"
        address = headers["location"]
        status, headers, body = opened_as_document(base, address)
    assert MARKER not in body, (address, status)
    expected = SPELLINGS[spelling][1]
    if expected == "frame":
        assert status == 200, (address, body)
        assert headers["content-security-policy"].startswith(FRAME_POLICY)
        assert f'<iframe src="{address}" sandbox="allow-scripts"' in body
    else:
        assert status == expected, (address, body)
        assert headers["content-type"] == "application/json"


# --- In Chromium ----------------------------------------------------------------------------------------

#: A planted page a meta refresh works in, and the report reached through its folder's redirect.
REFRESHING = ["evil/noscript.html", "evil/rep"]
WAIT_S = 30.0


@pytest.fixture
def traps() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Two listening sockets on another loopback address: the planted pages' target, and a control one
    that an unsandboxed page refreshes to."""
    with listening_trap() as trap, listening_trap() as control:
        yield trap, control


@pytest.mark.browser
@pytest.mark.slow
def test_no_spelling_opened_in_chromium_lets_a_planted_page_navigate_elsewhere(
    chromium_browser: object,
    default_model: LoadedModel,
    tmp_path: Path,
    traps: tuple[socket.socket, socket.socket],
) -> None:
    """Each spelling of a refreshing page and of a report's folder in a tab of its own, all in one
    browser: every tab holds the frame page (or a refusal), and the pages' ``<meta http-equiv=refresh>``
    to 127.0.0.2 sends nothing there. Then a control page, unsandboxed, refreshes to the control
    listener: once that request arrives, the browser has run the refreshes of the pages opened before
    it. (Chromium itself rewrites ``./``, ``/.`` and ``%2e`` out of an address before sending it.)"""
    trap, control = traps
    plant(tmp_path / "runs", refresh_to="http://{}:{}/refresh".format(*trap.getsockname()))
    tabs: dict[tuple[str, str], Any] = {}
    with serving(create_app([default_model], runs=tmp_path / "runs")) as url:
        context = chromium_browser.new_context()  # type: ignore[attr-defined]
        answers = {}
        for target in REFRESHING:
            for spelling in SPELLINGS:
                tabs[spelling, target] = context.new_page()
                answers[spelling, target] = tabs[spelling, target].goto(
                    url + spelled(spelling, target), wait_until="commit"
                )  # the document's answer (after a redirect); all tabs load at once
        got = {}
        for tab, page in tabs.items():
            answer = answers[tab]
            policy = answer.headers.get("content-security-policy", "")
            got[tab] = "frame" if policy.startswith(FRAME_POLICY) else answer.status
            if got[tab] == "frame":  # its frame loaded: the page in it has had its refresh
                page.wait_for_selector("iframe[sandbox='allow-scripts']", timeout=WAIT_S * 1000)
                page.main_frame.child_frames[0].wait_for_load_state(timeout=WAIT_S * 1000)
        refresh = '<meta http-equiv="refresh" content="0; url=http://{}:{}/control">'
        context.new_page().set_content(refresh.format(*control.getsockname()))
        assert first_request(control, WAIT_S).startswith(b"GET /control ")
        sent = received(trap)
        context.close()
    assert sent == b""
    assert got == {(spelling, target): SPELLINGS[spelling][1] for spelling, target in tabs}
