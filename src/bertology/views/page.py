"""Assemble one self-contained HTML page: template + inlined CSS and JS + the view data, once.

The JS is the view pages' script, joined from the modules of ``static/views/`` (:data:`SCRIPT_MODULES`).
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
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


#: The modules of the view pages' script, in ``static/views/``, in the order the page joins them. They are
#: plain scripts (no ES modules, nothing to bundle) that share one function scope once joined:
#: ``contract.js`` opens it and ``boot.js`` closes it. What a module computes as it runs (a constant,
#: a class's parent) may use only the names of the modules before it (code inside functions runs later,
#: from ``boot.js``'s ``main()``), so the shared concerns come first (constants, utilities, decoding,
#: colours, drawing, tokens, controls), then each view, then the page's start. Each module starts with a
#: note, its leading ``//`` lines (its job and the other modules' names it uses), which the page leaves
#: out; the rest of each module is joined byte for byte.
SCRIPT_MODULES: tuple[str, ...] = (
    "contract.js",
    "util.js",
    "decode.js",
    "colours.js",
    "canvas.js",
    "lines.js",
    "tokens.js",
    "line-panel.js",
    "controls.js",
    "head.js",
    "model.js",
    "neuron.js",
    "watch.js",
    "sets.js",
    "boot.js",
)


@cache
def _static(*path: str) -> str:
    return files("bertology.views").joinpath("static", *path).read_text(encoding="utf-8")


def _without_note(module: str) -> str:
    """A script module without its note (its leading lines that start with ``//``)."""
    lines = module.splitlines(keepends=True)
    return "".join(itertools.dropwhile(lambda line: line.startswith("//"), lines))


@cache
def view_script() -> str:
    """The view pages' script: the modules of :data:`SCRIPT_MODULES` in order, each without its note."""
    return "".join(_without_note(_static("views", name)) for name in SCRIPT_MODULES)


_INLINE_CODE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@cache
def inline_code_hashes() -> dict[str, str]:
    """CSP sources that allow exactly a view page's inline code, by SHA-256 hash: ``{"script": ...,
    "style": ...}``. Every view page inlines the same script (:func:`view_script`) and ``views.css`` (its
    data travels in a ``type="application/json"`` block, which is not code), so a page that embeds view
    pages in ``srcdoc`` iframes (they inherit its policy) can allow them and nothing else inline."""
    sources: dict[str, list[str]] = {"script": [], "style": []}
    for tag, code in _INLINE_CODE.findall(render_page({}, "")):
        digest = base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode("ascii")
        sources[tag].append(f"'sha256-{digest}'")
    return {tag: " ".join(hashes) for tag, hashes in sources.items()}


def render_page(data: dict[str, Any], title: str) -> str:
    """Return the page for ``data`` (the view description read by the script, :func:`view_script`)."""
    parts = {
        "csp": CONTENT_SECURITY_POLICY,
        "title": html.escape(title),
        "css": _static("views.css"),
        "js": view_script(),
        "data": script_json(data),
    }
    # One pass, so text inside a substituted part is never taken for a marker.
    return _MARKER.sub(lambda match: parts[match.group(1)], _static("template.html"))
