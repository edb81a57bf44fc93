"""Checkpoints of a distributed run, so that a driver that stops can resume where it was.

A checkpoint holds the accumulators merged from the run's first ``k`` shards (merged in shard order, so
a resumed run adds the same numbers in the same order as one that never stopped), ``k`` and the
segments they hold, and what identifies the run: the model, the settings and the corpus file's path,
size and modification time. It is written with :mod:`pickle` to a temporary file in the same folder and
renamed over the last one (an atomic replace), so a driver killed while writing leaves the previous
checkpoint whole. Pickle runs code when read: resume only from checkpoints your own runs wrote.
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertology.errors import BertologyError

#: Seconds between two checkpoints of a running driver (one is also written at the end and when the
#: driver is interrupted).
CHECKPOINT_SECONDS = 60.0


def checkpoint_file(folder: str | Path, kind: str) -> Path:
    """Where a run of ``kind`` (``"analyze"``, ``"compare"``) writing to ``folder`` keeps its checkpoint."""
    return Path(folder) / f"ray-checkpoint-{kind}.pickle"


def corpus_identity(corpus: str | Path) -> dict[str, Any]:
    """The corpus file's absolute path, size and modification time (what a checkpoint must match)."""
    path = Path(corpus).resolve()
    status = path.stat()
    return {"corpus": str(path), "bytes": status.st_size, "modified_ns": status.st_mtime_ns}


@dataclass
class Checkpoint:
    """run: what identifies the run. shards: how many shards (the first ones) ``state`` holds; items: how
    many items (segments, sentences, windows: :attr:`~bertology.accumulator.Accumulator.items`). state:
    their merged accumulators."""

    run: dict[str, Any]
    shards: int
    items: int
    state: Any


class Checkpointer:
    """Keeps a run's checkpoint at ``path`` (nothing when ``path`` is ``None``): :meth:`load` reads it,
    :meth:`save` writes it at most every ``interval`` seconds, or at once with ``force``."""

    def __init__(self, path: Path | None, run: dict[str, Any], interval: float = CHECKPOINT_SECONDS) -> None:
        self.path, self.run, self.interval = path, run, interval
        self.last = time.monotonic()

    def load(self) -> Checkpoint | None:
        """The checkpoint to resume from, ``None`` when there is none.

        Raises:
            BertologyError: the file cannot be read, or it is another run's (another model, corpus or
                setting).
        """
        if self.path is None or not self.path.is_file():
            return None
        try:
            with self.path.open("rb") as file:
                found = pickle.load(file)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
            raise BertologyError(f"Cannot resume from the checkpoint {self.path}: {error}.") from error
        if not isinstance(found, Checkpoint) or found.run != self.run:
            theirs = found.run if isinstance(found, Checkpoint) else {}
            changed = sorted(key for key in {**theirs, **self.run} if theirs.get(key) != self.run.get(key))
            raise BertologyError(
                f"The checkpoint {self.path} is of another run (it differs in: {', '.join(changed)}); run "
                "without --resume to start again."
            )
        return found

    def save(self, shards: int, items: int, state: Any, *, force: bool = False) -> bool:
        """Write the checkpoint if ``force`` or ``interval`` seconds have passed since the last; returns
        whether it was written."""
        if self.path is None or not (force or time.monotonic() - self.last >= self.interval):
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with temporary.open("wb") as file:
            pickle.dump(Checkpoint(self.run, shards, items, state), file, protocol=pickle.HIGHEST_PROTOCOL)
            file.flush()
            os.fsync(file.fileno())  # on disk before it replaces the last one
        os.replace(temporary, self.path)
        self.last = time.monotonic()
        return True
