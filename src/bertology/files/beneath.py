"""Files below a folder held open by descriptor, opened without following a symbolic link at any step.

A path checked by name and then opened by name can change in between: someone who can write in the
folder swaps an entry for a symbolic link (``renameat2(RENAME_EXCHANGE)``) after the check, and the open
follows it out. Here a folder is held as a descriptor (:class:`OpenFolder`) and a path below it is opened
one component at a time, each relative to the descriptor of the one before, with ``O_NOFOLLOW``: a
symbolic link at any step is refused (:class:`LinkRefused`), ``..`` is never taken, and what is checked
(``fstat``: a regular file or a folder) and read is the opened descriptor itself. A FIFO or a device
planted in the folder is opened without blocking and refused as not a file. POSIX systems only
(``os.open`` with ``dir_fd``).
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from bertology.errors import BertologyError

# O_NONBLOCK: opening a FIFO returns at once (it is then refused); no effect on reading a regular file.
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
#: What opening a symbolic link with O_NOFOLLOW gives (EMLINK on FreeBSD), and nothing else can give here.
_LINK_ERRORS = (errno.ELOOP, errno.EMLINK)


class LinkRefused(BertologyError):
    """A symbolic link met on the way to a file; ``path`` names it (as :meth:`OpenFolder.name_of` does)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"'{path}' is a symbolic link; links are not followed.")
        self.path = path


def path_parts(relative: str) -> list[str]:
    """The components of the "/"-separated ``relative`` ("" and "." left out).

    Raises:
        ValueError: a ``..`` component (callers refuse such paths before; it is never taken).
    """
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"'{relative}' has a '..' component.")
    return parts


class OpenFolder:
    """A folder held open as a descriptor; ``label`` names it in messages (e.g. its path relative to the
    runs folder). Closed by :meth:`close`, the ``with`` block, or when the object is collected."""

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def at(cls, path: str | Path, label: str | None = None) -> OpenFolder:
        """The folder at ``path``, a path of the caller's own (links in it are followed, as any open does).

        Raises:
            OSError: no folder there (FileNotFoundError, NotADirectoryError, PermissionError).
        """
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return cls(fd, str(path) if label is None else label)

    def close(self) -> None:
        self._closer()

    def __enter__(self) -> OpenFolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def name_of(self, relative: str) -> str:
        """How messages name ``relative`` below this folder."""
        inner = "/".join(path_parts(relative))
        return "/".join(part for part in (self.label.rstrip("/"), inner) if part)

    def _descriptor(self, relative: str) -> tuple[int, int]:
        """A new descriptor of ``relative`` and its ``st_mode``, each component opened below the one before
        without following links.

        Raises:
            LinkRefused: a component is a symbolic link.
            OSError: a component is missing or not a folder, named as :meth:`name_of` names it.
        """
        parts = path_parts(relative) or ["."]
        current, mode = self.fd, 0
        try:
            for index, part in enumerate(parts):
                name = self.name_of("/".join(parts[: index + 1]))
                try:
                    opened = os.open(part, _FLAGS, dir_fd=current)
                except OSError as error:
                    if error.errno in _LINK_ERRORS:
                        raise LinkRefused(name) from None
                    raise type(error)(error.errno, error.strerror, name) from None
                if current != self.fd:
                    os.close(current)
                current = opened
                mode = os.fstat(current).st_mode
                if index < len(parts) - 1 and not stat.S_ISDIR(mode):
                    raise NotADirectoryError(errno.ENOTDIR, "Not a folder", name)
            return current, mode
        except BaseException:
            if current != self.fd:
                os.close(current)
            raise

    def open(self, relative: str) -> OpenFolder | BinaryIO:
        """``relative`` opened: an :class:`OpenFolder` for a folder, a binary file object (``name``: as
        :meth:`name_of` names it) for a regular file.

        Raises:
            LinkRefused: a symbolic link on the way, the last component included.
            OSError: missing (FileNotFoundError, also for a FIFO, socket or device: not a file).
        """
        fd, mode = self._descriptor(relative)
        name = self.name_of(relative)
        if stat.S_ISDIR(mode):
            return OpenFolder(fd, name)
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "Not a regular file or folder", name)
        handle = open(fd, "rb")  # noqa: SIM115 - the caller owns (and closes) the file
        handle.raw.name = name  # type: ignore[misc]
        return handle

    def folder(self, relative: str) -> OpenFolder:
        """The folder ``relative`` (see :meth:`open`).

        Raises:
            LinkRefused, OSError: as :meth:`open`; NotADirectoryError for anything but a folder.
        """
        opened = self.open(relative)
        if not isinstance(opened, OpenFolder):
            opened.close()
            raise NotADirectoryError(errno.ENOTDIR, "Not a folder", self.name_of(relative))
        return opened

    def file(self, relative: str) -> BinaryIO:
        """The regular file ``relative`` (see :meth:`open`).

        Raises:
            LinkRefused, OSError: as :meth:`open`; IsADirectoryError for a folder.
        """
        opened = self.open(relative)
        if isinstance(opened, OpenFolder):
            opened.close()
            raise IsADirectoryError(errno.EISDIR, "Is a folder", self.name_of(relative))
        return opened

    def read_bytes(self, relative: str) -> bytes:
        """The whole content of the regular file ``relative`` (see :meth:`file`)."""
        with self.file(relative) as handle:
            return handle.read()

    def stat(self, relative: str) -> os.stat_result | None:
        """The status of the entry ``relative`` itself (a link's own, not its target's); ``None`` where
        nothing is (or a folder on the way is missing, a link or not a folder)."""
        parts = path_parts(relative)
        if not parts:
            return os.fstat(self.fd)
        try:
            with self.folder("/".join(parts[:-1])) as parent:
                return os.stat(parts[-1], dir_fd=parent.fd, follow_symlinks=False)
        except (OSError, LinkRefused):
            return None

    def is_file(self, relative: str) -> bool:
        """Whether ``relative`` is a regular file (not a link to one)."""
        found = self.stat(relative)
        return found is not None and stat.S_ISREG(found.st_mode)

    def entries(self) -> list[os.DirEntry[str]]:
        """The folder's entries, sorted by name; ``is_dir(follow_symlinks=False)`` and
        ``is_file(follow_symlinks=False)`` tell what each is without following links."""
        with os.scandir(self.fd) as found:
            return sorted(found, key=lambda entry: entry.name)

    def folders(
        self, depth: int, *, stop: Callable[[OpenFolder], bool] | None = None
    ) -> Iterator[OpenFolder]:
        """This folder, then the folders below it down to ``depth`` levels, sorted by name, each open only
        while it is being looked at: hidden folders (a leading dot) and links are left out, and nothing
        below a folder that ``stop`` is true of; a folder swapped for something else since it was listed
        is left out too."""
        yield self
        if depth <= 0 or (stop is not None and stop(self)):
            return
        for entry in self.entries():
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                below = self.folder(entry.name)
            except (OSError, LinkRefused):
                continue
            with below:
                yield from below.folders(depth - 1, stop=stop)

    def walk(self, prefix: str = "") -> Iterator[str]:
        """The "/"-separated paths of every regular file below this folder, links and what they point to
        left out."""
        for entry in self.entries():
            if entry.is_file(follow_symlinks=False):
                yield prefix + entry.name
            elif entry.is_dir(follow_symlinks=False):
                try:
                    below = self.folder(entry.name)
                except (OSError, LinkRefused):
                    continue  # swapped for something else since it was listed
                with below:
                    yield from below.walk(f"{prefix}{entry.name}/")
