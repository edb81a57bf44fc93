"""Time and peak memory of `bertology probe coref` (GUM) and `probe deps` (GUM SD), before and after.

Usage:
    git worktree add /tmp/old-probes <commit before the change>
    .venv/bin/python benchmarks/bench_probes.py --old /tmp/old-probes [--coref-limit N] [--deps-limit N]

Each command runs as its own process (``python -m bertology ...``, the old code through ``PYTHONPATH``
pointing at the old tree's ``src``) under ``/usr/bin/time`` (wall seconds and maximum resident set
size), old then new, in the same run; the two ``table.csv`` files of each probe are compared cell by
cell. Data: ``$BERTOLOGY_DATA`` or ``../shared/data``. Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def run(source: Path, args: list[str], threads: int) -> tuple[float, float]:
    """Run ``python -m bertology ARGS`` with bertology from ``source``; return (seconds, peak MB)."""
    env = {**os.environ, "PYTHONPATH": str(source / "src"), "OMP_NUM_THREADS": str(threads)}
    with tempfile.NamedTemporaryFile("r", suffix=".time") as timing:
        command = [
            "/usr/bin/time",
            "-f",
            "%e %M",
            "-o",
            timing.name,
            sys.executable,
            "-m",
            "bertology",
            *args,
        ]
        subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        seconds, kilobytes = timing.read().split()[-2:]
    return float(seconds), float(kilobytes) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="A checkout of the code before the change.")
    parser.add_argument("--coref-limit", type=int, default=None, help="GUM documents (default: all 114).")
    parser.add_argument("--deps-limit", type=int, default=None, help="GUM SD sentences (default: all).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "probes")
    args = parser.parse_args()
    gum = Path(os.environ.get("BERTOLOGY_DATA", ROOT.parent / "shared" / "data")) / "gum_v5.1_sd"
    coref = ["probe", "coref", str(gum / "coref_conll"), "--treebank", str(gum / "dep_stanford")]
    coref += [] if args.coref_limit is None else ["--limit", str(args.coref_limit)]
    deps = ["probe", "deps", str(gum / "dep_stanford")]
    deps += [] if args.deps_limit is None else ["--limit", str(args.deps_limit)]
    print("| probe | code | seconds | peak RSS (MB) |\n|---|---|---|---|")
    for name, command in (("coref", coref), ("deps", deps)):
        tables = {}
        for label, source in (("before", args.old), ("after", ROOT)):
            folder = args.out / f"{name}_{label}"
            seconds, megabytes = run(source, [*command, "-o", str(folder)], args.threads)
            tables[label] = pd.read_csv(folder / "table.csv")
            print(f"| {name} | {label} | {seconds:.1f} | {megabytes:.0f} |", flush=True)
        same = tables["before"].equals(tables["after"])
        print(f"| {name} | tables identical | {same} | |", flush=True)
        if not same:
            print(tables["before"].compare(tables["after"]).to_string(), file=sys.stderr)


if __name__ == "__main__":
    main()
