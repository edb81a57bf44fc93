"""keep_freed_memory: memory freed by one round of large buffers is reused by the next, not faulted in."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

ROUNDS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from bertology.allocator import keep_freed_memory
    assert keep_freed_memory() and keep_freed_memory()  # set once; a second call changes nothing
def round_of_buffers():
    buffers = [np.ones(3_000_000, dtype=np.float32) for _ in range(10)]  # ten 12 MB buffers, written
    del buffers
round_of_buffers()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_of_buffers()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults_of_second_round(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return int(result.stdout.strip())


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
    reason="glibc only",
)
def test_a_second_round_of_buffers_reuses_the_freed_memory() -> None:
    # 120 MB written in a round is 30,000 pages: glibc's default gives most of it back and faults it in
    # again; kept, the second round writes into memory already mapped.
    assert _page_faults_of_second_round("default") > 2000
    assert _page_faults_of_second_round("keep") < 200
