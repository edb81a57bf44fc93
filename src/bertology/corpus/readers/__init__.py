"""Readers: turn corpus and treebank files into plain records, streaming them line by line.

Every reader decodes its file one line at a time (strict UTF-8, so a bad byte is reported with its line
number) and keeps only the record it is building, so files of any size can be read in flat memory. A
file with a NUL byte is reported as binary, and a file or folder that gives no record at all (an empty
file, a file of another kind) is reported as such, in the reader's terms (:func:`require_records`).

Imports only ``bertology.errors``: the readers give plain records, which the rest of the corpus package
turns into segments and encodings.
"""

from __future__ import annotations

import errno
import io
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from bertology.errors import BertologyError

_BOM = "\ufeff"
#: What a file that is not a regular file is, by the type bits of its mode.
_FILE_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
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


@dataclass(frozen=True)
class ByteSpan:
    """A part of a file: the bytes ``start`` (inclusive) to ``end`` (exclusive; ``None``: the end of the
    file), which begin a line, the ``first_line``-th of the file (1-based). A reader process reads one
    (:mod:`bertology.corpus.reader_processes`)."""

    start: int
    end: int | None
    first_line: int


class _Window(io.RawIOBase):
    """The bytes of ``span`` of an open file, as a file of their own (read through a buffer)."""

    def __init__(self, handle: BinaryIO, span: ByteSpan) -> None:
        handle.seek(span.start)
        self.handle = handle
        self.left = None if span.end is None else span.end - span.start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        wanted = len(buffer) if self.left is None else min(len(buffer), self.left)
        got = self.handle.readinto(memoryview(buffer)[:wanted]) or 0
        if self.left is not None:
            self.left -= got
        return got


class _LineLimit(io.RawIOBase):
    """The bytes of ``handle`` (the file ``path``, from its ``first_line``-th line), refused as soon as a
    line runs past ``limit`` bytes, so no more than about ``limit`` bytes of an over-long line are read."""

    def __init__(self, handle: BinaryIO, limit: int, path: Path, first_line: int) -> None:
        self.handle, self.limit, self.path = handle, limit, path
        self.line = first_line  # the line the next byte belongs to
        self.run = 0  # bytes of that line read so far

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        got = self.handle.readinto(buffer) or 0
        *ended, rest = bytes(memoryview(buffer)[:got]).split(b"\n")
        for length in (len(part) for part in ended):
            self._check(self.run + length)
            self.line, self.run = self.line + 1, 0
        self._check(self.run + len(rest))
        self.run += len(rest)
        return got

    def _check(self, length: int) -> None:
        if length > self.limit:
            raise BertologyError(
                f"{self.path.name} line {self.line} is longer than {self.limit:,} bytes, the longest line "
                "this file may have; shorten it."
            )


def file_problem(path: Path) -> str | None:
    """What keeps ``path`` from being read as an input file, as the end of a sentence that starts with
    the path ("is missing", "is a directory, not a file", "is a named pipe (FIFO), not a regular file",
    "is a loop of symbolic links", ...), or ``None`` for a regular file (which may still be unreadable or
    empty)."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        if error.errno == errno.ENOENT:
            return "is a symbolic link to a missing file" if path.is_symlink() else "is missing"
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(mode):
        return f"is {_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')}, not a regular file"
    return None


def require_file(path: Path) -> None:
    """Raise unless ``path`` is a regular file (:func:`file_problem`).

    Raises:
        BertologyError: "<path> <what is wrong>; give a text file."
    """
    if problem := file_problem(path):
        raise BertologyError(f"{path} {problem}; give a text file.")


def read_lines(
    path: Path,
    *,
    piece_bytes: int | None = None,
    span: ByteSpan | None = None,
    max_line_bytes: int | None = None,
) -> Iterator[tuple[int, str]]:
    """Yield ``(line number, line)`` for each line of ``path`` (of its ``span`` only, if given), lazily,
    without the line ending.

    Line numbers are 1-based, in the whole file. A UTF-8 byte order mark at the start of the file is dropped.

    piece_bytes: read a line longer than this many bytes in pieces instead of whole (for a corpus that
        is one huge line): each piece is the longest run of whole words of at most ``piece_bytes``
        bytes, cut at a space or tab that is dropped (at ``piece_bytes``, on a character boundary, for
        a word longer than that), yielded with the line's number; a piece of only whitespace inside
        a line is left out. ``None``: every line whole.
    max_line_bytes: refuse a line longer than this many bytes, having read no more than about this
        many bytes of it (a file of one huge line is not read whole). ``None``: no limit.

    Raises:
        BertologyError: the path is not a regular file (:func:`require_file`) or cannot be opened, the
            file is binary (a NUL byte), a line is not valid UTF-8 or is longer than ``max_line_bytes``
            (naming the line).
    """
    require_file(path)
    try:
        handle = path.open("rb")
    except OSError as error:
        raise BertologyError(f"Could not open {path}: {error.strerror}.") from error
    span = span or ByteSpan(0, None, 1)
    with handle:
        lines = io.BufferedReader(_Window(handle, span)) if span.start or span.end is not None else handle
        if max_line_bytes is not None:
            lines = io.BufferedReader(_LineLimit(lines, max_line_bytes, path, span.first_line))
        if piece_bytes is None:
            yield from _whole_lines(lines, path, span)
            return
        for number, start, raw in _pieces(lines, piece_bytes, span.first_line):
            line = _decoded(raw, path, number, start)
            if span.start == 0 and number == 1 and start == 0:
                line = line.removeprefix(_BOM)
            yield number, line.rstrip("\r\n")


#: Bytes of whole lines :func:`read_lines` reads and decodes at once.
LINES_CHUNK_BYTES = 1 << 20


def _whole_lines(handle: BinaryIO, path: Path, span: ByteSpan) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of every line of ``handle`` (``span`` of ``path``), read
    :data:`LINES_CHUNK_BYTES` of whole lines at a time and decoded in one call (a chunk with a NUL byte or
    bad UTF-8 is gone through line by line for the error that names the line)."""
    number = span.first_line - 1
    while raw := handle.readlines(LINES_CHUNK_BYTES):
        data = b"".join(raw)
        try:
            if b"\0" in data:
                raise ValueError("a NUL byte")
            text = data.decode("utf-8")
        except ValueError:  # UnicodeDecodeError included: a line of the chunk is to blame, and named
            text = "".join(_decoded(line, path, offset, 0) for offset, line in enumerate(raw, number + 1))
        lines = text.split("\n")
        if data.endswith(b"\n"):
            lines.pop()  # the last line's ending, not a line
        if number == 0 and span.start == 0:
            lines[0] = lines[0].removeprefix(_BOM)
        for offset, line in enumerate(lines, start=number + 1):
            yield offset, line.rstrip("\r")
        number += len(lines)


def _decoded(raw: bytes, path: Path, number: int, start: int) -> str:
    """One line (or piece of one, ``start`` bytes into it) as text.

    Raises:
        BertologyError: a NUL byte (a binary file) or bad UTF-8, naming the line and the byte.
    """
    if b"\0" in raw:
        raise BertologyError(
            f"{path.name} is a binary file, not text (line {number} has a NUL byte); give a UTF-8 text file."
        )
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as error:
        raise BertologyError(
            f"{path.name} line {number} is not valid UTF-8 (byte {start + error.start + 1} of the "
            "line); save the file as UTF-8 text."
        ) from error


def _pieces(handle: BinaryIO, piece_bytes: int, first_line: int = 1) -> Iterator[tuple[int, int, bytes]]:
    """``(line number, byte offset in the line, bytes)`` of each line of ``handle`` (whose first line is
    the ``first_line``-th), a line longer than ``piece_bytes`` cut into pieces as :func:`read_lines` says;
    never more than ``2 * piece_bytes + 1`` bytes of a line held."""
    number = first_line - 1
    pending = b""  # the part of the current line read but not yet yielded
    start = 0  # where ``pending`` starts in the line
    cut = False  # whether the current line was cut into pieces
    while chunk := handle.readline(piece_bytes + 1):
        if not pending and not cut:
            number, start = number + 1, 0  # a line starts
        pending += chunk
        # readline stops short of its size only at the end of a line or of the file
        ends = chunk.endswith(b"\n") or len(chunk) <= piece_bytes
        body = pending.rstrip(b"\r\n") if ends else pending
        while len(body) > piece_bytes:
            cut = True
            space = max(body.rfind(b" ", 0, piece_bytes + 1), body.rfind(b"\t", 0, piece_bytes + 1))
            end, skip = (space, 1) if space >= 0 else (_character_boundary(body, piece_bytes), 0)
            if body[:end].strip():
                yield number, start, body[:end]
            body, start = body[end + skip :], start + end + skip
        pending = body
        if ends:
            if not cut or pending.strip():
                yield number, start, pending
            pending, cut = b"", False
    if pending.strip():  # the end of a cut last line, at the end of the file
        yield number, start, pending


def _character_boundary(data: bytes, limit: int) -> int:
    """The largest position up to ``limit`` in UTF-8 ``data`` that does not split a character (at least
    1, so a piece is never empty)."""
    end = limit
    while end > 1 and data[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
        end -= 1
    return end


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
