"""Readers: turn corpus and treebank files into plain records, streaming them line by line.

Every reader decodes its file one line at a time (strict UTF-8, so a bad byte is reported with its line
number) and keeps only the record it is building, so files of any size can be read in flat memory. A
file with a NUL byte is reported as binary, and a file or folder that gives no record at all (an empty
file, a file of another kind) is reported as such, in the reader's terms (:func:`require_records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bertology.errors import BertologyError

_BOM = "\ufeff"
Record = TypeVar("Record")


@dataclass(frozen=True)
class Passage:
    """One unit of running text read from a corpus file.

    text: a paragraph (plain text) or the words of a sentence (CoNLL-U).
    document: index of the document the passage belongs to; consecutive passages with the same
        index are in the same document.
    first_line, last_line: 1-based line numbers of the passage in its file (inclusive).
    """

    text: str | list[str]
    document: int
    first_line: int
    last_line: int


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` for each line of ``path``, lazily, without the line ending.

    Line numbers are 1-based. A UTF-8 byte order mark at the start of the file is dropped.

    Raises:
        BertologyError: the path is a folder or cannot be opened, the file is binary (a NUL byte), or a
            line is not valid UTF-8 (naming the line).
    """
    if path.is_dir():
        raise BertologyError(f"{path} is a folder, where a file was expected.")
    try:
        handle = path.open("rb")
    except OSError as error:
        raise BertologyError(f"Could not open {path}: {error.strerror}.") from error
    with handle:
        for number, raw in enumerate(handle, start=1):
            if b"\0" in raw:
                raise BertologyError(
                    f"{path.name} is a binary file, not text (line {number} has a NUL byte); "
                    "give a UTF-8 text file."
                )
            try:
                line = raw.decode("utf-8", errors="strict")
            except UnicodeDecodeError as error:
                raise BertologyError(
                    f"{path.name} line {number} is not valid UTF-8 (byte {error.start + 1} of the line); "
                    "save the file as UTF-8 text."
                ) from error
            if number == 1:
                line = line.removeprefix(_BOM)
            yield number, line.rstrip("\r\n")


def corpus_files(path: str | Path, suffixes: set[str]) -> list[Path]:
    """``path`` itself, or the files of folder ``path`` whose extension is in ``suffixes`` (lower case,
    with the dot), in sorted name order, so a folder's README, LICENSE and hidden files are left out.

    Raises:
        BertologyError: ``path`` is a folder without such files.
    """
    path = Path(path)
    if not path.is_dir():
        return [path]
    files = sorted(
        child
        for child in path.iterdir()
        if child.is_file() and not child.name.startswith(".") and child.suffix.lower() in suffixes
    )
    if not files:
        raise BertologyError(f"The folder {path} has no {' / '.join(sorted(suffixes))} files to read.")
    return files


def require_records(records: Iterable[Record], path: str | Path, what: str) -> Iterator[Record]:
    """Pass ``records`` (read from ``path``) through; if there were none, raise at the end.

    what: the records' name in the user's terms, plural (``"sentences"``, ``"GAP examples"``).

    Raises:
        BertologyError: ``path`` gave no record: "<path> is empty ..." for a file of 0 bytes, else
            "<path> has no <what>." (a folder: "The files of <path> have no <what>.").
    """
    empty = True
    for record in records:
        empty = False
        yield record
    if empty:
        raise BertologyError(_no_records(Path(path), what))


def _no_records(path: Path, what: str) -> str:
    if path.is_dir():
        return f"The files of {path} have no {what}."
    if path.is_file() and path.stat().st_size == 0:
        return f"{path} is empty; it has no {what}."
    return f"{path} has no {what}."
