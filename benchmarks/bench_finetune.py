"""Benchmark `bertology finetune` with its default settings on SST-2, then `bertology watch` on the run.

Runs the command line exactly as a user would, times it (wall clock, and the CPU time of the process),
reads the run's ``run.json`` (optimizer steps, dev accuracy on the full dev set), checks that the saved
model, loaded again with ``load_model(RUN_DIR, classifier=True)``, gives the same dev accuracy, and
times the watch page. The run stays in ``benchmarks/out/sst2_run`` for the ablation benchmarks.
The load average is printed before and after: on a shared machine the wall time is inflated.

Run: ``.venv/bin/python benchmarks/bench_finetune.py [--run-dir benchmarks/out/sst2_run] [finetune options]``
(e.g. ``--threads 1`` on a machine busy with other work).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "glue" / "SST-2"


def timed(command: list[str]) -> tuple[float, float]:
    """Run ``command``; return (wall seconds, CPU seconds of the children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=ROOT / "benchmarks" / "out" / "sst2_run")
    args, extra = parser.parse_known_args()  # the rest goes to 'bertology finetune'
    bertology = [sys.executable, "-m", "bertology"]
    finetune = [*bertology, "finetune", str(SST2), "-o", str(args.run_dir), "--overwrite", *extra]
    print("$", " ".join(finetune[1:]), f"\nload average before: {os.getloadavg()}", flush=True)
    wall, cpu = timed(finetune)
    print(f"load average after: {os.getloadavg()}")
    run = json.loads((args.run_dir / "run.json").read_text())

    import bertology as bt
    from bertology.corpus.readers.glue import read_glue
    from bertology.models.classify import accuracy, predict_logits

    task = read_glue(SST2)
    loaded = bt.load_model(args.run_dir, classifier=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bt.TruncationWarning)
        logits = predict_logits(
            loaded, task.dev.texts, task.dev.texts_b, batch_size=64, max_length=run["settings"]["max_length"]
        )
    reloaded = accuracy(logits, task.label_ids(task.dev))
    page = args.run_dir / "watch.html"
    watch_wall, _ = timed([*bertology, "watch", str(args.run_dir), "-o", str(page)])
    print(
        f"\n| examples | epochs | steps | wall (s) | CPU (s) | dev accuracy ({run['dev_examples']}) "
        "| reloaded model | watch page |\n|---|---|---|---|---|---|---|---|\n"
        f"| {run['train_examples']} | {run['settings']['epochs']} | {run['steps']} | {wall:.0f} | {cpu:.0f} "
        f"| {run['dev_accuracy']:.4f} | {reloaded:.4f} | {watch_wall:.1f} s, "
        f"{page.stat().st_size / 1e6:.1f} MB |"
    )
    print(f"finetune's own timer (load to save): {run['seconds']} s; torch threads: {run['torch_threads']}")


if __name__ == "__main__":
    main()
