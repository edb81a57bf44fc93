"""The folder of a token index on disk: one generation of files at a time, switched whole.

An index folder holds ``manifest.json`` and a generation folder ``generation-<16 hex digits>/`` with the
index's own files (see :mod:`bertology.index.token_index`). The manifest names the generation; a reader
(:func:`read_manifest`, then :func:`generation_folder`) opens exactly the one it names. A build
(:func:`new_generation`) writes a new generation folder beside the current one and switches by
replacing the manifest in one rename, then removes the old generation and whatever killed builds left.
So a build killed at any moment leaves the folder opening as the old index or as the new one, never a
mixture, and a process that opened the old generation keeps its files (they are only unlinked). Two
builds of one folder do not run at once: the second is refused while the first holds the folder's lock
(``flock``, POSIX systems).

:func:`index_file` turns any failure to read one file of an index into one sentence that names it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.errors import BertologyError
from bertology.files.outputs import check_output_folder

INDEX_FORMAT = 3
MANIFEST = "manifest.json"
_GENERATION = re.compile(r"generation-[0-9a-f]{16}")
#: The manifest's fields and their types (besides ``format`` and ``generation``).
_FIELDS: dict[str, type] = {"model": str, "layers": list, "width": int, "tokens": int, "segments": int}
#: What an index of format 2 kept beside its manifest (one layout, rewritten in place).
_FORMAT_2_FILES = ("tokens.npz", "segments.jsonl", "tokenizer")


def damaged(path: Path, reason: str) -> BertologyError:
    """The one-sentence error for the damaged index file ``path``."""
    return BertologyError(
        f"The token index file {path} is damaged ({reason}); build the index again (`bertology index`)."
    )


@contextmanager
def index_file(path: Path) -> Iterator[None]:
    """Read the index file (or folder) ``path`` in the block: a missing one, and any failure to read or
    parse it (the zip, JSON, tokenizer and usearch readers each fail in their own way), become one
    sentence that names it."""
    if not path.exists():
        raise BertologyError(
            f"The token index file {path} is missing; build the index again (`bertology index`)."
        )
    try:
        yield
    except BertologyError:
        raise
    except Exception as error:  # whatever the reader of that format raises for bytes it cannot read
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")
        raise damaged(path, reason if len(reason) <= 120 else reason[:117] + "...") from error


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the index folder ``folder``, its fields checked.

    Raises:
        BertologyError: no index there, an index of another version, or a damaged manifest.
    """
    path = folder / MANIFEST
    if not path.is_file():
        raise BertologyError(f"'{folder}' is not a token index (run `bertology index` first).")
    with index_file(path):
        manifest = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(manifest, dict):
        raise damaged(path, "not a JSON object")
    if manifest.get("format") != INDEX_FORMAT:
        raise BertologyError(f"The token index '{folder}' was written by another version; build it again.")
    for name, kind in (*_FIELDS.items(), ("generation", str)):
        if not isinstance(manifest.get(name), kind):
            raise damaged(path, f"no {kind.__name__} '{name}'")
    if not _GENERATION.fullmatch(manifest["generation"]):
        raise damaged(path, f"'{manifest['generation']}' is not a generation folder's name")
    if not all(isinstance(layer, int) for layer in manifest["layers"]):
        raise damaged(path, "'layers' is not a list of layer numbers")
    return manifest


def generation_folder(folder: Path, manifest: dict[str, Any]) -> Path:
    """The generation folder that ``manifest`` (read from ``folder``) names."""
    return folder / manifest["generation"]


def _is_index_manifest(path: Path) -> bool:
    """Whether ``path`` is the manifest of a token index of any version (a JSON object with its format and
    model), so a build may replace the index."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("format"), int) and "model" in manifest


def check_index_folder(path: str | Path) -> Path:
    """Check that ``path`` can receive a token index: a new or empty folder, or one that holds an index
    (whose other files are left alone), and writable. Creates nothing.

    Raises:
        BertologyError: ``path`` is a file, cannot be written, or holds files but no index.
    """
    folder = check_output_folder(path)
    if not folder.exists() or _is_index_manifest(folder / MANIFEST):
        return folder
    if any(not _GENERATION.fullmatch(entry.name) for entry in folder.iterdir()):  # a killed build's: ours
        raise BertologyError(
            f"'{folder}' holds files but no token index; choose a new or empty folder, or an index to "
            "replace."
        )
    return folder


@dataclass
class Generation:
    """A generation being built: the folder to write its files into, and the manifest fields the build
    sets (``model``, ``layers``, ``width``, ``tokens``, ``segments``, ...)."""

    folder: Path
    manifest: dict[str, Any] = field(default_factory=dict)


@contextmanager
def new_generation(path: str | Path) -> Iterator[Generation]:
    """Check ``path`` (:func:`check_index_folder`; created if new), lock it, and yield a new generation
    to write. When the block ends without an error, the generation becomes the folder's index: its
    manifest (the fields the block set, the format and the generation's name) replaces ``manifest.json``
    in one rename, and then the old generation, the files of a format-2 index and what killed builds
    left are removed. On an error the new generation is removed (and the folder, if this created it and
    it is empty), and the index there stays as it was.

    Raises:
        BertologyError: as :func:`check_index_folder`, or another build holds the folder.
    """
    folder = check_index_folder(path)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    generation = Generation(folder / f"generation-{secrets.token_hex(8)}")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as error:
            raise BertologyError(
                f"Another `bertology index` is writing '{folder}'; wait until it ends, or choose another "
                "folder."
            ) from error
        replaced_format_2 = _format_of(folder / MANIFEST) == 2
        generation.folder.mkdir()
        try:
            yield generation
            _switch(folder, generation)
        except BaseException:
            shutil.rmtree(generation.folder, ignore_errors=True)
            if created and not any(folder.iterdir()):
                folder.rmdir()
            raise
        _remove_stale(folder, generation.folder.name, replaced_format_2)
    finally:
        os.close(lock)  # releases the lock


def _format_of(path: Path) -> int | None:
    """The ``format`` of the index manifest ``path`` (``None``: none there, or not an index's)."""
    return json.loads(path.read_text(encoding="utf-8"))["format"] if _is_index_manifest(path) else None


def _switch(folder: Path, generation: Generation) -> None:
    """Make ``generation`` the index of ``folder``: its manifest is written inside it, then renamed over
    ``folder``'s manifest (one atomic step on one file system)."""
    manifest = {"format": INDEX_FORMAT, **generation.manifest, "generation": generation.folder.name}
    staged = generation.folder / MANIFEST
    staged.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(staged, folder / MANIFEST)


def _remove_stale(folder: Path, current: str, replaced_format_2: bool) -> None:
    """Remove the generations of ``folder`` other than ``current`` (the one replaced, those of killed
    builds) and, where a format-2 index was replaced, its files."""
    stale = [
        entry for entry in folder.iterdir() if _GENERATION.fullmatch(entry.name) and entry.name != current
    ]
    if replaced_format_2:
        stale += [folder / name for name in _FORMAT_2_FILES] + list(folder.glob("layer_*.usearch"))
    for entry in stale:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
