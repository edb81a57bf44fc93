"""Where the commands write: output locations checked before the work, folders written whole or not at all.

:func:`check_output_file` and :func:`check_output_folder` are what every command that writes calls
first, so a location that cannot be written (a read-only or missing parent, a file where a folder should
be) is reported in one sentence before any model is loaded. :func:`output_folder` then has the command
write into a new staging folder and moves the finished files into the target only when everything has
been written, so a failure leaves the target as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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


def check_output_file(path: str | Path, *, beside: tuple[str, ...] = ()) -> Path:
    """Check that ``path`` (and the files with suffixes ``beside`` next to it, e.g. ``".json"``) can be
    written: none is a folder, and the nearest existing folder on the way is writable. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    for target in (path, *(path.with_suffix(suffix) for suffix in beside)):
        if target.is_dir():
            raise BertologyError(f"Cannot write the file {target}: it is a folder.")
    _check_writable_folder(_existing_ancestor(path.parent), path)
    return path


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

    When the block ends without an error, every file and folder written in the staging folder is moved
    into ``path`` (created if needed; an earlier file or folder of the same name is replaced; the other
    contents of ``path`` are left alone). On an error nothing reaches ``path``. The staging folder
    (``.<name>.<random>.partial``) lies in ``path`` or, before ``path`` exists, in its nearest existing
    parent, and is removed either way.

    Raises:
        BertologyError: ``path`` is a file or cannot be written (before the block runs), or the block
            wrote a folder where ``path`` holds a file of that name or the other way round (then nothing
            is moved).
    """
    path = check_output_folder(path)
    ancestor = _existing_ancestor(path)  # ``path`` itself when it exists: the same disk either way
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=ancestor))
    try:
        yield staging
        _move_into(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into(staging: Path, path: Path) -> None:
    """Move the entries of ``staging`` into ``path``, after checking that none changes kind."""
    entries = sorted(staging.iterdir())
    for entry in entries:
        target = path / entry.name
        if target.exists() and target.is_dir() != entry.is_dir():
            have, want = ("folder", "file") if target.is_dir() else ("file", "folder")
            raise BertologyError(
                f"{target} is a {have} where bertology writes a {want}; move it away or choose another "
                "output folder (nothing was written)."
            )
    path.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        target = path / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)
