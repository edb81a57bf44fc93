"""The runs folder: safe path resolution and the list of what lives there.

Only paths inside the runs folder are ever served. A request path is refused (403) when it holds a
``..`` part, starts with ``/`` or a drive, has a backslash, a NUL or a ``%`` (the server already
decoded it once, so a ``%`` left is an encoded variant such as ``%2e%2e``), or when it resolves,
symbolic links followed, to a place outside the folder. Paths that do not exist give 404. What a page
built by the server reads (a training run's files) is checked the same way, every file below a folder
included (:meth:`RunsFolder.check_inside`).

A folder is listed when it holds ``run.json`` (a training run, shown by its watch page with the step
slider), ``report.html`` and ``heads.csv`` (a corpus analysis) or ``report.html`` alone (a probe).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from bertology.errors import BertologyError
from bertology.server.errors import RequestError, shown

RunKind = Literal["analysis", "probe", "training"]

TRAINING_FILE = "run.json"
REPORT_FILE = "report.html"
ANALYSIS_FILE = "heads.csv"
#: How deep below the runs folder runs are looked for, and how many are listed at most.
MAX_DEPTH = 4
MAX_RUNS = 1000

_DRIVE = re.compile(r"^[A-Za-z]:")
_REFUSED = "That path is refused: only files inside the runs folder are served."


@dataclass(frozen=True)
class Run:
    path: str  # relative to the runs folder, "/"-separated
    kind: RunKind

    @property
    def url(self) -> str:
        return folder_url(self.path) + ("" if self.kind == "training" else REPORT_FILE)

    @property
    def explore_url(self) -> str | None:
        """The explorer page of an analysis (``/explore?run=PATH``); ``None`` for other kinds."""
        return f"/explore?run={quote(self.path, safe='')}" if self.kind == "analysis" else None


def folder_url(path: str) -> str:
    """The URL of the runs folder's subfolder ``path`` ("/"-separated, "" for the folder itself)."""
    inner = path.strip("/")
    return f"/runs/{quote(inner)}/" if inner else "/runs/"


def run_kind(folder: Path) -> RunKind | None:
    """What ``folder`` holds, by the files in it (see the module docstring); ``None``: nothing shown."""
    if (folder / TRAINING_FILE).is_file():
        return "training"
    if (folder / REPORT_FILE).is_file():
        return "analysis" if (folder / ANALYSIS_FILE).is_file() else "probe"
    return None


class RunsFolder:
    """The folder given with ``--runs``; every path the server serves from it goes through :meth:`resolve`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise BertologyError(f"The runs folder '{root}' does not exist or is not a folder.")

    def resolve(self, relative: str) -> Path:
        """The existing file or folder at ``relative`` (a decoded URL path), inside the runs folder.

        Raises:
            RequestError: 403 for a path that could reach outside the folder, 404 for a missing one.
        """
        parts = relative.split("/")
        if (
            relative.startswith("/")
            or _DRIVE.match(relative)
            or any(bad in relative for bad in ("\\", "\x00", "%"))
            or ".." in parts
        ):
            raise RequestError(403, _REFUSED)
        try:
            found = (self.root / relative).resolve(strict=True)
        except (OSError, RuntimeError):
            raise RequestError(404, f"There is nothing at '{shown(relative)}' in the runs folder.") from None
        if not found.is_relative_to(self.root):
            raise RequestError(403, _REFUSED)
        return found

    def check_inside(self, path: Path) -> None:
        """Refuse (403) ``path`` unless it, and for a folder everything below it, resolves inside the runs
        folder, symbolic links followed (a dangling link counts where it points). A missing ``path`` passes:
        whoever reads it finds nothing.

        Raises:
            RequestError: 403 naming the first entry that leads outside.
        """
        pending, seen = [path], set()
        while pending:
            entry = pending.pop()
            if not (entry.exists() or entry.is_symlink()):
                continue
            real = entry.resolve()
            if not real.is_relative_to(self.root):
                inside = entry.relative_to(self.root) if entry.is_relative_to(self.root) else entry.name
                raise RequestError(
                    403, f"'{shown(str(inside))}' leads outside the runs folder; it is not read."
                )
            if real.is_dir() and real not in seen:
                seen.add(real)
                pending.extend(entry / name for name in os.listdir(real))

    def runs(self) -> list[Run]:
        """Every run folder, sorted by path; symbolic links to folders are not followed."""
        found: list[Run] = []
        for current, folders, _ in os.walk(self.root):
            here = Path(current)
            relative = here.relative_to(self.root)
            depth = len(relative.parts)
            folders[:] = (
                sorted(name for name in folders if not name.startswith(".")) if depth < MAX_DEPTH else []
            )
            kind = run_kind(here)
            if kind is not None:
                found.append(Run("" if depth == 0 else relative.as_posix(), kind))
                if kind == "training":
                    folders[:] = []  # a run's own subfolders (checkpoints, model) are part of it
            if len(found) >= MAX_RUNS:
                break
        return sorted(found, key=lambda run: run.path)
