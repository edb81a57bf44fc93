"""Plain-text corpora: one paragraph per line, blank lines between documents.

A line longer than :data:`PIECE_BYTES` is read in pieces, each a paragraph of its own (cut at the last
space or tab within each :data:`PIECE_BYTES` bytes; :func:`~bertology.corpus.readers.read_lines`), so a corpus
that is one huge line streams in flat memory and a limit stops the reading early (a piece holds more
tokens than a segment of the usual lengths, so it still fills its segment).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bertology.corpus.readers import ByteSpan, Passage, read_lines

#: Longest line read whole, in bytes; a longer one is read as paragraphs of at most this many bytes.
PIECE_BYTES = 65_536


def read_paragraphs(path: Path, span: ByteSpan | None = None) -> Iterator[Passage]:
    """Yield each non-blank line of ``path`` (of its ``span``, if given) as a paragraph (stripped of
    surrounding whitespace), a line longer than :data:`PIECE_BYTES` as several (see the module docstring),
    each with its line's number.

    One or more blank (or whitespace-only) lines end a document; documents are numbered from 0 (in the
    span).
    """
    document = 0
    document_has_text = False
    for number, line in read_lines(path, piece_bytes=PIECE_BYTES, span=span):
        paragraph = line.strip()
        if not paragraph:
            if document_has_text:
                document += 1
                document_has_text = False
            continue
        document_has_text = True
        yield Passage(paragraph, document, number, number)
