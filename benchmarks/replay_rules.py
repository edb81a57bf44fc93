"""Replay a finished training run's records through the training rules and print what decides them
(issue 33): the alerts of the rules as they are now, and per attention record the numbers behind
``no_op_heads`` and ``entropy_collapse``.

The records replayed: the training loss of every step (the archive's ``losses``; for a run written before
they were kept, the 10-step means of ``metrics.jsonl``), the dev evaluations, ``signals.jsonl`` and the
monitor's records (their change since the previous record recomputed from the archive's float16
attention). Records are fed in step order, a step's loss before its signals, as ``finetune`` does.

Run: ``.venv/bin/python benchmarks/replay_rules.py RUN_DIR [--rules default]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--rules", default="default")
    args = parser.parse_args()

    from bertology.training import read_archive
    from bertology.training.compare import head_change
    from bertology.training.rules import AttentionRecord, SignalRecord, Watchdog, select_rules

    archive = read_archive(args.run)
    rows = [json.loads(line) for line in (args.run / "metrics.jsonl").read_text().splitlines()]
    losses = [(step, float(loss)) for step, loss in enumerate(archive.losses, start=1) if np.isfinite(loss)]
    if not losses:
        losses = [(row["step"], row["loss"]) for row in rows if row["split"] == "train"]
    events: list[tuple[int, int, object]] = [(step, 0, ("train", loss)) for step, loss in losses]
    for line in (args.run / "signals.jsonl").read_text().splitlines():
        data = json.loads(line)
        arrays = {k: np.array([np.nan if v is None else v for v in data[k]], dtype=float) for k in
                  ("parameters", "gradient_norm", "weight_norm", "update_norm", "saturation")}  # fmt: skip
        arrays["parameters"] = arrays["parameters"].astype(np.int64)
        record = SignalRecord(data["step"], data["learning_rate"], tuple(data["groups"]), **arrays)
        events.append((data["step"], 1, record))
    attention = [archive.attention(k) for k in range(len(archive.lengths))]  # [T, L, H, n, n] each
    mass = archive.statistic("cls") + archive.statistic("sep")  # [T, L, H]
    entropy = archive.statistic("entropy")
    for t, step in enumerate(archive.steps.tolist()):
        change = None if t == 0 else head_change([a[t - 1] for a in attention], [a[t] for a in attention])
        record = AttentionRecord(step, tuple(archive.statistics), archive.stats[t], change)
        events.append((step, 2, record))
        rise = mass[t] - mass[0]
        top = np.unravel_index(np.nanargmax(rise), rise.shape)
        print(
            f"record step {step}: [CLS]+[SEP] largest rise {rise[top]:+.3f} (layer {top[0]} head {top[1]}: "
            f"{mass[0][top]:.3f} -> {mass[t][top]:.3f}), largest mass {np.nanmax(mass[t]):.3f}; heads with "
            f"entropy > 0.5 nats at the first record: smallest ratio now / first "
            f"{np.nanmin(np.where(entropy[0] > 0.5, entropy[t] / entropy[0], np.inf)):.3f}"
        )
    events += [(row["step"], 3, ("dev", row)) for row in rows if row["split"] == "dev"]

    watchdog = Watchdog(select_rules(args.rules))
    for _, kind, item in sorted(events, key=lambda event: (event[0], event[1])):
        if kind == 0:
            watchdog.train(_, item[1])  # type: ignore[index]
        elif kind == 1:
            watchdog.signals(item)  # type: ignore[arg-type]
        elif kind == 2:
            watchdog.attention(item)  # type: ignore[arg-type]
        else:
            row = item[1]  # type: ignore[index]
            watchdog.dev(row["step"], row["loss"], row.get("accuracy", float("nan")))
    kind = "every step" if len(archive.losses) else "10-step means"
    print(f"training losses replayed: {len(losses)} ({kind})")
    print(f"alerts ({len(watchdog.alerts)}):")
    for alert in watchdog.alerts:
        print(f"  {alert}")


if __name__ == "__main__":
    main()
