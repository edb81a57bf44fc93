"""CoNLL-U treebanks read as running text: the words of each sentence, documents split at ``# newdoc``.

Multiword-token ranges (``1-2``) and empty nodes (``3.1``) are skipped, so the words are the syntactic
words of the sentence. A sentence is read by splitting its lines at tabs and taking the forms, the one
column a corpus needs: its ID and head are checked as the ``conllu`` package checks them, the other
columns are not parsed (a full parse of every column was nine tenths of the time of reading a treebank as
a corpus). A sentence with any line outside that plain shape (not ten columns, spaces around it, a run of
spaces, an ID or head of another form) and every comment line are read by the ``conllu`` package, which
gives the same words, or the error naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from itertools import takewhile
from pathlib import Path

import conllu
from conllu.exceptions import ParseException

from bertology.errors import BertologyError
from bertology.readers import Passage, read_lines

Block = list[tuple[int, str]]


def sentence_blocks(path: Path) -> Iterator[Block]:
    """Runs of consecutive non-blank ``(line number, line)`` pairs: one sentence with its comments.

    CoNLL-U and CoNLL-X both separate sentences by blank lines.
    """
    block: Block = []
    for number, line in read_lines(path):
        if line.strip():
            block.append((number, line))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _invalid(path: Path, number: int, problem: str) -> BertologyError:
    return BertologyError(f"{path.name} line {number} is not valid CoNLL-U ({problem.rstrip('.')}).")


def _parse(block: Block, path: Path) -> conllu.TokenList:
    """Parse one sentence block with the ``conllu`` package, naming the offending line on failure."""
    try:
        sentence = conllu.parse_token_and_metadata("\n".join(line for _, line in block))
    except ParseException as error:
        for number, line in block:  # find the line the package rejects on its own
            try:
                conllu.parse_token_and_metadata(line)
            except ParseException as line_error:
                raise _invalid(path, number, str(line_error)) from line_error
        raise _invalid(path, block[0][0], str(error)) from error
    token_lines = [number for number, line in block if not line.lstrip().startswith("#")]
    for token, number in zip(sentence, token_lines, strict=True):
        if token["id"] is None:
            raise _invalid(path, number, "the word has no ID")
    return sentence


def _starts_document(metadata: Mapping[str, object]) -> bool:
    return any(key == "newdoc" or key.startswith("newdoc ") for key in metadata)


#: A word's ID (``conllu``'s ``ID_SINGLE``), and the IDs of a multiword-token range or an empty node.
_WORD_ID = re.compile(r"0|[1-9][0-9]*")
_NOT_A_WORD = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)|[0-9]+\.[1-9][0-9]*")
_COLUMNS, _HEAD = 10, 6


def _plain_words(block: Block) -> list[str] | None:
    """The words of a sentence block whose token lines all have the plain shape (see the module
    docstring), ``None`` for any other block."""
    words = []
    for _, line in block:
        if line.startswith("#") or line != line.strip() or "  " in line:
            return None
        columns = line.split("\t")
        head = columns[_HEAD] if len(columns) == _COLUMNS else ""
        if not (head == "_" or (head.isascii() and head.isdigit())):
            return None
        if _WORD_ID.fullmatch(columns[0]):
            words.append(columns[1])
        elif not (skipped := _NOT_A_WORD.fullmatch(columns[0])) or (
            skipped.group(1) is not None and int(skipped.group(2)) < int(skipped.group(1))
        ):
            return None
    return words


def read_sentences(path: Path) -> Iterator[Passage]:
    """Yield the words of each sentence of ``path`` (sentences without words are skipped).

    A ``# newdoc`` comment (with or without an id) starts a new document.

    Raises:
        BertologyError: a line the ``conllu`` package cannot parse (naming the file and line).
    """
    document = 0
    for block in sentence_blocks(path):
        lead = sum(1 for _ in takewhile(lambda entry: entry[1].startswith("#"), block))
        comments, tokens = block[:lead], block[lead:]  # a comment among the words: a full parse below
        words = _plain_words(tokens)
        if words is None:
            sentence = _parse(block, path)
            document += _starts_document(sentence.metadata)
            words = [token["form"] for token in sentence if isinstance(token["id"], int)]
        elif any("newdoc" in line for _, line in comments):
            document += _starts_document(_parse(comments, path).metadata)
        if words:
            yield Passage(words, document, block[0][0], block[-1][0])
