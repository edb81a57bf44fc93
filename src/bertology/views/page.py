"""Assemble one self-contained HTML page: template + inlined CSS and JS + the view data, once."""

from __future__ import annotations

import base64
import hashlib
import html
import re
from functools import cache
from importlib.resources import files
from typing import Any

from bertology.views.payload import script_json

# The page may run its own inline script and style and show data:/blob: images (PNG export);
# it may not load or send anything: no CDN, no fonts, no fetch.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data: blob:; base-uri 'none'; form-action 'none'"
)


_MARKER = re.compile(r"\{\{(csp|title|css|js|data)\}\}")


@cache
def _static(name: str) -> str:
    return files("bertology.views").joinpath("static", name).read_text(encoding="utf-8")


_INLINE_CODE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@cache
def inline_code_hashes() -> dict[str, str]:
    """CSP sources that allow exactly a view page's inline code, by SHA-256 hash: ``{"script": ...,
    "style": ...}``. Every view page inlines the same ``views.js`` and ``views.css`` (its data travels in
    a ``type="application/json"`` block, which is not code), so a page that embeds view pages in
    ``srcdoc`` iframes (they inherit its policy) can allow them and nothing else inline."""
    sources: dict[str, list[str]] = {"script": [], "style": []}
    for tag, code in _INLINE_CODE.findall(render_page({}, "")):
        digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
        sources[tag].append(f"'sha256-{digest}'")
    return {tag: " ".join(hashes) for tag, hashes in sources.items()}


def render_page(data: dict[str, Any], title: str) -> str:
    """Return the page for ``data`` (the view description read by ``static/views.js``)."""
    parts = {
        "csp": CONTENT_SECURITY_POLICY,
        "title": html.escape(title),
        "css": _static("views.css"),
        "js": _static("views.js"),
        "data": script_json(data),
    }
    # One pass, so text inside a substituted part is never taken for a marker.
    return _MARKER.sub(lambda match: parts[match.group(1)], _static("template.html"))
