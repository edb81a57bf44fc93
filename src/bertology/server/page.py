"""The web app's own page and its Content-Security-Policy.

The page shows a view by putting the view page (the same HTML ``bertology view`` writes) into a
sandboxed ``<iframe srcdoc>``. A srcdoc document inherits its parent's policy on top of its own, so the
page's policy allows, by their SHA-256 hashes, exactly the view pages' inline script and style
(``views.js`` and ``views.css``), and nothing else inline. Everything else the page runs comes from
``/static/``; it may connect only to this server.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from bertology.views.page import inline_code_hashes


@cache
def page_policy() -> str:
    """The page's Content-Security-Policy header value."""
    hashes = inline_code_hashes()
    scripts, styles = hashes["script"], hashes["style"]
    return (
        f"default-src 'none'; script-src 'self' {scripts}; style-src 'self' {styles}; "
        "img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    )


def static_folder() -> str:
    """Folder of the page's own HTML, JavaScript and CSS."""
    return str(files("bertology.server").joinpath("static"))


@cache
def index_html() -> str:
    return files("bertology.server").joinpath("static", "index.html").read_text(encoding="utf-8")


@cache
def explore_html() -> str:
    """The explorer page of an analysis folder (``/explore?run=PATH``)."""
    return files("bertology.server").joinpath("static", "explore.html").read_text(encoding="utf-8")
