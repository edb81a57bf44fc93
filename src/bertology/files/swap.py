"""Switching a folder whole: a locked staging folder beside it, exchanged for it in one step.

Every command that writes an output folder (through :func:`bertology.files.outputs.output_folder`) writes
into a new staging folder ``.<name>.<random>.partial`` beside the target, locked (``flock``) while its run
lives (:func:`locked_staging`). When the run has written everything, the target's other files (those the
run did not write) are hard-linked into the staging folder at the same places (:func:`carry_over`), and
the staging folder and the target then swap names in one atomic step (Linux's ``renameat2`` with
``RENAME_EXCHANGE``; :func:`exchange`), after which the staging name holds the old run, which is removed.
So at every moment the target is the old run or the new one, whole, as an index's manifest switches its
generation (:mod:`bertology.index.store`); a killed run leaves only a staging folder, which no live run
holds locked, and a later run's sweep (:func:`remove_stale_staging`) removes it. Nothing else is ever
removed: a kept run never sits under a staging name.

The corpus cache's entries are written the same way, in locked folders that a later writer removes once
their writer is gone (:func:`remove_if_unlocked`).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import glob
import os
import secrets
import shutil
from collections.abc import Collection
from pathlib import Path

#: ``renameat2``'s flag that swaps two existing names, and the "relative to the working folder" descriptor.
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100
#: Errors of a file system or system that cannot exchange two names in one step.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP}


def staging_pattern(name: str) -> str:
    """The glob pattern of the staging folders of output ``name``."""
    return f".{glob.escape(name)}.*.partial"


def locked_staging(prefix: str, folder: Path, suffix: str = ".partial") -> tuple[Path, int]:
    """A new empty folder ``<prefix><random><suffix>`` in ``folder`` (mode as ``mkdir`` gives it under the
    umask) and a descriptor holding its lock; close the descriptor to release it."""
    while True:
        staging = folder / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            os.mkdir(staging)
        except FileExistsError:
            continue
        lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:  # a sweep may have taken it between its creation and the lock: then make another
            if os.stat(staging, follow_symlinks=False).st_ino == os.fstat(lock).st_ino:
                return staging, lock
        except FileNotFoundError:
            pass
        os.close(lock)


def remove_if_unlocked(candidate: Path) -> None:
    """Remove the folder ``candidate`` (a real folder, not a link) unless a live process holds it locked."""
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


def remove_stale_staging(path: Path) -> None:
    """Remove the staging folders of the output folder ``path`` (:func:`staging_pattern`) that no live run
    holds locked: beside it, and inside it (where earlier versions staged)."""
    for folder in (path.parent, path):
        for candidate in folder.glob(staging_pattern(path.name)):
            remove_if_unlocked(candidate)


def carry_over(old: Path, new: Path, skip: Collection[str] = ()) -> None:
    """Hard-link every file (or link) below ``old`` that ``new`` lacks into ``new`` at the same place,
    making the folders ``new`` lacks (with ``old``'s modes); entries directly in ``old`` named in ``skip``
    are not carried. A file that cannot be linked (another owner's, under protected hard links) is copied.
    ``old`` is not changed."""
    for entry in sorted(old.iterdir()):
        if entry.name in skip:
            continue
        target = new / entry.name
        if entry.is_dir() and not entry.is_symlink():
            if not target.exists():
                os.mkdir(target)
                os.chmod(target, entry.stat().st_mode & 0o7777)
            carry_over(entry, target)  # kinds were checked: a folder of the run's where old has one
        elif not (target.exists() or target.is_symlink()):
            try:
                os.link(entry, target, follow_symlinks=False)
            except OSError:
                shutil.copy2(entry, target, follow_symlinks=False)


def exchange(staging: Path, target: Path) -> None:
    """Put the folder ``staging`` in the place of ``target``: when ``target`` exists, the two swap names in
    one step (after it, ``staging``'s name holds what ``target`` held); otherwise ``staging`` is renamed.

    Where the file system cannot swap two names (``renameat2`` missing or refused), ``target`` is renamed
    to ``staging``'s name plus ``.old`` and ``staging`` then takes its place: a moment without ``target``,
    the old folder kept beside it under a name no sweep removes; it is then moved to ``staging``'s name.
    """
    if not target.exists():
        os.rename(staging, target)
        return
    try:
        _renameat2(staging, target, _RENAME_EXCHANGE)
    except OSError as error:
        if error.errno not in _NO_EXCHANGE:
            raise
        aside = staging.with_name(staging.name + ".old")
        os.rename(target, aside)
        os.rename(staging, target)
        os.rename(aside, staging)


def _renameat2(source: Path, target: Path, flags: int) -> None:
    """``renameat2(source, target, flags)`` (glibc); ``ENOSYS`` where the C library lacks it."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), str(source))
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(source), None, str(target))
