"""GAP (Webster et al., 2018): gendered pronouns and two candidate names in Wikipedia passages.

A GAP file is tab-separated with a header row naming the columns ``ID, Text, Pronoun, Pronoun-offset,
A, A-offset, A-coref, B, B-offset, B-coref, URL`` (matched by name, in any order); one example per line.
Offsets are 0-based character offsets into ``Text``; each is checked to point at the string it names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertology.corpus.readers import read_lines, require_records
from bertology.errors import BertologyError

_COLUMNS = (
    "ID",
    "Text",
    "Pronoun",
    "Pronoun-offset",
    "A",
    "A-offset",
    "A-coref",
    "B",
    "B-offset",
    "B-coref",
    "URL",
)
_BOOLEANS = {"TRUE": True, "FALSE": False}


@dataclass(frozen=True)
class GapExample:
    """One GAP example: does the pronoun refer to name A, to name B (or to neither)?

    text: the passage. pronoun, a, b: the pronoun and the two names as written in ``text``, starting at
    character ``pronoun_offset``, ``a_offset``, ``b_offset``. a_coref, b_coref: the gold answers.
    url: the Wikipedia page of the passage (not to be used in GAP's snippet-context setting).
    """

    id: str
    text: str
    pronoun: str
    pronoun_offset: int
    a: str
    a_offset: int
    a_coref: bool
    b: str
    b_offset: int
    b_coref: bool
    url: str


def read_gap(path: str | Path) -> Iterator[GapExample]:
    """Yield the examples of a GAP tsv file, in order (blank lines are skipped).

    Raises:
        BertologyError: an empty file, a header without the GAP columns, no example, or a line (named
            with its file and number) with the wrong number of fields, an offset that is not an integer
            or does not point at its string, or a coreference answer other than ``TRUE`` / ``FALSE``.
    """
    path = Path(path)
    return require_records(_read_examples(path), path, "GAP examples")


def _read_examples(path: Path) -> Iterator[GapExample]:
    lines = read_lines(path)
    first = next(lines, None)
    if first is None:
        raise BertologyError(f"{path} is empty; a GAP file starts with a header row naming its columns.")
    header = first[1].split("\t")
    missing = [name for name in _COLUMNS if name not in header]
    if missing:
        raise BertologyError(f"{path.name} line 1 is not a GAP header (no column {', '.join(missing)}).")
    index = {name: header.index(name) for name in _COLUMNS}
    for number, line in lines:
        if line.strip():
            yield _example(line.split("\t"), index, len(header), f"{path.name} line {number}")


def _invalid(where: str, problem: str) -> BertologyError:
    return BertologyError(f"{where} is not a valid GAP row ({problem}).")


def _example(fields: list[str], index: dict[str, int], width: int, where: str) -> GapExample:
    if len(fields) != width:
        raise _invalid(where, f"{len(fields)} tab-separated fields where the header has {width}")
    value = {name: fields[column] for name, column in index.items()}
    text = value["Text"]

    def offset(name: str) -> int:
        column = f"{name}-offset"
        try:
            start = int(value[column])
        except ValueError:
            raise _invalid(where, f"{column} '{value[column]}' is not an integer") from None
        if start < 0 or text[start : start + len(value[name])] != value[name]:
            raise _invalid(where, f"{column} {start} does not point at '{value[name]}' in the Text")
        return start

    def coref(name: str) -> bool:
        column = f"{name}-coref"
        answer = _BOOLEANS.get(value[column].upper())
        if answer is None:
            raise _invalid(where, f"{column} '{value[column]}' is neither TRUE nor FALSE")
        return answer

    return GapExample(
        id=value["ID"],
        text=text,
        pronoun=value["Pronoun"],
        pronoun_offset=offset("Pronoun"),
        a=value["A"],
        a_offset=offset("A"),
        a_coref=coref("A"),
        b=value["B"],
        b_offset=offset("B"),
        b_coref=coref("B"),
        url=value["URL"],
    )
