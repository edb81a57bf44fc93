"""Where the commands write: output locations checked before the work, folders written whole or not at all.

:func:`check_output_file` and :func:`check_output_folder` are what every command that writes calls
first, so a location that cannot be written (a read-only or missing parent, a file where a folder should
be) is reported in one sentence before any model is loaded. :func:`output_folder` then has the command
write into a new staging folder and moves the finished files into the target only when everything has
been written, so a failure leaves the target as it was. The move goes file by file: a file the command
wrote replaces its namesake, and every other file in the target and its subfolders stays.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from bertology.errors import BertologyError


def _existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s ancestors (``path`` included) that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()


def _check_writable_folder(folder: Path, target: Path) -> None:
    """Raise unless a file can be created in the existing folder ``folder`` (on the way to ``target``)."""
    if not folder.is_dir():
        raise BertologyError(f"Cannot write {target}: {folder} is a file, not a folder.")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        problem = f"Cannot write {target}: {folder} is not writable ({error.strerror})."
        raise BertologyError(problem) from error


def check_output_file(path: str | Path, *, beside: tuple[str, ...] = (), marks: Collection[str] = ()) -> Path:
    """Check that ``path`` (and the files with suffixes ``beside`` next to it, e.g. ``".json"``) can be
    written: none is a folder, the nearest existing folder on the way is writable, and an existing file
    beside ``path`` is the command's own earlier output (a JSON object with every key of ``marks``), never
    a file of someone else's. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    for target in (path, *(path.with_suffix(suffix) for suffix in beside)):
        if target.is_dir():
            raise BertologyError(f"Cannot write the file {target}: it is a folder.")
    for target in (path.with_suffix(suffix) for suffix in beside):
        if (target.exists() or target.is_symlink()) and not _is_own_json(target, marks):
            raise BertologyError(
                f"{target} exists and is not a file bertology wrote; move it away or choose another output "
                "file (nothing was written)."
            )
    _check_writable_folder(_existing_ancestor(path.parent), path)
    return path


def _is_own_json(path: Path, marks: Collection[str]) -> bool:
    """Whether ``path`` is a plain file (not a link) holding a JSON object with every key of ``marks``."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            if file.read(1) != b"{":  # not an object: no need to read the rest of a large file
                return False
            file.seek(0)
            data = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and set(marks) <= data.keys()


def check_output_folder(path: str | Path) -> Path:
    """Check that ``path`` can be an output folder: not a file, and the nearest existing folder on the way
    (``path`` itself when it exists) is writable. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BertologyError(f"The output folder {path} is a file; choose a folder.")
    _check_writable_folder(_existing_ancestor(path), path)
    return path


@contextmanager
def output_folder(path: str | Path) -> Iterator[Path]:
    """Check that ``path`` can be an output folder, then yield a new empty staging folder to write into.

    When the block ends without an error, every file written in the staging folder is moved into ``path``
    (created if needed) at the same place below it, file by file: a file replaces an earlier file of the
    same name, a folder is created where missing and otherwise kept, so every other file in ``path`` and
    in its subfolders (``plots/mine.png``) is left alone. On an error nothing reaches ``path``. The
    staging folder (``.<name>.<random>.partial``) lies in ``path`` or, before ``path`` exists, in its
    nearest existing parent, and is removed either way.

    Raises:
        BertologyError: ``path`` is a file or cannot be written (before the block runs), or the block
            wrote a folder where ``path`` holds a file or a link of that name, or a file where it holds a
            folder (then nothing is moved).
    """
    path = check_output_folder(path)
    ancestor = _existing_ancestor(path)  # ``path`` itself when it exists: the same disk either way
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=ancestor))
    try:
        yield staging
        _check_kinds(staging, path)
        _move_into(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_kinds(staging: Path, path: Path) -> None:
    """Raise unless every entry below ``staging`` can take its place below ``path``: a file where no folder
    is, a folder where nothing or a real folder (not a link to one) is."""
    for entry in sorted(staging.iterdir()):
        target = path / entry.name
        if entry.is_dir():
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                have = "link" if target.is_symlink() else "file"
                _refuse(target, have, "folder")
            _check_kinds(entry, target)
        elif target.is_dir() and not target.is_symlink():
            _refuse(target, "folder", "file")


def _refuse(target: Path, have: str, want: str) -> NoReturn:
    """Raise the one sentence for an entry of the wrong kind where the command writes."""
    raise BertologyError(
        f"{target} is a {have} where bertology writes a {want}; move it away or choose another output "
        "folder (nothing was written)."
    )


def _move_into(staging: Path, path: Path) -> None:
    """Move the files below ``staging`` to the same places below ``path`` (kinds already checked)."""
    path.mkdir(parents=True, exist_ok=True)
    for entry in sorted(staging.iterdir()):
        if entry.is_dir():
            _move_into(entry, path / entry.name)
        else:
            os.replace(entry, path / entry.name)
