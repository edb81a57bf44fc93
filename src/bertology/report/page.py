"""The shell of the self-contained HTML reports: Jinja2 templates (``report/templates/``) with autoescape.

Every piece of a page comes from a template: ``page.html.j2`` is the document (title, header, table of
contents, sections) and ``blocks.html.j2`` holds the pieces (paragraphs, tables, figures, term lists,
links); the functions here fill them in. Autoescape is on, so every plain ``str`` (a model name, a
corpus path, token text) is inserted as text by MarkupSafe, and only :class:`~markupsafe.Markup` (the
output of a template, or a docstring rendered by :func:`docstring_html`) is inserted as HTML. A page
loads nothing: figures are PNG data URIs, the style sheet (``report.css``) is inline, there is no
script, and the Content-Security-Policy forbids everything else. Links must be relative (files written
next to the report, or ``#section`` anchors). Light and dark colours follow ``prefers-color-scheme``.
"""

from __future__ import annotations

import base64
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup

from bertology.errors import BertologyError

if TYPE_CHECKING:
    import pandas as pd

#: Nothing may load but inline style and ``data:`` images; no script, base URL or form target.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)

#: How a missing number (NaN) is shown in tables.
MISSING = "–"

#: The report templates, HTML-escaping every value they insert.
ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("bertology.report", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

_SCHEME = re.compile(r"^\s*([a-zA-Z][a-zA-Z0-9+.-]*:|//|\\\\)")
#: A Sphinx cross-reference, ``:func:`~a.b``` or ``:class:`a.b```.
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
#: An RST literal-block marker ending a line (``text::``).
_LITERAL_BLOCK = re.compile(r"::$", re.MULTILINE)


def render(template: str, **context: Any) -> str:
    """The template ``template`` of ``report/templates/`` filled with ``context``."""
    return ENVIRONMENT.get_template(template).render(**context)


@cache
def _blocks() -> Any:
    """The macros of ``blocks.html.j2``."""
    return ENVIRONMENT.get_template("blocks.html.j2").module


@cache
def _markdown() -> MarkdownIt:
    """CommonMark without raw HTML: any ``<`` in the text comes out escaped."""
    return MarkdownIt("commonmark", {"html": False})


def docstring_html(text: str) -> Markup:
    """A docstring (reStructuredText as written in this package) as HTML, rendered as CommonMark by
    markdown-it-py with raw HTML off: paragraphs, ````literals```` as ``<code>``, indented blocks as
    code. Sphinx cross-references become literals first (``:func:`~a.b``` shows ``b``, ``:func:`a.b```
    shows ``a.b``) and a literal-block ``::`` a colon."""

    def reference(match: re.Match[str]) -> str:
        target = match.group(2)
        return f"``{target.rsplit('.', 1)[-1] if match.group(1) else target}``"

    source = _LITERAL_BLOCK.sub(":", _ROLE.sub(reference, text))
    return Markup(_markdown().render(source))


def check_relative(href: str) -> str:
    """``href`` if it is a relative URL (a path or ``#anchor``) else :class:`BertologyError`."""
    if _SCHEME.match(href):
        raise BertologyError(f"Report links must be relative (a file next to the report), not {href!r}.")
    return href


def paragraph(text: str, *, class_: str | None = None) -> Markup:
    """One ``<p>`` (``class_``: its CSS class, e.g. ``"muted"``)."""
    return Markup(_blocks().paragraph(text, class_))


def model_note(model_name: str) -> list[Markup]:
    """The warning paragraph a report of the model ``model_name`` opens with, saying what a user should
    know about it (a quantised file's caveat, :func:`bertology.models.model_store.model_note`); none for
    a model without a note."""
    from bertology.models.model_store import model_note as note_of

    note = note_of(model_name)
    return [paragraph(f"Note: {note}.", class_="warning")] if note else []


def heading(text: str) -> Markup:
    """A ``<h3>`` within a section."""
    return Markup(_blocks().heading(text))


def link(href: str, text: str) -> Markup:
    """``<a>`` to a relative ``href`` (see :func:`check_relative`)."""
    return Markup(_blocks().link(check_relative(href), text))


def quotation(label: str, text: str) -> Markup:
    """A paragraph: ``label`` then ``text`` in quotation marks (``<q>``)."""
    return Markup(_blocks().quotation(label, text))


def coloured_tokens(tokens: Sequence[tuple[str, str, str]]) -> Markup:
    """A paragraph of ``(text, CSS style, hover title)`` spans, one per token, separated by spaces."""
    return Markup(_blocks().coloured_tokens(tokens))


def value_text(value: object, float_format: str = "{:.4g}") -> Markup | str:
    """A value as text: Markup as is, ``None`` and NaN as :data:`MISSING`, other non-integer numbers with
    ``float_format``, anything else as ``str``."""
    if isinstance(value, Markup):
        return value
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return MISSING
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return float_format.format(value)
    return str(value)


def definitions(items: Mapping[str, object]) -> Markup:
    """A term / value list (``<dl>``), e.g. a report's metadata, in the mapping's order."""
    return Markup(_blocks().definitions([(str(term), value_text(value)) for term, value in items.items()]))


def table(
    frame: pd.DataFrame,
    *,
    float_format: str = "{:.3f}",
    markup: Mapping[str, Sequence[Markup]] | None = None,
    caption: str | None = None,
    id_: str | None = None,
) -> Markup:
    """An HTML table of ``frame``'s columns (the index is not shown), in a scrolling box.

    float_format: for float cells (NaN shows as :data:`MISSING`); numeric columns are right-aligned.
    markup: column -> one Markup per row shown instead of the frame's values (e.g. :func:`link` cells).
    """
    from pandas.api.types import is_numeric_dtype

    markup = markup or {}
    numeric = [is_numeric_dtype(frame[name]) and name not in markup for name in frame.columns]
    columns = [(str(name), right) for name, right in zip(frame.columns, numeric, strict=True)]
    rows = [
        [
            (markup[name][row], False)
            if name in markup
            else (value_text(frame[name].iloc[row], float_format), right)
            for name, right in zip(frame.columns, numeric, strict=True)
        ]
        for row in range(len(frame))
    ]
    return Markup(_blocks().table(columns, rows, caption, id_))


def figure(png: bytes, *, alt: str, caption: str | None = None, width: int | None = None) -> Markup:
    """A PNG embedded as a ``data:`` URI, with an optional caption; ``width`` in CSS pixels."""
    source = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return Markup(_blocks().figure(source, alt, caption, width))


@dataclass
class Section:
    """One ``<section>`` of a page, listed in its table of contents; ``id`` is its anchor."""

    title: str
    id: str
    blocks: Sequence[Markup] = field(default_factory=list)


def render_page(title: str, sections: Sequence[Section], *, header: Sequence[Markup] = ()) -> str:
    """A whole HTML document: ``title`` as ``<title>`` and ``<h1>``, ``header`` blocks under it, a table of
    contents, then the sections."""
    return render(
        "page.html.j2", title=title, sections=sections, header=header, policy=CONTENT_SECURITY_POLICY
    )
