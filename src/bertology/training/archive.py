"""The run archive of the attention monitor: a Zarr v3 group on disk, readable while training writes it.

Layout of ``RUN_DIR/monitor.zarr`` (``T`` records, ``K`` probe examples, ``L`` layers, ``H`` heads, ``N``
the probe set's longest input in tokens, ``S`` statistics):

- ``steps`` [T] int64: the optimizer step of each record (0 = before training).
- ``attention`` [T, K, L, H, N, N] float16: each probe example's attention (row = query, column = key),
  zero past the example's length; one chunk per record and example, Blosc-zstd compressed.
- ``stats`` [T, S, L, H] float32: per-head surface statistics over the probe set
  (:class:`~bertology.stats.surface.SurfaceAccumulator`), NaN where undefined; one chunk per record.
- ``lengths`` [K] int32: real token count of each probe example.
- ``losses`` [P] float32: the training loss of every optimizer step (index ``i``: step ``i + 1``; NaN for a
  step whose loss was not given), up to the latest record's step; written with each record, in chunks of
  :data:`LOSS_CHUNK` steps. Archives written before it existed have none (read as no steps).
- group attributes: ``format``, ``version``, ``model``, ``layers``, ``heads``, ``max_tokens`` (N),
  ``statistics`` (the S names), ``every`` (steps between records), ``probe`` (``texts``, ``texts_b``,
  ``labels``, ``tokens``, ``segments``, ``truncated``) and ``recorded``, the number of complete records.

Crash safety: the archive is built empty in a sibling folder and renamed into place. A record is then
written in this order: the arrays grow by one record (metadata), the record's chunks are written, then
``recorded`` is raised. Zarr's local store writes every file to a temporary name and renames it, so each
file is either old or new, never half-written. A reader that trusts only ``recorded`` therefore sees
whole records only, during training and after the process is killed.

Reading opens every file of the archive below the archive's folder descriptor without following links
(:mod:`bertology.files.beneath`), so an archive in a folder others can write (the web server's runs folder)
cannot be made to read a file elsewhere: a symbolic link inside it is refused.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import BertologyError
from bertology.files.beneath import OpenFolder

FORMAT = "bertology-monitor"
VERSION = 1
#: The archive's folder inside a training run folder.
ARCHIVE_FOLDER = "monitor.zarr"
#: Steps per chunk of the ``losses`` array.
LOSS_CHUNK = 1024


@dataclass(frozen=True)
class ProbeTokens:
    """What the archive keeps about the probe examples (all lists have one entry per example).

    texts / texts_b: the inputs (``texts_b`` None for single-sentence tasks); labels: gold label names or
    None; tokens: each example's token strings; segments: each example's segment ids (0 = text A, 1 = B);
    truncated: tokens cut from each example to fit the length limit.
    """

    texts: list[str]
    texts_b: list[str] | None
    labels: list[str] | None
    tokens: list[list[str]]
    segments: list[list[int]]
    truncated: list[int]

    @property
    def lengths(self) -> np.ndarray:
        """[K] int: each example's token count."""
        return np.array([len(tokens) for tokens in self.tokens], dtype=np.int32)


def _compressor() -> Any:
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")


class ArchiveWriter:
    """Appends records to a new archive (see the module docstring for the layout)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.recorded = int(group.attrs["recorded"])
        self.lengths = [int(length) for length in group["lengths"][:]]

    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        model: str,
        layers: int,
        heads: int,
        probe: ProbeTokens,
        statistics: Sequence[str],
        every: int,
    ) -> ArchiveWriter:
        """Create the archive at ``path``, replacing any archive there.

        It is built in a sibling folder and renamed into place, so a reader finds either no archive or
        a whole one with no records yet.
        """
        import zarr

        count, width = len(probe.tokens), int(probe.lengths.max())
        final = Path(path)
        staging = final.with_name(final.name + ".creating")
        shutil.rmtree(staging, ignore_errors=True)
        group = zarr.open_group(str(staging), mode="w")
        group.attrs.update(
            {
                "format": FORMAT,
                "version": VERSION,
                "model": model,
                "layers": layers,
                "heads": heads,
                "max_tokens": width,
                "statistics": list(statistics),
                "every": every,
                "probe": {
                    "texts": probe.texts,
                    "texts_b": probe.texts_b,
                    "labels": probe.labels,
                    "tokens": probe.tokens,
                    "segments": probe.segments,
                    "truncated": probe.truncated,
                },
                "recorded": 0,
            }
        )
        group.create_array("lengths", data=probe.lengths, chunks=(count,))
        group.create_array("steps", shape=(0,), dtype="int64", chunks=(1,), fill_value=-1)
        group.create_array(
            "attention",
            shape=(0, count, layers, heads, width, width),
            dtype="float16",
            chunks=(1, 1, layers, heads, width, width),
            compressors=_compressor(),
            fill_value=0.0,
        )
        group.create_array(
            "losses", shape=(0,), dtype="float32", chunks=(LOSS_CHUNK,), fill_value=float("nan")
        )
        group.create_array(
            "stats",
            shape=(0, len(statistics), layers, heads),
            dtype="float32",
            chunks=(1, len(statistics), layers, heads),
            compressors=_compressor(),
            fill_value=float("nan"),
        )
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        return cls(zarr.open_group(str(final), mode="r+"))

    def append(
        self, step: int, attention: np.ndarray, stats: np.ndarray, losses: np.ndarray | None = None
    ) -> None:
        """Add one record.

        attention: [K, L, H, n, n] probabilities with n <= N (a padded batch: whatever lies past an
            example's length, e.g. the rows of padding queries, is stored as 0).
        stats: [S, L, H] the statistics in the archive's order.
        losses: [P] the training loss of steps 1 to P (NaN: not known), P <= ``step``; the steps past the
            archive's ``losses`` so far are written (None: none).
        """
        arrays = {name: self.group[name] for name in ("steps", "attention", "stats")}
        target = arrays["attention"].shape[1:]
        n = attention.shape[-1]
        if attention.shape[:-2] != target[:-2] or n > target[-1]:
            raise BertologyError(
                f"A record's attention has shape {attention.shape}, the archive holds {target}."
            )
        padded = np.zeros(target, dtype=np.float16)
        for example, length in enumerate(self.lengths):
            padded[example, ..., :length, :length] = attention[example, ..., :length, :length]
        index = self.recorded
        for array in arrays.values():
            array.resize((index + 1, *array.shape[1:]))
        arrays["attention"][index] = padded
        arrays["stats"][index] = stats.astype(np.float32)
        arrays["steps"][index] = step
        if losses is not None and "losses" in self.group:
            self._append_losses(self.group["losses"], losses)
        self.recorded = index + 1
        self.group.attrs["recorded"] = self.recorded

    @staticmethod
    def _append_losses(array: Any, losses: np.ndarray) -> None:
        """Grow ``array`` to ``losses`` [P] and write the steps it did not hold."""
        known = array.shape[0]
        if len(losses) > known:
            array.resize((len(losses),))
            array[known:] = losses[known:].astype(np.float32)


@dataclass
class MonitorArchive:
    """The complete records of an archive, as read at one moment.

    steps: [T] int; stats: [T, S, L, H] float32; statistics: the S names; lengths: [K] int;
    probe: the probe examples' texts and tokens; model, layers, heads, every: as recorded;
    losses: [P] float32 the training loss of steps 1 to P (NaN: not given; P: the last record's step, 0
    for an archive without losses).
    """

    path: str  # the archive's folder, as messages name it
    model: str
    layers: int
    heads: int
    every: int
    steps: np.ndarray
    stats: np.ndarray
    statistics: list[str]
    lengths: np.ndarray
    probe: ProbeTokens
    losses: np.ndarray
    _files: ArchiveFiles
    _attention: Any

    def __len__(self) -> int:
        return len(self.steps)

    def attention(self, example: int) -> np.ndarray:
        """[T, L, H, n, n] float32: probe example ``example``'s attention at every record, unpadded.

        Raises:
            BertologyError: a chunk's file is missing or damaged (named in the message).
        """
        n = int(self.lengths[example])
        records = [
            _read_chunk(self._files, self._attention, (t, example), (t, example, ..., slice(n), slice(n)))
            for t in range(len(self))
        ]
        shape = (0, self.layers, self.heads, n, n)
        return np.stack(records).astype(np.float32) if records else np.zeros(shape, np.float32)

    def statistic(self, name: str) -> np.ndarray:
        """[T, L, H] one statistic over the records."""
        return self.stats[:, self.statistics.index(name)]


class ArchiveFiles(MutableMapping[str, Any]):
    """The files of an opened archive folder as zarr's keys (``"attention/c/0/1/0/0/0/0"``) to their bytes
    (zarr ``Buffer``), each read when asked for, without following links; read-only.

    A key that is a symbolic link exists (``in``) but reading it raises
    :class:`~bertology.files.beneath.LinkRefused`.
    """

    def __init__(self, folder: OpenFolder) -> None:
        self.folder = folder

    def __getitem__(self, key: str) -> Any:
        from zarr.core.buffer.cpu import Buffer

        try:
            return Buffer.from_bytes(self.folder.read_bytes(key))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.folder.stat(key) is not None

    def __iter__(self) -> Iterator[str]:
        return self.folder.walk()

    def __len__(self) -> int:
        return sum(1 for _ in self.folder.walk())

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError("An attention monitor archive is read-only here.")

    def __delitem__(self, key: str) -> None:
        raise TypeError("An attention monitor archive is read-only here.")


def open_run(path: str | Path | OpenFolder) -> OpenFolder:
    """The run (or archive) folder at ``path``, opened; ``path`` itself when it is open already.

    Raises:
        BertologyError: no folder there.
    """
    if isinstance(path, OpenFolder):
        return path
    try:
        return OpenFolder.at(path)
    except OSError as error:
        raise BertologyError(f"There is no attention monitor archive at {path}.") from error


def archive_folder(run: OpenFolder) -> OpenFolder:
    """The archive :func:`read_archive` opens in ``run``: its ``monitor.zarr`` folder when there is one,
    else ``run`` itself.

    Raises:
        LinkRefused: ``monitor.zarr`` is a symbolic link.
    """
    try:
        return run.folder(ARCHIVE_FOLDER)
    except (FileNotFoundError, NotADirectoryError):
        return run


def _chunk_key(files: ArchiveFiles, array: Any, chunk: tuple[int, ...]) -> str:
    """The key of ``array``'s chunk at grid position ``chunk`` (padded with zeros).

    Raises:
        BertologyError: its file is missing (zarr would silently read the fill value instead).
    """
    key = array.metadata.chunk_key_encoding.encode_chunk_key(chunk + (0,) * (array.ndim - len(chunk)))
    key = f"{array.path}/{key}"
    if key not in files:
        raise BertologyError(
            f"The attention monitor archive {files.folder.label} is missing {files.folder.name_of(key)}: "
            "the archive is damaged or only partly copied."
        )
    return key


def _read_chunk(files: ArchiveFiles, array: Any, chunk: tuple[int, ...], selection: Any) -> np.ndarray:
    """``array[selection]``, which lies within the chunk at grid position ``chunk``, checked.

    Raises:
        BertologyError: the chunk's file is missing or damaged (named in the message).
        LinkRefused: the chunk's file is a symbolic link.
    """
    key = _chunk_key(files, array, chunk)
    try:
        return np.asarray(array[selection])
    except (RuntimeError, ValueError, OSError) as error:  # e.g. Blosc's "error during decompression"
        raise BertologyError(
            f"{files.folder.name_of(key)} in the attention monitor archive is damaged ({error})."
        ) from error


def _records(files: ArchiveFiles, array: Any, count: int) -> np.ndarray:
    """[count, ...] the first ``count`` records of ``array`` (one chunk per record), each chunk checked."""
    return np.stack([_read_chunk(files, array, (t,), t) for t in range(count)]) if count else array[:0]


def _losses(files: ArchiveFiles, array: Any, steps: int) -> np.ndarray:
    """[P] float32: the first ``min(steps, stored)`` values of the ``losses`` array, each chunk checked."""
    size = min(steps, array.shape[0])
    chunks = [
        _read_chunk(files, array, (c,), slice(c * LOSS_CHUNK, min((c + 1) * LOSS_CHUNK, size)))
        for c in range(-(-size // LOSS_CHUNK))
    ]
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


def read_archive(path: str | Path | OpenFolder) -> MonitorArchive:
    """Open the archive at ``path`` (an archive folder or a run folder holding ``monitor.zarr``; a path, or
    a folder already opened, whose files are then read below it without following links).

    Only complete records are returned, so this is safe while training still writes and after a crash.

    Raises:
        BertologyError: no archive there, not a bertology monitor archive, or a file of it missing or
            damaged (named in the message).
        LinkRefused: a file or folder of the archive is a symbolic link.
    """
    import zarr
    from zarr.storage import MemoryStore

    files = ArchiveFiles(archive_folder(open_run(path)))
    folder = files.folder.label
    try:
        group = zarr.open_group(store=MemoryStore(files, read_only=True), mode="r")
        attrs = dict(group.attrs)
    except FileNotFoundError as error:
        raise BertologyError(f"There is no attention monitor archive at {folder}.") from error
    except (ValueError, KeyError, OSError) as error:
        raise BertologyError(
            f"{files.folder.name_of('zarr.json')} cannot be read ({error}); it is damaged."
        ) from error
    if attrs.get("format") != FORMAT:
        raise BertologyError(f"{folder} is not an attention monitor archive of bertology.")
    try:
        count = int(attrs["recorded"])
        probe = attrs["probe"]
        arrays = {name: group[name] for name in ("steps", "stats", "lengths", "attention")}
        if not 0 <= count <= arrays["steps"].shape[0]:
            raise ValueError(f"{count} records, of {arrays['steps'].shape[0]} stored")
        probe_tokens = ProbeTokens(
            texts=probe["texts"],
            texts_b=probe["texts_b"],
            labels=probe["labels"],
            tokens=probe["tokens"],
            segments=probe["segments"],
            truncated=probe["truncated"],
        )
        model, layers, heads = str(attrs["model"]), int(attrs["layers"]), int(attrs["heads"])
        every, statistics = int(attrs["every"]), list(attrs["statistics"])
    except (ValueError, KeyError, TypeError) as error:
        raise BertologyError(
            f"The attention monitor archive {folder} cannot be read ({type(error).__name__}: {error}); "
            "its metadata is damaged."
        ) from error
    archive = MonitorArchive(
        path=folder,
        model=model,
        _files=files,
        layers=layers,
        heads=heads,
        every=every,
        steps=_records(files, arrays["steps"], count).astype(np.int64).reshape(count),
        stats=_records(files, arrays["stats"], count).astype(np.float32),
        statistics=statistics,
        lengths=_read_chunk(files, arrays["lengths"], (0,), slice(None)).astype(np.int64),
        probe=probe_tokens,
        losses=np.zeros(0, np.float32),
        _attention=arrays["attention"],
    )
    if "losses" in group and count:
        archive.losses = _losses(files, group["losses"], int(archive.steps[-1]))
    for example in range(len(archive.lengths)):  # every attention chunk is there, before anything is read
        for record in range(count):
            _chunk_key(files, arrays["attention"], (record, example))
    return archive
