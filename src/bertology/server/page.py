"""The web app's own page and its Content-Security-Policy.

The page shows a view by putting the view page (the same HTML ``bertology view`` writes) into a
sandboxed ``<iframe srcdoc>``. A srcdoc document inherits its parent's policy on top of its own, so the
page's policy allows, by their SHA-256 hashes, exactly the view pages' inline script and style
(``views.js`` and ``views.css``), and nothing else inline. Everything else the page runs comes from
``/static/``; it may connect only to this server.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files

from bertology.views.page import render_page

_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def _hash(source: str) -> str:
    return (
        "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode("ascii") + "'"
    )


@cache
def page_policy() -> str:
    """The page's Content-Security-Policy header value."""
    inline = _INLINE.findall(render_page({}, ""))
    scripts = " ".join(_hash(source) for tag, source in inline if tag == "script")
    styles = " ".join(_hash(source) for tag, source in inline if tag == "style")
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
