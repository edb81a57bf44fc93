"""keep_freed_memory: memory freed by one round of large buffers is reused by the next, not faulted in; and
it is the command line's choice, never a side effect of the library."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from pathlib import Path

import pytest

from bertology.allocator import MMAP_THRESHOLD, TRIM_THRESHOLD
from bertology.corpus.segments import sample_corpus

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


GLIBC_ONLY = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "musl" in (ctypes.util.find_library("c") or ""),
    reason="glibc only",
)


@GLIBC_ONLY
def test_a_second_round_of_buffers_reuses_the_freed_memory() -> None:
    # 120 MB written in a round is 30,000 pages: glibc's default gives most of it back and faults it in
    # again; kept, the second round writes into memory already mapped.
    assert _page_faults_of_second_round("default") > 2000
    assert _page_faults_of_second_round("keep") < 200


#: Records every call of the C library's mallopt made through ctypes in this process (and still makes it).
MALLOPT_SPY = """
import ctypes, sys
calls = []
looked_up = ctypes.CDLL.__getattr__
def spying(self, name):
    function = looked_up(self, name)
    if name != "mallopt":
        return function
    def mallopt(*args):
        calls.append(args)
        return function(*args)
    return mallopt
ctypes.CDLL.__getattr__ = spying
"""

LIBRARY_RUN = """
import bertology
from bertology.analysis.settings import AnalysisSettings
from bertology.analysis.analyze import CorpusAccumulators, analyze_corpus
loaded = bertology.load_model()
CorpusAccumulators(loaded)
analyze_corpus(sys.argv[1], loaded, AnalysisSettings(limit=4, batch_size=2))
print("mallopt calls:", calls)
"""

CLI_RUN = """
from bertology.cli import main
sys.argv = ["bertology", "analyze", sys.argv[1], "-o", sys.argv[2], "--limit", "4", "--batch-size", "2"]
try:
    main()
except SystemExit as end:
    assert not end.code, end.code
print("mallopt calls:", calls)
"""


def _mallopt_calls(code: str, *args: str) -> str:
    """The last line ``code`` (run after :data:`MALLOPT_SPY` in a fresh process) prints."""
    result = subprocess.run([sys.executable, "-c", MALLOPT_SPY + code, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@GLIBC_ONLY
def test_the_library_leaves_the_allocator_alone() -> None:
    # A notebook or a server that analyses a corpus keeps glibc's own memory settings.
    assert _mallopt_calls(LIBRARY_RUN, str(sample_corpus())) == "mallopt calls: []"


@GLIBC_ONLY
@pytest.mark.slow
def test_bertology_analyze_keeps_freed_memory(tmp_path: Path) -> None:
    expected = [(-3, MMAP_THRESHOLD), (-1, TRIM_THRESHOLD)]  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (malloc.h)
    calls = _mallopt_calls(CLI_RUN, str(sample_corpus()), str(tmp_path / "out"))
    assert calls == f"mallopt calls: {expected}"
    assert (tmp_path / "out" / "report.html").is_file()
