"""JSON Lines corpora: one object per line with a string ``text`` and an optional string ``text_b``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from bertology.corpus.readers import ByteSpan, read_lines
from bertology.errors import BertologyError

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


class JsonRecord(NamedTuple):
    """One input of a JSONL corpus: ``text`` (and ``text_b`` for a pair) from line ``line``."""

    line: int
    text: str
    text_b: str | None


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), "a number")


def _text_field(record: dict, key: str, where: str, *, required: bool) -> str | None:
    """``record[key]`` checked to be a non-blank string (``None`` if optional and absent or null)."""
    value = record.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        got = "it is missing" if key not in record else f"got {_json_type(value)}"
        raise BertologyError(f"{where} needs a string '{key}' field ({got}).")
    if not value.strip():
        raise BertologyError(f"{where} has an empty '{key}' field.")
    return value


def read_records(path: Path, span: ByteSpan | None = None, *, second: str = "text_b") -> Iterator[JsonRecord]:
    """Yield one :class:`JsonRecord` per non-blank line of ``path`` (of its ``span``, if given).

    second: the optional field read as :attr:`JsonRecord.text_b` (``"target"``: an encoder-decoder's target
    text, :mod:`bertology.analysis.seq2seq`).

    Raises:
        BertologyError: a line that is not a JSON object, or whose ``text`` (or ``second``, when given)
            is not a non-empty string; the message names the file and line.
    """
    for number, line in read_lines(path, span=span):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problem = f"{error.msg} at column {error.colno}"
            raise BertologyError(f"{where} is not valid JSON ({problem}).") from error
        if not isinstance(record, dict):
            raise BertologyError(f"{where} is {_json_type(record)}, not a JSON object with a 'text' field.")
        text = _text_field(record, "text", where, required=True)
        yield JsonRecord(number, text, _text_field(record, second, where, required=False))
