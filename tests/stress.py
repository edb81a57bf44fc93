"""`make test-stress`: the suite's flaky-prone tests, three times in a row, while as many busy processes as
there are cores keep every core busy; exits 1 if any round fails (not part of `make test`).

Flaky-prone are the tests whose outcome could depend on timing, load or the order of work: every browser
test (pages drawn asynchronously in Chromium), the server's concurrency and race tests, the Ray runs and the
tests that kill or interrupt processes, and the numerical equality tests (float32 sums whose order depends
on batching and threads). The busy processes stop by themselves after :data:`BUSY_SECONDS` even if this
script is killed.

    python tests/stress.py [--rounds 3] [--busy N] [pytest arguments ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: The flaky-prone tests: paths from the checkout's root (a module, or a module::test).
FLAKY_PRONE = [
    *sorted(str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*_browser.py")),
    "tests/server/test_server.py::test_health_answers_at_once_while_every_slot_is_busy",
    "tests/server/test_server.py::test_requests_of_clients_that_left_are_not_computed",
    "tests/server/test_server.py::test_concurrent_requests_get_their_own_answers",
    "tests/server/test_server_runs.py::test_watch_pages_are_built_within_the_timeout_and_the_parallel_limit",
    "tests/server/test_server_race.py",
    "tests/cluster/test_cluster.py::test_ctrl_c_on_a_ray_run_exits_130_and_says_that_resume_continues_it",
    "tests/cluster/test_cluster.py::test_a_killed_worker_is_restarted_and_the_result_is_unchanged",
    "tests/cluster/test_cluster.py::test_ray_run_equals_a_local_run_on_ud_ewt_dev",
    "tests/cli/test_index_safety.py::test_index_killed_at_any_moment_opens_as_the_old_or_the_new_index",
    "tests/cli/test_output_safety.py",
    "tests/files/test_swap.py",
    "tests/corpus/test_reader_processes.py::test_ctrl_c_stops_the_readers",
    "tests/corpus/test_reader_processes.py::test_readers_die_when_their_parent_is_killed",
    "tests/corpus/test_reader_processes.py::test_a_reader_that_dies_is_reported_naming_the_file",
    "tests/corpus/test_cache.py",
    "tests/training/test_finetune.py",
    "tests/interventions/test_allennlp_convention.py",
]

#: How the rounds run pytest: as `make test` does (two workers, a module on one).
PYTEST = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]

#: The longest a busy process runs (it also stops when this script ends).
BUSY_SECONDS = 3 * 3600

BUSY_LOOP = f"import time\nend = time.monotonic() + {BUSY_SECONDS}\nwhile time.monotonic() < end:\n    pass\n"


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="how many times to run the tests (3)")
    parser.add_argument("--busy", type=int, default=cores(), help="busy processes (one per core)")
    options, pytest_args = parser.parse_known_args()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(options.busy)]
    env = {**os.environ, "CI": os.environ.get("CI") or "1"}  # under CI's rules: a skip fails
    failed = []
    try:
        for round_number in range(1, options.rounds + 1):
            start = time.monotonic()
            print(f"stress round {round_number} of {options.rounds}, {len(busy)} busy processes", flush=True)
            command = [sys.executable, "-m", "pytest", *PYTEST, *FLAKY_PRONE, *pytest_args]
            code = subprocess.run(command, cwd=TESTS.parent, env=env, check=False).returncode
            print(f"stress round {round_number}: exit {code} in {time.monotonic() - start:.0f} s", flush=True)
            if code != 0:
                failed.append(round_number)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    print(f"stress: {options.rounds - len(failed)} of {options.rounds} rounds passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
