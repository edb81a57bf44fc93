"""A page of the runs folder shown only inside a sandboxed frame of the server's own page.

A browser that opens a page of the runs folder (HTML, SVG or XML, which can navigate) at its address
gets the frame page instead: a bar with the file's name and an "open in a new tab" link, and the file
in an ``<iframe sandbox="allow-scripts">`` (no popups, top navigation, downloads, forms, and no
``allow-same-origin``). The frame page's policy allows frames only from this server (``frame-src
'self'``), which Chromium checks on every navigation of the frame, so whatever the file does
(``location.href=``, ``<meta http-equiv=refresh>``, a link clicked) reaches nothing but this server;
the file's own policy (:func:`bertology.server.page.run_file_policy`) runs no script but bertology's.

Which answer a request gets depends on its ``Sec-Fetch-Dest`` header (Fetch Metadata, sent by every
current browser): ``document`` (the address opened) gets the frame page, ``iframe`` (the frame page's
frame, or the frame following one of the file's own links) the file, anything else (an ``<embed>``,
``<object>``, a worker...) a 403. A client that sends no such header (curl, a script) is no browser
and gets the file, still under its sandboxing policy.
"""

from __future__ import annotations

import base64
import hashlib
import html
from functools import cache
from typing import BinaryIO
from urllib.parse import quote, unquote

from fastapi import Request
from fastapi.responses import HTMLResponse

from bertology.server.errors import RequestError
from bertology.server.opened_file import served_type

#: Content types a browser shows as a document that can run script or navigate.
MARKUP_TYPES = frozenset(
    {"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml"}
)

_STYLE = (
    "html,body{height:100%;margin:0}body{display:flex;flex-direction:column;font:14px system-ui,"
    "sans-serif;color-scheme:light dark}header{padding:4px 8px;border-bottom:1px solid #8884}"
    "iframe{flex:1;border:0;width:100%}"
)

_FRAME_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>{name} · bertology</title><style>{style}</style></head>
<body><header><strong>{name}</strong>: shown in a sandboxed frame, which cannot open windows, \
download, or load or send anything elsewhere; its links open in this frame.
<a href="{url}" target="_blank" rel="noopener noreferrer">Open in a new tab</a></header>
<iframe src="{url}" sandbox="allow-scripts" title="{name}"></iframe></body></html>"""


@cache
def frame_page_policy() -> str:
    """The frame page's Content-Security-Policy: its own style (by hash), frames from this server only,
    no script, nothing else loaded, never framed itself."""
    digest = base64.b64encode(hashlib.sha256(_STYLE.encode("utf-8")).digest()).decode("ascii")
    return (
        f"default-src 'none'; style-src 'sha256-{digest}'; frame-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )


def is_markup(file: BinaryIO) -> bool:
    """Whether ``file`` (opened from the runs folder) is served as a document that can run script or
    navigate: decided from the type it is served with (:func:`~bertology.server.opened_file.served_type`,
    from the name it was opened under), never from the request's spelling of its path (``page.html/``,
    ``page.html%2f`` or ``./page.html`` open the same file)."""
    return served_type(file) in MARKUP_TYPES


def needs_frame(request: Request) -> bool:
    """Whether a request for a page of the runs folder must not have the page itself (see the module's
    docstring): a browser's, other than the frame's."""
    return request.headers.get("sec-fetch-dest") not in (None, "iframe")


def frame_page(request: Request) -> HTMLResponse:
    """The frame page holding the page that ``request`` (a browser's, opening its address) asks for.

    Raises:
        RequestError: 403, a request for the page as something other than a document or a frame.
    """
    if request.headers.get("sec-fetch-dest") != "document":
        raise RequestError(
            403, "A page of the runs folder is shown only in its sandboxed frame; open its address instead."
        )
    raw = request.scope.get("raw_path")  # the address as the browser sent it, still percent-encoded
    url = raw.decode("latin-1") if raw else quote(request.url.path)
    name = unquote(url.rstrip("/").rsplit("/", 1)[-1]) or "runs"
    page = _FRAME_PAGE.format(name=html.escape(name), url=html.escape(url), style=_STYLE)
    headers = {"Content-Security-Policy": frame_page_policy(), "Vary": "Sec-Fetch-Dest"}
    return HTMLResponse(page, headers=headers)
