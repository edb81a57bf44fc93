"""Batches of inputs ordered by length within windows: little padding, bounded memory, a fixed order.

Corpus analysis (:func:`bertology.analyze.corpus_batches`) and the probes (dependency treebanks,
coreference windows, GAP examples) read their inputs as a stream; each :data:`SORT_WINDOW` consecutive
inputs are ordered by length, longest first, before they are cut into batches, so the inputs of a batch
are about as long and the batch, padded to its longest, pads little. Longest first, each window's first
batch takes the most memory and the later ones fit in what it freed; only one window is held at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Item = TypeVar("Item")

#: Consecutive inputs ordered by length together before batching (see :func:`length_sorted_batches`).
SORT_WINDOW = 1024

#: Batches are padded to a multiple of this many tokens (few distinct shapes, little padding).
PAD_MULTIPLE = 8


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
