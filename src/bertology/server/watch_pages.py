"""Watch pages of the training runs in the runs folder: built under the server's limits, cached by the
state of the run's files.

Building a watch page takes seconds (its plots), so it runs in a computation slot of its own pool, with
the server's ``parallel`` and ``timeout_s``. Pages are kept, most recently used first, up to
:data:`CACHE_BYTES` in all, each with the stamp of the files it was built from (size and modification
time of ``run.json``, ``metrics.jsonl`` and the archive's ``zarr.json``, which changes whenever training
completes a record); a page is rebuilt only when its run's stamp has changed.

Every file the page reads is opened below the runs folder without following links
(:mod:`bertology.files.beneath`): a run whose files are symbolic links is refused (403), whatever they point
to, and the files cannot be swapped for links while the page is built.
"""

from __future__ import annotations

from collections import OrderedDict

import anyio.to_thread
from starlette.requests import Request

from bertology.files.beneath import OpenFolder
from bertology.server.runs import RunsFolder
from bertology.server.workers import ComputeSlots

#: Most bytes of watch pages kept (a real run's page is about 6 MB).
CACHE_BYTES = 256 * 1024 * 1024

Stamp = tuple[tuple[int, int], ...]


def _stamp(run: OpenFolder) -> Stamp:
    """(size, modification time in ns) of each file of :data:`bertology.training.watch.WATCH_STAMP_FILES`
    in the opened run folder ``run``; (-1, -1) where missing."""
    from bertology.training.watch import WATCH_STAMP_FILES

    stamps = []
    for name in WATCH_STAMP_FILES:
        info = run.stat(name)
        stamps.append((-1, -1) if info is None else (info.st_size, info.st_mtime_ns))
    return tuple(stamps)


def _build(run: OpenFolder) -> str:
    from bertology.training.watch import watch_html

    return watch_html(run)


class WatchPages:
    """The watch pages of ``folder``'s training runs, built in ``slots`` and cached (module docstring)."""

    def __init__(self, folder: RunsFolder, slots: ComputeSlots[None], cache_bytes: int = CACHE_BYTES) -> None:
        self.folder = folder
        self.slots = slots
        self.cache_bytes = cache_bytes
        self._pages: OrderedDict[str, tuple[Stamp, str]] = OrderedDict()

    def _key_and_stamp(self, path: str) -> tuple[str, Stamp]:
        """The run folder at ``path`` as its pages are keyed (its path, normalised) and its stamp."""
        with self.folder.folder(path) as run:
            return run.label, _stamp(run)

    def _build_at(self, path: str) -> str:
        """The watch page of the run folder at ``path``, opened and read in this (worker) thread."""
        with self.folder.folder(path) as run:
            return _build(run)

    async def page(self, path: str, request: Request | None = None) -> str:
        """The watch page of the training run at ``path`` (relative to the runs folder).

        Raises:
            RequestError: 403 / 404 for the path (:meth:`RunsFolder.open`); those of
                :meth:`ComputeSlots.run` (503 past the timeout).
            LinkRefused: a file of the run is a symbolic link (403).
            BertologyError: no archive, or a damaged file (named in the message).
        """
        key, stamp = await anyio.to_thread.run_sync(self._key_and_stamp, path)
        cached = self._pages.get(key)
        if cached is not None and cached[0] == stamp:
            self._pages.move_to_end(key)
            return cached[1]
        html = await self.slots.run(lambda _: self._build_at(path), request)
        self._pages[key] = (stamp, html)
        self._pages.move_to_end(key)
        while len(self._pages) > 1 and sum(len(page) for _, page in self._pages.values()) > self.cache_bytes:
            self._pages.popitem(last=False)
        return html
