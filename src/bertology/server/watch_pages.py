"""Watch pages of the training runs in the runs folder: built under the server's limits, cached by the
state of the run's files.

Building a watch page takes seconds (its plots), so it runs in a computation slot of its own pool, with
the server's ``parallel`` and ``timeout_s``. Pages are kept, most recently used first, up to
:data:`CACHE_BYTES` in all, each with the stamp of the files it was built from (size and modification
time of ``run.json``, ``metrics.jsonl`` and the archive's ``zarr.json``, which changes whenever training
completes a record); a page is rebuilt only when its run's stamp has changed.

Before anything is read, every file the page reads (:func:`bertology.training.watch.watch_inputs`, every
file of the archive included) must resolve inside the runs folder: a run whose files are symbolic links
leading outside is refused (403).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import anyio.to_thread
from starlette.requests import Request

from bertology.server.runs import RunsFolder
from bertology.server.workers import ComputeSlots

#: Most bytes of watch pages kept (a real run's page is about 6 MB).
CACHE_BYTES = 256 * 1024 * 1024

Stamp = tuple[tuple[int, int], ...]


def _inputs(run_dir: Path) -> list[Path]:
    from bertology.training.watch import watch_inputs

    return watch_inputs(run_dir)


def _stamp(inputs: list[Path]) -> Stamp:
    """(size, modification time in ns) of each input file, of a folder its ``zarr.json``; (-1, -1) where
    missing."""
    stamps = []
    for path in inputs:
        file = path / "zarr.json" if path.is_dir() else path
        try:
            info = file.stat()
        except OSError:
            stamps.append((-1, -1))
        else:
            stamps.append((info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def _build(run_dir: Path) -> str:
    from bertology.training.watch import watch_html

    return watch_html(run_dir)


class WatchPages:
    """The watch pages of ``folder``'s training runs, built in ``slots`` and cached (module docstring)."""

    def __init__(self, folder: RunsFolder, slots: ComputeSlots[None], cache_bytes: int = CACHE_BYTES) -> None:
        self.folder = folder
        self.slots = slots
        self.cache_bytes = cache_bytes
        self._pages: OrderedDict[Path, tuple[Stamp, str]] = OrderedDict()

    def _checked_stamp(self, run_dir: Path) -> Stamp:
        inputs = _inputs(run_dir)
        for path in inputs:
            self.folder.check_inside(path)
        return _stamp(inputs)

    async def page(self, run_dir: Path, request: Request | None = None) -> str:
        """The watch page of the training run ``run_dir`` (resolved, inside the runs folder).

        Raises:
            RequestError: 403 for a file that leads outside the runs folder; those of
                :meth:`ComputeSlots.run` (503 past the timeout).
            BertologyError: no archive, or a damaged file (named in the message).
        """
        stamp = await anyio.to_thread.run_sync(self._checked_stamp, run_dir)
        cached = self._pages.get(run_dir)
        if cached is not None and cached[0] == stamp:
            self._pages.move_to_end(run_dir)
            return cached[1]
        html = await self.slots.run(lambda _: _build(run_dir), request)
        self._pages[run_dir] = (stamp, html)
        self._pages.move_to_end(run_dir)
        while len(self._pages) > 1 and sum(len(page) for _, page in self._pages.values()) > self.cache_bytes:
            self._pages.popitem(last=False)
        return html
