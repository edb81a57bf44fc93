"""Helpers for the browser tests: render a view page, open it in Chromium, and look at what it drew."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.server.serve import bind, make_server, url_of
from bertology.views.page import render_page

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The web ``app`` served on a free loopback port in a thread for the block: yields its base URL once
    the server has started, and stops it afterwards."""
    sock = bind("127.0.0.1", 0)
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(10)


@contextmanager
def listening_trap() -> Iterator[socket.socket]:
    """A non-blocking listening TCP socket on another loopback address (127.0.0.2), for the block: whatever
    a planted page sends it waits in the kernel's backlog, whether or not the browser reports it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen(256)
        listener.setblocking(False)
        yield listener


def received(listener: socket.socket) -> bytes:
    """Every byte already sent to the (non-blocking) ``listener`` over the connections waiting in its
    backlog (accepted and closed here). Chromium may open a connection ahead of a navigation it then
    refuses, sending nothing on it."""
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


def first_request(listener: socket.socket, timeout_s: float) -> bytes:
    """The first bytes sent on any connection to ``listener`` within ``timeout_s`` (Chromium may open a
    connection ahead of a navigation and send nothing on it).

    Raises:
        AssertionError: nothing was sent in time.
    """
    deadline, connections = time.monotonic() + timeout_s, []
    try:
        while (left := deadline - time.monotonic()) > 0:
            for ready in select.select([listener, *connections], [], [], left)[0]:
                if ready is listener:
                    connections.append(listener.accept()[0])
                elif data := ready.recv(65536):
                    return data
                else:
                    connections.remove(ready)  # closed unused
                    ready.close()
        raise AssertionError("nothing reached the listener in time")
    finally:
        for connection in connections:
            connection.close()


READY = "() => window.bertology && (window.bertology.ready || window.bertology.error !== null)"

# Pixels that differ from the canvas's most common pixel (its background: transparent for the line and
# vector canvases, the empty-cell colour for thumbnails).
_INK_JS = """(selector) => {
  const canvas = document.querySelector(selector);
  const image = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  const pixels = new Uint32Array(image.data.buffer);
  const counts = new Map();
  for (const p of pixels) counts.set(p, (counts.get(p) || 0) + 1);
  let background = 0;
  let most = -1;
  for (const [p, c] of counts) if (c > most) { most = c; background = p; }
  return pixels.length - most;
}"""


def write_page(directory: Path, data: dict[str, Any], name: str = "view") -> Path:
    path = directory / f"{name}.html"
    path.write_text(render_page(data, f"bertology {name}"), encoding="utf-8")
    return path


@dataclass
class ViewPage:
    """An opened view page plus everything it asked the outside world for."""

    page: Any
    url: str
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def wait_ready(self, timeout_ms: float = 10_000) -> None:
        self.page.wait_for_function(READY, timeout=timeout_ms)
        error = self.page.evaluate("window.bertology.error")
        assert error is None, f"the page reported: {error}"
        assert self.page.evaluate("document.body.dataset.ready") == "1"

    def js(self, expression: str, arg: Any = None) -> Any:
        return self.page.evaluate(expression, arg)

    def state(self) -> dict[str, Any]:
        return self.js("window.bertology.state()")

    def ink(self, selector: str = "#bt-canvas") -> int:
        """Number of pixels of the canvas that are not its background."""
        return self.js(_INK_JS, selector)

    def picture(self, selector: str = "#bt-canvas") -> str:
        """A digest of the canvas pixels, to tell whether the picture changed."""
        data_url = self.js("(s) => document.querySelector(s).toDataURL()", selector)
        return hashlib.sha256(data_url.encode()).hexdigest()

    def png_from_data_url(self) -> bytes:
        data_url = self.js("window.bertology.pngDataUrl()")
        prefix = "data:image/png;base64,"
        assert data_url.startswith(prefix)
        return base64.b64decode(data_url[len(prefix) :])

    def move_mouse_away(self) -> None:
        self.page.mouse.move(1, 1)

    def foreign_requests(self) -> list[str]:
        return [url for url in self.requests if url != self.url and not url.startswith(("data:", "blob:"))]

    def assert_clean(self) -> None:
        """No dialog fired, no script error or CSP violation, no request left the page."""
        assert self.dialogs == []
        assert self.errors == []
        assert self.foreign_requests() == []


def open_view(context: Any, path: Path, *, wait: bool = True, timeout_ms: float = 10_000) -> ViewPage:
    page = context.new_page()
    view = ViewPage(page=page, url=path.as_uri())
    page.on("request", lambda request: view.requests.append(request.url))
    page.on("dialog", lambda dialog: (view.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: view.errors.append(f"page error: {error}"))
    page.on("console", lambda msg: msg.type == "error" and view.errors.append(f"console: {msg.text}"))
    page.goto(view.url)
    if wait:
        view.wait_ready(timeout_ms)
    return view


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert png.startswith(PNG_SIGNATURE)
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
