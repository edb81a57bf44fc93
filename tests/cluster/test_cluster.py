"""Corpus analysis on a Ray cluster equals one machine's, through worker deaths and driver restarts.

One local Ray cluster (3 CPUs) and one pool of two workers serve the whole module; the reference is
``analyze_corpus`` in this process, one pass over the same corpus.

Tolerances: a distributed run adds the same float64 sums of its shards in another order than one process:
a few units of 2^-53 relative, so rtol 1e-9 (the per-segment values are computed identically, one torch
thread on each side).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import bertology.analysis.analyze
from bertology.analysis.analyze import CorpusAnalysis, analyze_corpus
from bertology.analysis.comparison import compare_models
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.cluster.analyze import AnalysisJob, analyze_on_pool
from bertology.cluster.checkpoint import checkpoint_file
from bertology.cluster.compare import ComparisonJob, compare_on_pool
from bertology.cluster.driver import ShardedRun
from bertology.cluster.shards import shards_of
from bertology.cluster.workers import ClusterOptions, WorkerPool, import_ray, ray_session
from bertology.corpus.segments import Segment, sample_corpus
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, ModelSpec, load_model

#: Short segments, small batches and shards: the 85 segments of the sample corpus make six shards.
MAX_LENGTH, BATCH, SHARD = 64, 8, 16
JOB = AnalysisJob(ModelSpec(), AnalysisSettings(max_length=MAX_LENGTH, batch_size=BATCH))


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The local references run on one torch thread, as each worker does: torch's float32 kernels may
    round differently with another number of threads (about 1e-8 relative; benchmarks/RESULTS.md),
    which says nothing about the distributed run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pool(ray_cluster: None) -> Iterator[WorkerPool[AnalysisJob]]:
    with WorkerPool(JOB, ClusterOptions(workers=2)) as workers:
        yield workers


@pytest.fixture(scope="module")
def local_sample(default_model: LoadedModel) -> CorpusAnalysis:
    return analyze_corpus(
        sample_corpus(), default_model, AnalysisSettings(max_length=MAX_LENGTH, batch_size=BATCH)
    )


def assert_same_analysis(distributed: CorpusAnalysis, local: CorpusAnalysis) -> None:
    """heads.csv's table, the JS divergences and summary.json agree to 1e-9 relative (``seconds`` aside, and
    the corpus cache's use: the first of the two runs wrote the entry the other read)."""
    heads, expected = distributed.heads_frame(), local.heads_frame()
    assert list(heads.columns) == list(expected.columns)
    numbers = expected.select_dtypes("number").columns
    np.testing.assert_allclose(heads[numbers].to_numpy(float), expected[numbers].to_numpy(float), rtol=1e-9)
    assert (heads["label"] == expected["label"]).all()
    assert (heads["label_segment"] == expected["label_segment"]).all()
    np.testing.assert_allclose(distributed.distances.js_sum, local.distances.js_sum, rtol=1e-9)
    assert distributed.distances.tokens == local.distances.tokens
    summary, expected_summary = distributed.summary(), local.summary()
    for name in ("seconds", "corpus_cache", "corpus_cache_key"):
        summary.pop(name, None), expected_summary.pop(name, None)
    assert summary == expected_summary


def test_shards_are_whole_batches_in_order() -> None:
    sizes = [3, 3, 2, 3, 3, 2, 1]
    batches = [[Segment(f"{i}-{j}", None, "x") for j in range(size)] for i, size in enumerate(sizes)]
    shards = list(shards_of(batches, 5))
    assert [shard.number for shard in shards] == [0, 1, 2, 3]
    assert [shard.first_segment for shard in shards] == [0, 6, 11, 16]
    assert [[len(batch) for batch in shard.batches] for shard in shards] == [[3, 3], [2, 3], [3, 2], [1]]
    assert [batch for shard in shards for batch in shard.batches] == batches
    with pytest.raises(BertologyError, match="at least 1 segment"):
        next(shards_of(batches, 0))


def test_ray_run_equals_a_local_run_on_the_sample_corpus(
    pool: WorkerPool[AnalysisJob], default_model: LoadedModel, local_sample: CorpusAnalysis
) -> None:
    progress: list[tuple[int, int | None]] = []
    distributed = analyze_on_pool(
        pool,
        sample_corpus(),
        default_model,
        segments_per_shard=SHARD,
        sharded=ShardedRun(on_progress=lambda done, total: progress.append((done, total))),
    )
    assert_same_analysis(distributed, local_sample)
    assert [done for done, _ in progress] == [16, 32, 48, 64, 80, 85]  # one report per shard, in order
    assert progress[-1] == (85, 85)


def test_ray_run_equals_a_local_run_on_ud_ewt_dev(
    pool: WorkerPool[AnalysisJob], default_model: LoadedModel, ewt_dev: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CoNLL-U input, windows of 40 segments sorted by length, shards of 24 that cross the windows, on a
    worker of its own (its job reads 150 segments in batches of 16) beside the module's two."""
    monkeypatch.setattr(bertology.analysis.analyze, "SORT_WINDOW", 40)
    settings = AnalysisSettings(max_length=MAX_LENGTH, limit=150, batch_size=16)
    local = analyze_corpus(ewt_dev, default_model, settings)
    with WorkerPool(AnalysisJob(ModelSpec(), settings), ClusterOptions(workers=1)) as on_ewt:
        distributed = analyze_on_pool(on_ewt, ewt_dev, default_model, segments_per_shard=24)
    assert local.segments == 150
    assert_same_analysis(distributed, local)


def test_a_killed_worker_is_restarted_and_the_result_is_unchanged(
    pool: WorkerPool[AnalysisJob], default_model: LoadedModel, local_sample: CorpusAnalysis
) -> None:
    """SIGKILL one worker once the first shard is merged, while it still holds queued shards: Ray restarts
    it, its shards run again, and every segment is counted once."""
    ray = import_ray()
    pids = ray.get([actor.pid.remote() for actor in pool.actors])

    def kill_once(done: int, total: int | None = None, *, stage: str = "") -> None:
        if done == BATCH:
            os.kill(pids[0], signal.SIGKILL)

    distributed = analyze_on_pool(
        pool,
        sample_corpus(),
        default_model,
        segments_per_shard=BATCH,
        sharded=ShardedRun(on_progress=kill_once),
    )
    assert ray.get(pool.actors[0].pid.remote()) != pids[0]  # the worker was restarted
    assert_same_analysis(distributed, local_sample)


class Interrupted(Exception):
    pass


def test_a_stopped_driver_resumes_from_its_checkpoint(
    pool: WorkerPool[AnalysisJob],
    default_model: LoadedModel,
    local_sample: CorpusAnalysis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoint = checkpoint_file(tmp_path, "analyze")
    run = {"segments_per_shard": SHARD}
    keeping = ShardedRun(checkpoint, checkpoint_seconds=0)

    def saved() -> tuple[int, int]:
        with checkpoint.open("rb") as file:
            found = pickle.load(file)
        return found.shards, found.items

    def stop_after_three_shards(done: int, total: int | None = None, *, stage: str = "") -> None:
        assert saved() == (done // SHARD, done)  # written as the run goes, not only when it stops
        if done >= 3 * SHARD:
            raise Interrupted

    with pytest.raises(Interrupted):
        stopping = replace(keeping, on_progress=stop_after_three_shards)
        analyze_on_pool(pool, sample_corpus(), default_model, sharded=stopping, **run)
    assert saved() == (3, 3 * SHARD)

    progress: list[int] = []
    resumed = analyze_on_pool(
        pool,
        sample_corpus(),
        default_model,
        sharded=replace(keeping, resume=True, on_progress=lambda done, *_, **__: progress.append(done)),
        **run,
    )
    assert progress == [64, 80, 85]  # only the three shards left were run
    assert_same_analysis(resumed, local_sample)

    # The same workers under another job's settings: the checkpoint is refused before any shard runs.
    monkeypatch.setattr(pool, "spec", replace(JOB, settings=replace(JOB.settings, limit=40)))
    with pytest.raises(BertologyError, match=r"is of another run .*differs in: limit"):
        analyze_on_pool(pool, sample_corpus(), default_model, sharded=replace(keeping, resume=True), **run)


def test_a_comparison_on_ray_equals_a_local_one(
    ray_cluster: None, default_model: LoadedModel, tiny_model_dirs: dict[str, Path]
) -> None:
    """Both analyses and the cross-model distances; two tokenizers, so words are compared, their query
    words sampled by segment number."""
    other = str(tiny_model_dirs["roberta"])
    model_b = load_model(other)
    settings = AnalysisSettings(max_length=MAX_LENGTH, limit=40, batch_size=BATCH)
    local = compare_models(default_model, model_b, sample_corpus(), settings)
    with WorkerPool(
        ComparisonJob(ModelSpec(), ModelSpec(other), settings), ClusterOptions(workers=1)
    ) as pool:
        distributed = compare_on_pool(pool, sample_corpus(), default_model, model_b, segments_per_shard=BATCH)
    assert distributed.level == local.level == "word"
    assert distributed.query_units == local.query_units
    np.testing.assert_allclose(distributed.matching.distance, local.matching.distance, rtol=1e-9)
    assert (distributed.matching.b_of_a == local.matching.b_of_a).all()
    assert_same_analysis(distributed.a, local.a)
    assert_same_analysis(distributed.b, local.b)


@pytest.mark.slow
def test_the_command_line_writes_the_files_of_a_local_run(
    ray_cluster: None, default_model: LoadedModel, tmp_path: Path
) -> None:
    """``bertology analyze --ray local`` in this process (it joins the running cluster) writes heads.csv,
    head_js_divergence.csv and summary.json with the local run's numbers, and no checkpoint is left."""
    corpus = sample_corpus()
    options = ["--max-len", str(MAX_LENGTH), "--batch-size", str(BATCH), "--limit", "40"]
    result = CliRunner().invoke(
        app, ["analyze", str(corpus), *options, "--ray", "local", "--workers", "1", "-o", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    local = analyze_corpus(
        corpus, default_model, AnalysisSettings(max_length=MAX_LENGTH, batch_size=BATCH, limit=40)
    )
    heads = pd.read_csv(tmp_path / "heads.csv")
    expected = local.heads_frame()
    numbers = expected.select_dtypes("number").columns
    np.testing.assert_allclose(heads[numbers].to_numpy(float), expected[numbers].to_numpy(float), rtol=1e-9)
    divergence = pd.read_csv(tmp_path / "head_js_divergence.csv", index_col=0).to_numpy()
    np.testing.assert_allclose(divergence, local.distances.distance, rtol=1e-9)
    summary, expected_summary = json.loads((tmp_path / "summary.json").read_text()), local.summary()
    summary.pop("seconds"), expected_summary.pop("seconds")
    assert summary == expected_summary
    assert not checkpoint_file(tmp_path, "analyze").exists()


def test_ray_options_need_ray(tmp_path: Path) -> None:
    corpus = str(sample_corpus())
    result = CliRunner().invoke(app, ["analyze", corpus, "--workers", "2", "-o", str(tmp_path)])
    message = " ".join(result.output.replace("│", " ").split())  # the usage error, out of its box
    assert result.exit_code == 2 and "--threads-per-worker and --resume apply only with --ray." in message


def test_a_missing_ray_or_an_unreachable_cluster_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    ray = import_ray()
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with (
        pytest.raises(BertologyError, match=rf"Cannot reach the Ray cluster at 127.0.0.1:{port} \("),
        ray_session(ClusterOptions(f"127.0.0.1:{port}")),
    ):
        pass
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BertologyError, match=r"pip install bertology\[ray\]"):
        import_ray()


def test_a_worker_that_cannot_load_the_model_says_why(ray_cluster: None, tmp_path: Path) -> None:
    with pytest.raises(BertologyError, match="There is no model directory at"):
        WorkerPool(AnalysisJob(ModelSpec(str(tmp_path / "missing"))), ClusterOptions(workers=1))


#: ``python -c`` for a `bertology` command line whose driver stays in its merge loop after writing the
#: checkpoint of its first shard (until a signal interrupts the pause), so a Ctrl-C lands mid-run however
#: slow the machine is: without it the first checkpoint may be the one written as the run ends, and the
#: signal then races the run's last second (exit 0 once the process has finished).
PAUSED_AFTER_FIRST_CHECKPOINT = """
import sys, time
from bertology.cli import main
from bertology.cluster import driver

class PausedAfterFirst(driver.Checkpointer):
    paused = False

    def save(self, shards, items, state, *, force=False):
        written = super().save(shards, items, state, force=True)
        if not PausedAfterFirst.paused:
            PausedAfterFirst.paused = True
            time.sleep(600)
        return written

driver.Checkpointer = PausedAfterFirst
sys.argv = ["bertology", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_ctrl_c_on_a_ray_run_exits_130_and_says_that_resume_continues_it(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) once `bertology analyze --ray local`
    has written its first checkpoint: exit code 130 and a message naming the checkpoint and --resume
    (before, the driver stopped silently with exit code 0); the checkpoint keeps the shard done."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sample_corpus().read_text(encoding="utf-8") * 4, encoding="utf-8")
    output = tmp_path / "out"
    checkpoint = checkpoint_file(output, "analyze")
    command = [sys.executable, "-c", PAUSED_AFTER_FIRST_CHECKPOINT, "analyze", str(corpus), "--ray", "local"]
    command += ["--workers", "1", "--batch-size", "2", "-o", str(output)]
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as driver:
        deadline = time.monotonic() + 240
        while not checkpoint.exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if driver.poll() is not None or not checkpoint.exists():
            driver.kill()
            pytest.fail(f"no checkpoint while the run went on: {driver.communicate(timeout=60)[1]}")
        os.killpg(driver.pid, signal.SIGINT)
        _, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 130, stderr
    message = " ".join(stderr.split())
    assert f"Interrupted: stopped by Ctrl-C; the work done is kept in {checkpoint}" in message
    assert "the same command with --resume continues it." in message
    with checkpoint.open("rb") as file:
        assert pickle.load(file).shards == 1
