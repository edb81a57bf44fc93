"""The run archive of the attention monitor: a Zarr v3 group on disk, readable while training writes it.

Layout of ``RUN_DIR/monitor.zarr`` (``T`` records, ``K`` probe examples, ``L`` layers, ``H`` heads, ``N``
the probe set's longest input in tokens, ``S`` statistics):

- ``steps`` [T] int64: the optimizer step of each record (0 = before training).
- ``attention`` [T, K, L, H, N, N] float16: each probe example's attention (row = query, column = key),
  zero past the example's length; one chunk per record and example, Blosc-zstd compressed.
- ``stats`` [T, S, L, H] float32: per-head surface statistics over the probe set
  (:class:`~bertology.stats.surface.SurfaceAccumulator`), NaN where undefined; one chunk per record.
- ``lengths`` [K] int32: real token count of each probe example.
- group attributes: ``format``, ``version``, ``model``, ``layers``, ``heads``, ``max_tokens`` (N),
  ``statistics`` (the S names), ``every`` (steps between records), ``probe`` (``texts``, ``texts_b``,
  ``labels``, ``tokens``, ``segments``, ``truncated``) and ``recorded``, the number of complete records.

Crash safety: the archive is built empty in a sibling folder and renamed into place. A record is then
written in this order: the arrays grow by one record (metadata), the record's chunks are written, then
``recorded`` is raised. Zarr's local store writes every file to a temporary name and renames it, so each
file is either old or new, never half-written. A reader that trusts only ``recorded`` therefore sees
whole records only, during training and after the process is killed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import BertologyError

FORMAT = "bertology-monitor"
VERSION = 1
#: The archive's folder inside a training run folder.
ARCHIVE_FOLDER = "monitor.zarr"


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

    def append(self, step: int, attention: np.ndarray, stats: np.ndarray) -> None:
        """Add one record.

        attention: [K, L, H, n, n] probabilities with n <= N (a padded batch: whatever lies past an
            example's length, e.g. the rows of padding queries, is stored as 0).
        stats: [S, L, H] the statistics in the archive's order.
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
        self.recorded = index + 1
        self.group.attrs["recorded"] = self.recorded


@dataclass
class MonitorArchive:
    """The complete records of an archive, as read at one moment.

    steps: [T] int; stats: [T, S, L, H] float32; statistics: the S names; lengths: [K] int;
    probe: the probe examples' texts and tokens; model, layers, heads, every: as recorded.
    """

    path: Path
    model: str
    layers: int
    heads: int
    every: int
    steps: np.ndarray
    stats: np.ndarray
    statistics: list[str]
    lengths: np.ndarray
    probe: ProbeTokens
    _attention: Any

    def __len__(self) -> int:
        return len(self.steps)

    def attention(self, example: int) -> np.ndarray:
        """[T, L, H, n, n] float32: probe example ``example``'s attention at every record, unpadded."""
        n = int(self.lengths[example])
        return np.asarray(self._attention[: len(self), example, :, :, :n, :n], dtype=np.float32)

    def statistic(self, name: str) -> np.ndarray:
        """[T, L, H] one statistic over the records."""
        return self.stats[:, self.statistics.index(name)]


def read_archive(path: str | Path) -> MonitorArchive:
    """Open the archive at ``path`` (an archive folder or a run folder holding ``monitor.zarr``).

    Only complete records are returned, so this is safe while training still writes and after a crash.

    Raises:
        BertologyError: no archive there, or not a bertology monitor archive.
    """
    import zarr

    folder = Path(path)
    if (folder / ARCHIVE_FOLDER).is_dir():
        folder = folder / ARCHIVE_FOLDER
    try:
        group = zarr.open_group(str(folder), mode="r")
        attrs = dict(group.attrs)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise BertologyError(f"There is no attention monitor archive at {path}.") from error
    if attrs.get("format") != FORMAT:
        raise BertologyError(f"{folder} is not an attention monitor archive of bertology.")
    count = int(attrs["recorded"])
    probe = attrs["probe"]
    return MonitorArchive(
        path=folder,
        model=str(attrs["model"]),
        layers=int(attrs["layers"]),
        heads=int(attrs["heads"]),
        every=int(attrs["every"]),
        steps=np.asarray(group["steps"][:count], dtype=np.int64),
        stats=np.asarray(group["stats"][:count], dtype=np.float32),
        statistics=list(attrs["statistics"]),
        lengths=np.asarray(group["lengths"][:], dtype=np.int64),
        probe=ProbeTokens(
            texts=probe["texts"],
            texts_b=probe["texts_b"],
            labels=probe["labels"],
            tokens=probe["tokens"],
            segments=probe["segments"],
            truncated=probe["truncated"],
        ),
        _attention=group["attention"],
    )
