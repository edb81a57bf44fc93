"""A corpus file cut into byte spans that each begin a document, for reader processes to read apart.

Segments never join passages of two documents (:mod:`bertology.corpus.segments`), so the segments of a
file are the segments of its documents one after another, and a run of whole documents can be read,
segmented and encoded apart from the rest with the same result. :func:`document_spans` cuts a file into
such runs of about :data:`SPAN_BYTES` bytes, where a reader of the whole file starts a new document:

* plain text: after a blank line (:func:`~bertology.corpus.readers.text.read_paragraphs` ends a document
  at one);
* CoNLL-U / CoNLL-X: before a sentence block that opens with a ``# newdoc`` comment, after its blank line
  (:func:`~bertology.corpus.readers.treebank.read_passages`);
* JSON Lines: at any line (each line is a segment of its own).

Only blank lines of ASCII whitespace (at most :data:`_BLANK_RUN` characters) are taken as cuts, a subset of
what the readers count as blank: a cut missed makes a span longer, never wrong. A file without any cut (one
document) is one span. The file is scanned once, :data:`SCAN_BYTES` at a time, counting lines for each
span's first line number, in flat memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from bertology.corpus.readers import ByteSpan

#: About how many bytes a span holds: it ends at the first cut this many bytes after its start.
SPAN_BYTES = 1 << 20
#: Bytes read at a time while scanning for cuts.
SCAN_BYTES = 1 << 20
#: Longest run of whitespace a blank line may hold to be taken as a cut (bounds the bytes kept between
#: two reads of the scan).
_BLANK_RUN = 64
_BLANK = rb"\n[ \t\r\f\v]{0,%d}\n" % _BLANK_RUN
#: Per format, a match ends where a new document begins.
_CUTS = {
    "text": re.compile(_BLANK),
    "conllu": re.compile(_BLANK + rb"(?=#[ \t]*newdoc[ \t\r\n=])"),
    "jsonl": re.compile(rb"\n"),
}
#: Bytes a cut's match may span, kept from one read to the next.
_OVERLAP = _BLANK_RUN + 32


def document_spans(path: Path, format: str, span_bytes: int | None = None) -> Iterator[ByteSpan]:
    """The spans of the corpus file ``path`` in ``format`` (``"text"``, ``"jsonl"``, ``"conllu"``), in order:
    together every byte once, each of at least ``span_bytes`` bytes (default :data:`SPAN_BYTES`) but the
    last, each beginning a document (see the module docstring)."""
    cut = _CUTS[format]
    span_bytes = span_bytes or SPAN_BYTES
    start, first_line = 0, 1
    kept, kept_at = b"", 0  # bytes from offset ``kept_at`` not yet scanned past
    lines_before_kept = 0  # newlines in the file before ``kept_at``
    with path.open("rb") as handle:
        while data := handle.read(SCAN_BYTES):
            kept += data
            search_from = max(0, start + span_bytes - kept_at - 1)
            while (found := cut.search(kept, search_from)) is not None:
                end = kept_at + found.end()
                yield ByteSpan(start, end, first_line)
                first_line = 1 + lines_before_kept + kept.count(b"\n", 0, found.end())
                start = end
                search_from = max(found.end(), start + span_bytes - kept_at - 1)
            drop = max(0, len(kept) - _OVERLAP)
            lines_before_kept += kept.count(b"\n", 0, drop)
            kept, kept_at = kept[drop:], kept_at + drop
    if start == 0 or start < kept_at + len(kept):  # not after a cut at the very end
        yield ByteSpan(start, None, first_line)
