"""The training rules on real SST-2 runs of the default model: a divergence stops the run when asked to and
is named before what it does to the gradients and activations; a healthy run raises nothing
(benchmarks/RESULTS.md records these runs' rule outcomes)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertology.training import read_archive

BERTOLOGY = [sys.executable, "-m", "bertology"]
#: The divergence runs of issue 33: 10 steps of 32 sentences, signals and attention every 2 steps.
DIVERGING = ("--max-train", "320", "--watch-every", "2", "--probe-set", "4", "--threads", "1")
#: Rules whose alerts a divergence brings about.
CONSEQUENCES = {"vanishing_gradient", "saturated_activation"}


def finetune(sst2: Path, run_dir: Path, *args: str) -> dict:
    result = subprocess.run(
        [*BERTOLOGY, "finetune", str(sst2), "-o", str(run_dir), *args],
        capture_output=True, text=True, timeout=900, env=os.environ,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads((run_dir / "run.json").read_text())


@pytest.fixture
def sst2(shared_data: Path) -> Path:
    return shared_data / "glue" / "SST-2"


@pytest.mark.slow
def test_a_divergence_at_lr_0_5_stops_the_run(sst2: Path, tmp_path: Path) -> None:
    run = finetune(sst2, tmp_path / "run", "--lr", "0.5", *DIVERGING, "--max-dev", "64",
                   "--stop-on", "exploding_gradient")  # fmt: skip
    assert run["status"] == "stopped" and run["steps"] <= 10
    assert run["stopped_by"]["rule"] == "exploding_gradient" and run["stopped_by"]["step"] == run["steps"]
    # Every step's training loss is in the archive, and the rule's condition holds on it at the stop:
    # the mean of the last 10 losses (all of them, so far) above 10 x the lowest earlier such mean.
    losses = read_archive(tmp_path / "run").losses.astype(np.float64)
    assert len(losses) == run["steps"] and np.isfinite(losses[0])
    means = [float(np.mean(losses[max(0, i - 9) : i + 1])) for i in range(len(losses))]
    assert not math.isfinite(means[-1]) or means[-1] > 10 * min(means[:-1])


@pytest.mark.slow
def test_a_divergence_at_lr_1000_is_named_before_its_consequences(sst2: Path, tmp_path: Path) -> None:
    run = finetune(sst2, tmp_path / "run", "--lr", "1000", *DIVERGING, "--max-dev", "64")
    alerts = run["alerts"]
    rules = [alert["rule"] for alert in alerts]
    assert "exploding_gradient" in rules
    divergence = rules.index("exploding_gradient")
    assert not CONSEQUENCES & set(rules[:divergence])  # no vanishing gradient or saturation before it
    follows = f"exploding_gradient at step {alerts[divergence]['step']}"
    later = [alert for alert in alerts[divergence:] if alert["rule"] != "exploding_gradient"]
    assert later and all(alert["follows"] == follows for alert in later)


@pytest.mark.slow
def test_a_healthy_run_of_200_steps_raises_no_alert(sst2: Path, tmp_path: Path) -> None:
    run = finetune(
        sst2, tmp_path / "run", "--max-train", "1600", "--batch-size", "8", "--max-len", "32",
        "--max-dev", "128", "--eval-every", "100", "--probe-set", "4", "--threads", "1",
    )  # fmt: skip
    assert run["status"] == "finished" and run["steps"] == 200 and len(run["rules"]) == 12
    assert run["alerts"] == []
    assert run["dev_accuracy"] > 0.7  # it learned
