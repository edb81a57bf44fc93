"""Where the commands write: output locations checked before the work, folders switched whole.

:func:`check_output_file` and :func:`check_output_folder` are what every command that writes calls
first, so a location that cannot be written (a read-only or missing parent, a file where a folder should
be, a symbolic link to nothing) is reported in one sentence before any model is loaded.
:func:`output_folder` then has the command write into a new staging folder beside the target, which
replaces the target in one step only when everything has been written (:mod:`bertology.files.swap`),
keeping the target's other files: a failure leaves the target as it was, and a kill at any moment leaves
the old run or the new one. :func:`write_text` names the file in any error while writing it.
"""

from __future__ import annotations

import errno
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
from bertology.files.swap import carry_over, exchange, locked_staging, remove_stale_staging


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


def _refuse_dangling_link(path: Path) -> None:
    """Refuse an output location through a symbolic link to nothing (``path`` itself or a folder on the way
    to it), as an input through one is refused: writing would create the link's target, wherever it points
    (or fail half-way).

    Raises:
        BertologyError: naming the link and where it points.
    """
    for link in (path, *path.parents):
        if not link.is_symlink():
            continue
        try:
            link.stat()
        except OSError as error:
            where = "it" if link == path else str(link)
            what = (
                "a loop of symbolic links"
                if error.errno == errno.ELOOP
                else f"a symbolic link to {os.readlink(link)}, which is missing"
            )
            raise BertologyError(
                f"Cannot write {path}: {where} is {what}; remove the link or choose another output."
            ) from None


def check_output_file(path: str | Path, *, beside: tuple[str, ...] = (), marks: Collection[str] = ()) -> Path:
    """Check that ``path`` (and the files with suffixes ``beside`` next to it, e.g. ``".json"``) can be
    written: each is a regular file or absent (never a folder, named pipe, device or socket, which would
    block the command or swallow its output, nor a symbolic link to nothing), the nearest existing folder
    on the way is writable, and an existing file beside ``path`` is the command's own earlier output (a
    JSON object with every key of ``marks``), never a file of someone else's. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    for target in (path, *(path.with_suffix(suffix) for suffix in beside)):
        _refuse_dangling_link(target)
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
    """Check that ``path`` can be an output folder: not a file nor a symbolic link to nothing, and the
    nearest existing folder on the way (``path`` itself when it exists, and then its parent too, where a
    new run is staged) is writable. Creates nothing.

    Raises:
        BertologyError: one sentence saying which location cannot be written and why.
    """
    path = Path(path)
    _refuse_dangling_link(path)
    if path.exists() and not path.is_dir():
        what = _special_kind(path) or "a file"
        raise BertologyError(f"The output folder {path} is {what}; choose a folder.")
    _check_writable_folder(_existing_ancestor(path), path)
    if path.exists():
        _check_writable_folder(path.resolve().parent, path)
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

    When the block ends without an error, the staging folder becomes ``path`` in one step
    (:mod:`bertology.files.swap`): first every file of ``path`` that the block did not write is linked
    into it at the same place, so a file the block wrote replaces an earlier file of the same name, a
    folder is merged with its namesake, and every other file in ``path`` and in its subfolders
    (``plots/mine.png``) stays; then the two folders swap names, and the old one is removed. ``replace``:
    names of entries directly in ``path`` that are replaced whole instead (an earlier entry of such a name
    goes, whether or not the block wrote its namesake: a training run's ``model/``). A reader of ``path``
    sees the old run or the new one, never a mixture, whenever the command is killed; on an error
    ``path`` stays as it was.

    The staging folder (``.<name>.<random>.partial``) lies beside ``path`` (whose missing parents are made
    first), is locked while the block runs, and is removed either way (on SIGTERM too where the command
    line turns it into an exception). After the switch, the unlocked staging folders of ``path``'s name
    that killed runs left beside it (or inside it, where earlier versions staged) are removed; a locked
    one belongs to a live run and stays.

    Raises:
        BertologyError: ``path`` is a file or cannot be written (before the block runs), or the block
            wrote a folder where ``path`` holds a file or a link of that name, or a file where it holds a
            folder (then nothing is switched).
    """
    target = check_output_folder(path).resolve()  # a link to a folder: that folder is switched
    target.parent.mkdir(parents=True, exist_ok=True)
    staging, lock = locked_staging(f".{target.name}.", target.parent)
    try:
        yield staging
        _check_kinds(staging, target, skip=replace)
        if target.exists():
            os.chmod(staging, target.stat().st_mode & 0o7777)
            carry_over(target, staging, skip=replace)
        within = _working_folder_within(target)
        exchange(staging, target)
        if within is not None:  # this process worked in the old folder: go on in the new one
            os.chdir(target / within if (target / within).is_dir() else target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the old run after the switch, else the new one
        os.close(lock)
    remove_stale_staging(target)


def _working_folder_within(folder: Path) -> Path | None:
    """This process's working folder relative to ``folder`` when it lies in ``folder``, else ``None``."""
    try:
        return Path.cwd().relative_to(folder)
    except (OSError, ValueError):
        return None


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
