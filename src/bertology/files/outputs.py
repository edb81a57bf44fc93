"""Where the commands write: output locations checked before the work, folders written whole or not at all.

:func:`check_output_file` and :func:`check_output_folder` are what every command that writes calls
first, so a location that cannot be written (a read-only or missing parent, a file where a folder should
be) is reported in one sentence before any model is loaded. :func:`output_folder` then has the command
write into a new staging folder and moves the finished files into the target only when everything has
been written, so a failure leaves the target as it was. The move goes file by file: a file the command
wrote replaces its namesake, and every other file in the target and its subfolders stays. A staging
folder is locked (``flock``) while its run lives; a later successful run into the same target removes
the staging folders that killed runs left (unlocked ones of that target's name), and :func:`write_text`
names the file in any error while writing it.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import stat
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


def _special_kind(path: Path) -> str | None:
    """What ``path`` (links followed) is when it exists and is neither a regular file nor a folder: "a
    named pipe", "a device", "a socket"; ``None`` otherwise."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def check_output_file(path: str | Path, *, beside: tuple[str, ...] = (), marks: Collection[str] = ()) -> Path:
    """Check that ``path`` (and the files with suffixes ``beside`` next to it, e.g. ``".json"``) can be
    written: each is a regular file or absent (never a folder, named pipe, device or socket, which would
    block the command or swallow its output), the nearest existing folder on the way is writable, and an
    existing file beside ``path`` is the command's own earlier output (a JSON object with every key of
    ``marks``), never a file of someone else's. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    for target in (path, *(path.with_suffix(suffix) for suffix in beside)):
        if target.is_dir():
            raise BertologyError(f"Cannot write the file {target}: it is a folder.")
        if kind := _special_kind(target):
            raise BertologyError(
                f"Cannot write the file {target}: it is {kind}, not a regular file; choose a file path."
            )
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
        what = _special_kind(path) or "a file"
        raise BertologyError(f"The output folder {path} is {what}; choose a folder.")
    _check_writable_folder(_existing_ancestor(path), path)
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to the file ``path``, creating its folder.

    Raises:
        BertologyError: the file could not be written (a full disk, a read-only place...), naming it.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        raise BertologyError(f"Could not write {target}: {error.strerror or error}.") from error
    return target


@contextmanager
def output_folder(path: str | Path, *, replace: Collection[str] = ()) -> Iterator[Path]:
    """Check that ``path`` can be an output folder, then yield a new empty staging folder to write into.

    When the block ends without an error, every file written in the staging folder is moved into ``path``
    (created if needed) at the same place below it, file by file: a file replaces an earlier file of the
    same name, a folder is created where missing and otherwise kept, so every other file in ``path`` and
    in its subfolders (``plots/mine.png``) is left alone. ``replace``: names of entries directly in
    ``path`` that are replaced whole instead (an earlier entry of such a name goes, whether or not the
    block wrote its namesake: a training run's ``model/``). On an error nothing reaches ``path``.

    The staging folder (``.<name>.<random>.partial``) lies in ``path`` or, before ``path`` exists, in its
    nearest existing parent, is locked while the block runs, and is removed either way (on SIGTERM too
    where the command line turns it into an exception). After the move, the unlocked staging folders of
    ``path``'s name that killed runs left in ``path`` and the parents up to where this one lay are
    removed; a locked one belongs to a live run and stays.

    Raises:
        BertologyError: ``path`` is a file or cannot be written (before the block runs), or the block
            wrote a folder where ``path`` holds a file or a link of that name, or a file where it holds a
            folder (then nothing is moved).
    """
    path = check_output_folder(path)
    ancestor = _existing_ancestor(path)  # ``path`` itself when it exists: the same disk either way
    staging, lock = _locked_staging(path.name, ancestor)
    try:
        yield staging
        _check_kinds(staging, path, skip=replace)
        _replace_into(staging, path, replace)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)
    _remove_stale_staging(path, ancestor)


def _locked_staging(name: str, folder: Path) -> tuple[Path, int]:
    """A new staging folder for output ``name`` in ``folder`` and a descriptor holding its lock."""
    while True:
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=folder))
        lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:  # a sweep may have taken it between its creation and the lock: then make another
            if os.stat(staging, follow_symlinks=False).st_ino == os.fstat(lock).st_ino:
                return staging, lock
        except FileNotFoundError:
            pass
        os.close(lock)


def _remove_stale_staging(path: Path, ancestor: Path) -> None:
    """Remove the staging folders of output ``path`` that no live run holds locked, in ``path``, its
    parent, and every folder between ``path`` and ``ancestor``."""
    folders = [path, path.parent]
    if ancestor != path:
        folders += [folder for folder in path.parents if ancestor in (folder, *folder.parents)]
    for folder in dict.fromkeys(folders):
        for candidate in folder.glob(f".{glob.escape(path.name)}.*.partial"):
            _remove_if_unlocked(candidate)


def _remove_if_unlocked(candidate: Path) -> None:
    """Remove the staging folder ``candidate`` (a real folder, not a link) unless a live run holds it
    locked."""
    try:
        lock = os.open(candidate, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return  # a link, a file, or gone
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return
    try:
        shutil.rmtree(candidate, ignore_errors=True)
    finally:
        os.close(lock)


def _check_kinds(staging: Path, path: Path, skip: Collection[str] = ()) -> None:
    """Raise unless every entry below ``staging`` (but those named in ``skip``, directly in it) can take
    its place below ``path``: a file where no folder is, a folder where nothing or a real folder (not a
    link to one) is."""
    for entry in sorted(staging.iterdir()):
        if entry.name in skip:
            continue
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


def _replace_into(staging: Path, path: Path, replace: Collection[str]) -> None:
    """Move the entries of ``path`` named in ``replace`` aside (into a staging-named folder, removed
    after), then the files below ``staging`` into ``path``."""
    old = [path / name for name in replace if (path / name).exists() or (path / name).is_symlink()]
    if not old:
        _move_into(staging, path)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path))
    try:
        for entry in old:
            os.replace(entry, aside / entry.name)
        _move_into(staging, path)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _move_into(staging: Path, path: Path) -> None:
    """Move the files below ``staging`` to the same places below ``path`` (kinds already checked)."""
    path.mkdir(parents=True, exist_ok=True)
    for entry in sorted(staging.iterdir()):
        target = path / entry.name
        if entry.is_dir() and (target.exists() or target.is_symlink()):
            _move_into(entry, target)
        else:  # a file, or a folder that is new there: one rename
            os.replace(entry, target)
