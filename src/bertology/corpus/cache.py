"""The encoded-corpus cache: a corpus's segments, encoded as the model reads them, kept on disk so that
later runs of any corpus command skip reading, segmenting and encoding.

:func:`read_segments` is how the corpus runs read a corpus (``analyze``, ``compare``, ``index`` on text and
JSON Lines; the head detectors and the language-model ablation read only a corpus's first segments, from
the file, and the probes read treebanks sentence by sentence): the first complete pass over a corpus writes
an *entry*, later passes with the same key read it memory-mapped. The key is

* the corpus's content: SHA-256 of its bytes (a renamed copy hits, one changed byte misses);
* the tokenizer: SHA-256 of its serialised Rust tokenizer (vocabulary, normaliser, pre-tokenizer, model,
  special-token template) and its pad token;
* what shapes the segments: ``max_length``, the format, ``pairs`` (an encoder's pairs or a decoder's
  single texts, i.e. the model kind) and the encoding's token limit (``None``: segments without
  encodings).

Entries live in ``$BERTOLOGY_CACHE/corpora`` (beside the packaged models,
:func:`bertology.files.cache_folder.cache_root`, default ``~/.cache/bertology``; ``$BERTOLOGY_CORPUS_CACHE``
names another folder for them alone), one folder each, made under a
temporary name (``.writing-<key>-<random>``, locked while its writer lives) and renamed into place only
once whole; a ``manifest.json`` written last names each file's size and BLAKE2 digest, checked before an
entry is used, so a run killed mid-write never leaves an entry a later run trusts, and a damaged one is
ignored with a :class:`CacheWarning` (and written again). After each write the temporary folders of
writers that are gone (killed) are removed, and the least recently used entries until the folder holds
at most ``$BERTOLOGY_CACHE_MB`` megabytes (:data:`DEFAULT_LIMIT_MB`).

An entry's files (T tokens, S segments), raw little-endian arrays that are memory-mapped on reading:
``input_ids`` int32 [T], ``token_type_ids`` int8 [T] (where the tokenizer makes them), ``segment_ids`` int8
[T], ``word_ids`` int32 [T] (-1: a special token), ``index`` int64 [S, 4] (end of the segment's tokens,
end of its record in ``records``, :attr:`Segment.tokens`, tokens cut), and ``records``: one JSON line per
segment with its texts, origin, token strings and words.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from transformers import PreTrainedTokenizerFast

from bertology.corpus.encoding import EncodedRow
from bertology.corpus.reader_processes import SpanReading, read_encoded
from bertology.corpus.segments import Segment, check_corpus, require_text
from bertology.errors import BertologyError
from bertology.files.cache_folder import cache_root
from bertology.files.swap import locked_staging, remove_if_unlocked

#: Bumped whenever an entry's layout changes (old entries then miss).
LAYOUT = 1
#: Default bound of the corpus cache's size in megabytes (``$BERTOLOGY_CACHE_MB`` overrides it).
DEFAULT_LIMIT_MB = 2048

_MANIFEST = "manifest.json"
#: The name an entry is written under (then its key and a random part) until it is renamed whole.
_WRITING = ".writing-"
#: Joins the items of a list of strings in ``records`` (the ASCII unit separator).
_SEPARATOR = "\x1f"
_TOKEN_ARRAYS = {
    "input_ids": np.int32,
    "token_type_ids": np.int8,
    "segment_ids": np.int8,
    "word_ids": np.int32,
}


class CacheWarning(UserWarning):
    """A damaged or unwritable cache entry (the corpus is read from its file instead)."""


#: How a pass over a corpus used the cache: an entry served it (``read``), none had its key and the pass
#: writes one once it reaches the corpus's end (``written``), or the cache was not asked (``off``:
#: ``--no-cache``, or ``--limit``, which reads only the corpus's beginning).
CacheState = Literal["read", "written", "off"]


@dataclass(frozen=True)
class CacheUse:
    """How one pass over a corpus used the cache (:data:`CacheState`) and the key of its entry (``None``
    when ``off``)."""

    state: CacheState
    key: str | None = None

    def sentence(self) -> str:
        """What the command line says of it, e.g. "Segments read from the encoded-corpus cache (entry
        KEY)." ("" when off)."""
        if self.state == "off":
            return ""
        how = "read from" if self.state == "read" else "written to"
        return f"Segments {how} the encoded-corpus cache (entry {self.key}; see `bertology cache list`)."


#: The pass that did not ask the cache.
CACHE_OFF = CacheUse("off")


@dataclass(frozen=True)
class CacheEntry:
    """One entry as :func:`cache_entries` lists it: its key, corpus file name, segments, size in bytes,
    when it was last used (seconds since the epoch), and what shaped it: the model whose run wrote it
    (any model with the same tokenizer reads it), the tokenizer (where it was loaded from, its
    ``name_or_path``), ``max_length`` (``--max-len``), the corpus format and whether segments are pairs
    (an encoder's) or single texts (a decoder's); ``None`` for an entry written before they were
    recorded."""

    key: str
    corpus: str
    segments: int
    bytes: int
    used: float
    model: str | None = None
    tokenizer: str | None = None
    max_length: int | None = None
    format: str | None = None
    pairs: bool | None = None


def corpus_cache_folder() -> Path:
    """The folder of the corpus cache's entries: ``$BERTOLOGY_CORPUS_CACHE`` if set, else ``corpora`` in
    :func:`~bertology.files.cache_folder.cache_root` (beside the packaged models, which stay where they
    are)."""
    return Path(os.environ.get("BERTOLOGY_CORPUS_CACHE") or cache_root() / "corpora")


#: The megabyte of ``$BERTOLOGY_CACHE_MB`` and of ``bertology cache list``: 2**20 bytes.
MEGABYTE = 1024 * 1024


def limit_bytes() -> int:
    """The size bound of the corpus cache: ``$BERTOLOGY_CACHE_MB`` megabytes (default
    :data:`DEFAULT_LIMIT_MB`).

    Raises:
        BertologyError: ``$BERTOLOGY_CACHE_MB`` is not a whole number of at least 0.
    """
    text = os.environ.get("BERTOLOGY_CACHE_MB", "").strip() or str(DEFAULT_LIMIT_MB)
    if not text.isdigit():
        raise BertologyError(f"BERTOLOGY_CACHE_MB must be a whole number of megabytes, not '{text}'.")
    return int(text) * MEGABYTE


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerFast) -> str:
    """SHA-256 of what decides the tokenizer's output: its serialised Rust tokenizer from its added tokens on
    (vocabulary, normaliser, pre-tokenizer, model, special-token template; not the truncation and padding
    that its last call left set, serialised before them) and its pad token."""
    state = tokenizer.backend_tokenizer.to_str()
    digest = hashlib.sha256(state[max(0, state.find('"added_tokens":')) :].encode())
    digest.update(repr((tokenizer.pad_token_id, tokenizer.pad_token_type_id)).encode())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while piece := handle.read(1 << 22):
            digest.update(piece)
    return digest.hexdigest()


def cache_key(
    path: Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    max_length: int,
    format: str,
    pairs: bool,
    encoded_length: int | None,
) -> str:
    """The entry's name: a hash of the corpus's bytes, the tokenizer's fingerprint and the settings that
    shape the segments (see the module docstring)."""
    parts = [
        LAYOUT,
        file_digest(path),
        tokenizer_fingerprint(tokenizer),
        max_length,
        format,
        pairs,
        encoded_length,
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def read_segments(
    path: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    max_length: int = 128,
    format: str | None = None,
    pairs: bool = True,
    encoded_length: int | None = None,
    cache: bool = True,
    readers: int = 1,
    on_cache: Callable[[CacheUse], None] | None = None,
    model: str = "",
) -> Iterator[Segment]:
    """The segments of :func:`~bertology.corpus.segments.iter_segments` (same arguments, same order,
    equal segments),
    from the cache where an entry has the key, else read from the file (and, when the pass reaches the
    end, written to the cache).

    encoded_length: also encode each segment as the model reads it, cut to this many tokens
    (:attr:`~bertology.corpus.segments.Segment.encoded`; :func:`~bertology.corpus.encoding.encode`,
    nothing padded);
    ``None``: segments only. cache: ``False`` reads the file and writes nothing (``--no-cache``).
    readers: processes that read, segment and encode the file when the cache does not serve
    (:func:`~bertology.corpus.reader_processes.read_encoded`; 1: this process). on_cache: told, once and
    before the first segment, how this pass uses the cache (:class:`CacheUse`). model: the name of the model
    the segments are read for, recorded in an entry this pass writes (for ``bertology cache list``; the key
    does not depend on it, so models with one tokenizer share their entries).

    Raises:
        BertologyError: as :func:`~bertology.corpus.segments.iter_segments`.
    """
    path = Path(path)
    chosen = check_corpus(path, tokenizer, max_length=max_length, format=format)
    reading = SpanReading(path, chosen, tokenizer, max_length, pairs, encoded_length)
    segments = require_text(read_encoded(reading, readers), path)
    tell = on_cache or (lambda use: None)
    if not cache:
        tell(CACHE_OFF)
        return segments
    key = cache_key(
        path, tokenizer, max_length=max_length, format=chosen, pairs=pairs, encoded_length=encoded_length
    )
    folder = corpus_cache_folder() / key
    if (manifest := _trusted(folder)) is not None:
        tell(CacheUse("read", key))
        return _cached(folder, manifest, encoded_length)
    tell(CacheUse("written", key))
    shape = {
        "corpus": path.name,
        "model": model,
        "tokenizer": str(tokenizer.name_or_path),
        "max_length": max_length,
        "format": chosen,
        "pairs": pairs,
        "encoded_length": encoded_length,
    }
    return _written(segments, folder, shape)


def _written(segments: Iterator[Segment], folder: Path, shape: dict[str, Any]) -> Iterator[Segment]:
    """``segments``, written to a temporary folder as they pass and renamed to ``folder`` once the last has
    passed (a pass left early, or failing, writes nothing); ``shape``: what the manifest records of the
    corpus and the settings that shaped the segments (:class:`CacheEntry`). The temporary folder is locked
    while this writer lives (:func:`bertology.files.swap.locked_staging`), so another writer removes it
    only once its writer is gone (:func:`evict`)."""
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        scratch, lock = locked_staging(f"{_WRITING}{folder.name}-", parent, suffix="")
    except OSError as error:
        warnings.warn(
            f"The corpus cache in {parent} is not writable ({error}); not caching.",
            CacheWarning,
            stacklevel=2,
        )
        yield from segments
        return
    done = False
    try:
        with _EntryWriter(scratch) as writer:
            for segment in segments:
                writer.add(segment)
                yield segment
            writer.finish(shape)
        done = True
    finally:
        if done:
            _publish(scratch, folder)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
        os.close(lock)  # the lock that told other writers this folder is not a killed run's


class _EntryWriter:
    """Appends segments to an entry's files in a (temporary) folder; :meth:`finish` writes the manifest."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.files: dict[str, Any] = {}
        self.index: list[tuple[int, int, int, int]] = []
        self.tokens = self.record_bytes = 0

    def __enter__(self) -> _EntryWriter:
        self.files["records"] = (self.folder / "records").open("wb")
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.files.values():
            handle.close()

    def add(self, segment: Segment) -> None:
        row = segment.encoded
        record: list[Any] = [_packed(segment.text_a), _packed(segment.text_b), segment.origin]
        if row is not None:
            arrays = {
                "input_ids": row.features["input_ids"],
                "segment_ids": row.segment_ids,
                "word_ids": row.word_ids,
            }
            if "token_type_ids" in row.features:
                arrays["token_type_ids"] = row.features["token_type_ids"]
            for name, values in arrays.items():
                if name not in self.files:
                    self.files[name] = (self.folder / name).open("wb")
                self.files[name].write(np.asarray(values, dtype=_TOKEN_ARRAYS[name]).tobytes())
            self.tokens += len(row.tokens)
            record += [_packed(row.tokens), _packed(row.words), int((row.word_segments == 0).sum())]
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        self.files["records"].write(line)
        self.record_bytes += len(line)
        self.index.append((self.tokens, self.record_bytes, segment.tokens, row.truncated if row else 0))

    def finish(self, shape: dict[str, Any]) -> None:
        np.asarray(self.index, dtype=np.int64).reshape(-1, 4).tofile(self.folder / "index")
        for handle in self.files.values():
            handle.close()
        names = ["index", *self.files]
        manifest = {
            "layout": LAYOUT,
            **shape,
            "segments": len(self.index),
            "files": {name: _file_record(self.folder / name) for name in names},
        }
        (self.folder / _MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def _packed(value: str | list[str] | None) -> str | list[str] | dict[str, list[str]] | None:
    """A text, or a list of strings as one string in a list (its items joined by :data:`_SEPARATOR`: a
    quarter of the time to read back as a JSON list), or ``{"list": value}`` if an item holds the
    separator."""
    if not isinstance(value, list):
        return value
    if not value:
        return []
    joined = _SEPARATOR.join(value)
    return [joined] if joined.count(_SEPARATOR) == len(value) - 1 else {"list": value}


def _unpacked(value: str | list[str] | dict[str, list[str]] | None) -> str | list[str] | None:
    """The inverse of :func:`_packed`."""
    if isinstance(value, list):
        return value[0].split(_SEPARATOR) if value else []
    return value["list"] if isinstance(value, dict) else value


def _file_record(path: Path) -> dict[str, Any]:
    digest = hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()
    return {"bytes": path.stat().st_size, "blake2b": digest}


def _publish(scratch: Path, folder: Path) -> None:
    """Rename the finished ``scratch`` to ``folder`` (another run's equal entry may have come first), then
    keep the cache within its bound."""
    try:
        scratch.rename(folder)
    except OSError:  # an entry of this key is there (written meanwhile): keep it
        shutil.rmtree(scratch, ignore_errors=True)
    evict(limit_bytes())


def _trusted(folder: Path) -> dict[str, Any] | None:
    """The manifest of the entry in ``folder`` if it is whole (every file of the size and digest the
    manifest records), else ``None``, with a :class:`CacheWarning` for a damaged entry."""
    if not folder.is_dir():
        return None
    problem = None
    try:
        manifest = json.loads((folder / _MANIFEST).read_text(encoding="utf-8"))
        for name, record in manifest["files"].items():
            if _file_record(folder / name) != record:
                problem = f"its file '{name}' differs from its manifest"
                break
    except (OSError, ValueError, KeyError, TypeError) as error:
        problem = f"its manifest is missing or unreadable ({error.__class__.__name__})"
    if problem is not None:
        warnings.warn(
            f"Ignoring the damaged corpus cache entry {folder} ({problem}); reading the corpus again.",
            CacheWarning,
            stacklevel=3,
        )
        shutil.rmtree(folder, ignore_errors=True)
        return None
    os.utime(folder / _MANIFEST)  # last used: eviction removes the least recently used first
    return manifest


def _cached(folder: Path, manifest: dict[str, Any], encoded_length: int | None) -> Iterator[Segment]:
    """The entry's segments, its arrays memory-mapped."""
    names = set(manifest["files"])
    index = np.fromfile(folder / "index", dtype=np.int64).reshape(-1, 4)
    arrays = {
        name: np.memmap(folder / name, dtype=dtype, mode="r").view(np.ndarray)  # sliced as a plain array
        for name, dtype in _TOKEN_ARRAYS.items()
        if name in names and (folder / name).stat().st_size > 0
    }
    with (folder / "records").open("rb") as records:
        start = 0
        for end, _, tokens, truncated in index.tolist():
            text_a, text_b, origin, *encoding = json.loads(records.readline())
            text_a, text_b = _unpacked(text_a), _unpacked(text_b)
            row = None
            if encoding:
                token_strings, words = _unpacked(encoding[0]), _unpacked(encoding[1])
                words_a = encoding[2]
                features = {
                    "input_ids": np.asarray(arrays["input_ids"][start:end], dtype=np.int64),
                    "attention_mask": np.ones(end - start, dtype=np.int64),
                }
                if "token_type_ids" in arrays:
                    features["token_type_ids"] = np.asarray(
                        arrays["token_type_ids"][start:end], dtype=np.int64
                    )
                word_ids = np.asarray(arrays["word_ids"][start:end], dtype=np.int64)
                word_segments = np.zeros(len(words), dtype=np.int64)
                word_segments[words_a:] = 1
                row = EncodedRow(
                    features=features,
                    tokens=token_strings,
                    segment_ids=np.asarray(arrays["segment_ids"][start:end], dtype=np.int64),
                    special=word_ids < 0,
                    word_ids=word_ids,
                    words=words,
                    word_segments=word_segments,
                    truncated=truncated,
                )
            yield Segment(text_a, text_b, origin, tokens, row, encoded_length)
            start = end


def cache_entries() -> list[CacheEntry]:
    """The corpus cache's whole entries, least recently used first."""
    folder = corpus_cache_folder()
    found = []
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        if entry.name.startswith("."):  # a run's temporary folder, not an entry
            continue
        try:
            manifest = json.loads((entry / _MANIFEST).read_text(encoding="utf-8"))
            size = sum(path.stat().st_size for path in entry.iterdir())
            used = (entry / _MANIFEST).stat().st_mtime
        except (OSError, ValueError):
            continue
        found.append(
            CacheEntry(
                entry.name,
                manifest.get("corpus", ""),
                manifest.get("segments", 0),
                size,
                used,
                manifest.get("model"),
                manifest.get("tokenizer"),
                manifest.get("max_length"),
                manifest.get("format"),
                manifest.get("pairs"),
            )
        )
    return sorted(found, key=lambda entry: entry.used)


def clear_cache(keys: Sequence[str] = (), *, older_than: float | None = None) -> list[str]:
    """Remove entries of the corpus cache and return their keys: those named by ``keys`` (each a key or the
    start of exactly one), or those last used more than ``older_than`` seconds ago, or both conditions
    together; neither given: every entry, and any killed run's leftovers. The packaged models beside the
    cache stay, and so does a live writer's temporary folder.

    Raises:
        BertologyError: a key that names no entry, or the start of more than one.
    """
    entries = cache_entries()
    chosen = entries
    if keys:
        chosen = [_entry_named(key, entries) for key in keys]
    if older_than is not None:
        now = time.time()
        chosen = [entry for entry in chosen if now - entry.used > older_than]
    folder = corpus_cache_folder()
    if not keys and older_than is None:
        if folder.is_dir():
            shutil.rmtree(folder)
        return [entry.key for entry in entries]
    for entry in chosen:
        shutil.rmtree(folder / entry.key, ignore_errors=True)
    return [entry.key for entry in chosen]


def _entry_named(key: str, entries: list[CacheEntry]) -> CacheEntry:
    """The entry whose key is ``key`` or starts with it.

    Raises:
        BertologyError: none, or more than one.
    """
    found = [entry for entry in entries if entry.key == key] or [
        entry for entry in entries if entry.key.startswith(key)
    ]
    if len(found) != 1:
        what = "no entry" if not found else f"{len(found)} entries"
        raise BertologyError(
            f"The corpus cache in {corpus_cache_folder()} has {what} whose key is or starts with '{key}'; "
            "`bertology cache list` shows the keys."
        )
    return found[0]


def evict(limit: int) -> list[str]:
    """Remove the least recently used entries until the cache holds at most ``limit`` bytes, and killed
    runs' temporary folders (those no live writer holds locked); returns the keys removed."""
    folder = corpus_cache_folder()
    for leftover in folder.glob(f"{_WRITING}*"):
        remove_if_unlocked(leftover)
    entries = cache_entries()
    total = sum(entry.bytes for entry in entries)
    removed = []
    for entry in entries:
        if total <= limit:
            break
        shutil.rmtree(folder / entry.key, ignore_errors=True)
        total -= entry.bytes
        removed.append(entry.key)
    return removed
