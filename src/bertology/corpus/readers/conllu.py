"""CoNLL-U and CoNLL-X files as blocks of lines: one sentence with its comments per block.

The sentences are read, checked and turned into trees (or, for a corpus, into running text) by
:mod:`bertology.corpus.readers.treebank`; the coreference readers take the same blocks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bertology.corpus.readers import ByteSpan, read_lines

Block = list[tuple[int, str]]


def sentence_blocks(path: Path, span: ByteSpan | None = None) -> Iterator[Block]:
    """Runs of consecutive non-blank ``(line number, line)`` pairs of ``path`` (of its ``span``, if given):
    one sentence with its comments.

    CoNLL-U and CoNLL-X both separate sentences by blank lines.
    """
    block: Block = []
    for number, line in read_lines(path, span=span):
        if line.strip():
            block.append((number, line))
        elif block:
            yield block
            block = []
    if block:
        yield block
