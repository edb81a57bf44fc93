"""Keep freed memory in the process from one batch to the next (glibc's malloc only).

glibc gives memory back to the system as it is freed: blocks above ``M_MMAP_THRESHOLD`` are mapped
and unmapped one by one, and free space above ``M_TRIM_THRESHOLD`` at the top of the heap is trimmed;
both thresholds adapt while the program runs. A streaming analysis allocates and frees buffers of the
same few sizes (a ``[batch, heads, N, N]`` tensor or two per layer) batch after batch, so what one batch
gives back the next one faults in again, page by page: on the default model and a 2-core machine about
a fifth of the analysis time went to these page faults (benchmarks/RESULTS.md, "Fourth round").
:func:`keep_freed_memory` fixes the thresholds so that such buffers stay in the process. Peak memory
does not change; what is freed is reused instead of returned until the process ends.

The setting holds for the whole process, so it is a program's choice, never a library side effect:
``bertology analyze`` and ``bertology compare`` make it, and so do the benchmarks; the library's own
functions and classes (``analyze_corpus``, ``CorpusAccumulators``, ...) leave the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

#: mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Blocks up to this size come from the heap (glibc's largest allowed value on 64-bit systems).
MMAP_THRESHOLD = 32 * 2**20
#: Free space kept at the top of the heap before any is given back.
TRIM_THRESHOLD = 1024 * 2**20


@cache
def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (:data:`MMAP_THRESHOLD`, :data:`TRIM_THRESHOLD`) for this
    process, once. Returns whether they were set (``False`` without glibc, e.g. on macOS or musl)."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mapped = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    return bool(mapped) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
