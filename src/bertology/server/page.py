"""The web app's own page and its Content-Security-Policy.

The page shows a view by putting the view page (the same HTML ``bertology view`` writes) into a
sandboxed ``<iframe srcdoc>``. A srcdoc document inherits its parent's policy on top of its own, so the
page's policy allows, by their SHA-256 hashes, exactly the view pages' inline script and style
(the views' script, joined from ``views/static/views/*.js``, and ``views.css``), and nothing else
inline. Everything else the page runs comes from ``/static/``; it may connect only to this server.

Every other answer has a policy too, each starting from ``default-src 'none'``: view pages
(:data:`VIEW_POLICY`), the files of the runs folder (:func:`run_file_policy`), the frame page that holds
a page of the runs folder (:mod:`bertology.server.run_frame`) and everything else (:data:`DEFAULT_POLICY`).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from bertology.report.circuit import circuit_script_hash
from bertology.views.page import CONTENT_SECURITY_POLICY, inline_code_hashes

#: Answers without a policy of their own (JSON, static files, errors): nothing may load or run.
DEFAULT_POLICY = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
#: View pages (``/api/view``, an explorer example): their own inline code and data: images, nothing loaded.
VIEW_POLICY = f"{CONTENT_SECURITY_POLICY}; frame-ancestors 'self'"


@cache
def run_file_policy() -> str:
    """The policy of the files of the runs folder (reports, watch pages, anything placed there): they run
    sandboxed without popups, downloads or top navigation, in an opaque origin (so a page found there
    cannot call this server's API as the page does); the only scripts that run are bertology's own view
    pages' inline code (by hash, as :func:`page_policy`), so a planted page runs no script of its own (no
    WebRTC, which no policy directive stops in Chromium) and a circuit's page its own
    (:func:`~bertology.report.circuit.circuit_script_hash`); they may show inline styles and data: images,
    and load or send nothing."""
    scripts = f"{inline_code_hashes()['script']} {circuit_script_hash()}"
    return (
        f"sandbox allow-scripts; default-src 'none'; script-src {scripts}; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; media-src data: blob:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
    )


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
