"""Batches of inputs ordered by length within windows: little padding, bounded memory, a fixed order.

Corpus analysis (:func:`bertology.analysis.analyze.corpus_batches`) and the probes (dependency treebanks,
coreference windows, GAP examples) read their inputs as a stream; each :data:`SORT_WINDOW` consecutive
inputs are ordered by length, longest first, before they are cut into batches, so the inputs of a batch
are about as long and the batch, padded to its longest, pads little. Longest first, each window's first
batch takes the most memory and the later ones fit in what it freed; only one window is held at a time.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")

#: Consecutive inputs ordered by length together before batching (see :func:`length_sorted_batches`).
SORT_WINDOW = 1024

#: Batches are padded to a multiple of this many tokens (few distinct shapes, little padding).
PAD_MULTIPLE = 8

#: Batches :func:`prefetched` prepares ahead of the model.
PREFETCH_DEPTH = 4


def iter_batches(items: Iterator[Item], size: int) -> Iterator[list[Item]]:
    """Consecutive lists of ``size`` items (the last one shorter), in order."""
    while batch := list(itertools.islice(items, size)):
        yield batch


def length_sorted_batches(
    items: Iterable[Item],
    length: Callable[[Item], int],
    *,
    batch_size: int,
    window: int = SORT_WINDOW,
) -> Iterator[list[Item]]:
    """Batches of ``batch_size`` items: every ``window`` consecutive items are ordered by ``length``
    (tokens), longest first (a stable sort: ties keep their order), then cut into batches.

    The order does not depend on ``batch_size``. Only one window of items is held at a time.
    """
    for chunk in iter_batches(iter(items), window):
        longest_first = sorted(chunk, key=lambda item: -length(item))
        yield from iter_batches(iter(longest_first), batch_size)


class _End:
    """The producer's last word: the stream ended (``error`` ``None``) or raised ``error``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def prefetched(items: Iterable[Item], depth: int = PREFETCH_DEPTH) -> Iterator[Item]:
    """``items``, produced by a background thread at most ``depth`` ahead of the consumer, so that reading,
    segmenting and encoding a corpus overlap the model's work (the tokenizers' Rust code and torch's
    kernels release the GIL).

    The order is unchanged, and an exception of the producer is raised here at its place in the stream.
    Closing the returned iterator (or leaving a ``for`` loop early, or an exception in its body) stops the
    thread after the item it is making, and waits for it. ``items`` must not share a tokenizer with the
    consumer (each reader here counts tokens with a copy of its own).
    """
    ready: queue.Queue[Item | _End] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(entry: Item | _End) -> bool:
        while not stop.is_set():
            try:
                ready.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(items)
        try:
            for item in iterator:
                if not put(item):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            put(_End(error))
        else:
            put(_End())
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # a generator's files are closed in its own thread

    producer = threading.Thread(target=produce, name="bertology-prefetch", daemon=True)
    producer.start()

    def consume() -> Iterator[Item]:
        try:
            while not isinstance(entry := ready.get(), _End):
                yield entry
            if entry.error is not None:
                raise entry.error
        finally:
            stop.set()
            # waited for, so the producer has closed ``items`` (and any reader processes behind them) and
            # is not still running native code when the interpreter exits (a daemon thread stopped there
            # aborts the process)
            producer.join()

    return consume()
