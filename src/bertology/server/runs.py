"""The runs folder: opening what is inside it, and the list of what lives there.

Only files inside the runs folder are ever read. A request path is refused (403) when it holds a
``..`` part, starts with ``/`` or a drive, has a backslash, a NUL or a ``%`` (the server already
decoded it once, so a ``%`` left is an encoded variant such as ``%2e%2e``), or when a symbolic link
lies on its way. Everything is opened below the runs folder's descriptor one component at a time,
without following links, and read from the descriptor opened (:mod:`bertology.files.beneath`), so an entry
swapped for a link between a check and a read cannot lead outside. Paths that do not exist give 404.
What a page built by the server reads (a training run's files, an analysis's files) is opened the same
way; a link met there is refused (403, :class:`bertology.files.beneath.LinkRefused`).

A folder is listed with the kind of run its writer marked it with (:mod:`bertology.files.run_files`: an
analysis, a comparison, a probe, an ablation, a patching study, ``heads``, ``composition``, a circuit, which
opens on its ``circuit.html`` and links its curves; a training run is the folder with ``run.json``, shown by
its watch page with the step slider) and the model the mark (or ``run.json``) names; a folder with a
``report.html`` and no mark (written by an older bertology, or by hand) is listed as a ``"report"``,
without a model. Only analyses get the explorer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import quote

from bertology.errors import BertologyError
from bertology.files.beneath import LinkRefused, OpenFolder
from bertology.files.run_files import (
    CURVES_FILE,
    KIND_FILE,
    REPORT_FILE,
    TRAINING_FILE,
    RunKind,
    page_file,
    read_kind,
    read_model,
)
from bertology.models.loading import RUN_MODEL_FOLDER
from bertology.server.errors import RequestError, shown

#: A run's kind as listed: one of :data:`bertology.files.run_files.RunKind`, or ``"report"`` for an unmarked
#: folder with a report.
ListedKind = Literal[RunKind, "report"]
#: How deep below the runs folder runs are looked for, and how many are listed at most.
MAX_DEPTH = 4
MAX_RUNS = 1000

_DRIVE = re.compile(r"^[A-Za-z]:")
_REFUSED = "That path is refused: only files inside the runs folder are served."


@dataclass(frozen=True)
class Run:
    path: str  # relative to the runs folder, "/"-separated
    kind: ListedKind
    model: str | None = None  # the model it used, as its mark names it (None: not named)

    @property
    def url(self) -> str:
        """The run's page: a training run's folder (its watch page), a circuit's ``circuit.html``, any other
        run's ``report.html``."""
        return folder_url(self.path) + ("" if self.kind == "training" else page_file(self.kind))

    @property
    def links(self) -> dict[str, str]:
        """The run's other files worth a link, by name: a circuit's faithfulness curves."""
        return {"curves": folder_url(self.path) + CURVES_FILE} if self.kind == "circuit" else {}

    @property
    def explore_url(self) -> str | None:
        """The explorer page of an analysis (``/explore?run=PATH``); ``None`` for other kinds."""
        return f"/explore?run={quote(self.path, safe='')}" if self.kind == "analysis" else None


def folder_url(path: str) -> str:
    """The URL of the runs folder's subfolder ``path`` ("/"-separated, "" for the folder itself)."""
    inner = path.strip("/")
    return f"/runs/{quote(inner)}/" if inner else "/runs/"


def _read_if_file(folder: OpenFolder, name: str) -> bytes | None:
    """The content of ``folder``'s regular file ``name``; ``None`` if there is none (or it was swapped for
    something else since it was looked at)."""
    if not folder.is_file(name):
        return None
    try:
        return folder.read_bytes(name)
    except (OSError, LinkRefused):
        return None


def run_of(folder: OpenFolder) -> Run | None:
    """What ``folder`` holds and on which model, read from its mark or its ``run.json`` (module docstring;
    regular files only, links are not counted); ``None``: nothing shown."""
    training = folder.is_file(TRAINING_FILE)
    record = _read_if_file(folder, TRAINING_FILE if training else KIND_FILE)
    found = read_kind(record, training=training)
    if found is not None:
        return Run(folder.label, found["kind"], read_model(record))
    return Run(folder.label, "report") if folder.is_file(REPORT_FILE) else None


class RunsFolder:
    """The folder given with ``--runs``; everything the server reads from it is opened through
    :meth:`open` or :meth:`folder` (:mod:`bertology.files.beneath`: no link followed, the opened descriptor
    checked and read)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise BertologyError(f"The runs folder '{root}' does not exist or is not a folder.")

    def opened(self) -> OpenFolder:
        """The runs folder itself, opened (its messages name paths relative to it)."""
        return OpenFolder.at(self.root, label="")

    def open(self, relative: str) -> OpenFolder | BinaryIO:
        """The folder or regular file at ``relative`` (a decoded URL path), opened inside the runs folder.

        Raises:
            RequestError: 403 for a path that could reach outside the folder (a symbolic link at any
                step included), 404 for a missing one (or one that is no regular file or folder).
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
            with self.opened() as root:
                return root.open(relative)
        except LinkRefused:
            raise RequestError(403, _REFUSED) from None
        except OSError:
            raise RequestError(404, f"There is nothing at '{shown(relative)}' in the runs folder.") from None

    def folder(self, relative: str) -> OpenFolder:
        """The folder at ``relative`` (see :meth:`open`).

        Raises:
            RequestError: as :meth:`open`; 404 for a file.
        """
        opened = self.open(relative)
        if not isinstance(opened, OpenFolder):
            opened.close()
            raise RequestError(404, f"'{shown(relative)}' is not a folder of the runs folder.")
        return opened

    def runs(self) -> list[Run]:
        """Every run folder, sorted by path, up to :data:`MAX_DEPTH` levels down and :data:`MAX_RUNS` runs;
        hidden folders and links are left out, and so are a training run's own subfolders (checkpoints,
        model)."""
        found: list[Run] = []
        with self.opened() as root:
            for here in root.folders(MAX_DEPTH, stop=lambda folder: folder.is_file(TRAINING_FILE)):
                run = run_of(here)
                if run is not None:
                    found.append(run)
                if len(found) >= MAX_RUNS:
                    break
        return sorted(found, key=lambda run: run.path)

    def model_runs(self) -> list[str]:
        """The training runs (as :meth:`runs` lists them) that hold a saved model (``model/config.json``,
        as ``bertology finetune`` writes it), reached without a link: the paths the web app offers as
        models."""
        with self.opened() as root:
            return [
                run.path
                for run in self.runs()
                if run.kind == "training" and root.is_file(f"{run.path}/{RUN_MODEL_FOLDER}/config.json")
            ]
