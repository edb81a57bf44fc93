"""Every option of a distributed command reaches the run: the command line builds the job its workers
start and calls the pool's run with the rest. The cluster is stood in for (no Ray): the pool's run records
what it was given and stops the command, so a dropped or misrouted option fails here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.cli import run_in_process

import bertology.cluster.ablation
import bertology.cluster.analyze
import bertology.cluster.compare
import bertology.cluster.probes
import bertology.cluster.workers
from bertology.analysis.settings import AnalysisSettings
from bertology.cluster.driver import ShardedRun
from bertology.models.loading import ModelSpec


class Recorded(BaseException):
    """Raised by the stand-in run once it has recorded its arguments (stops the command there)."""

    def __init__(self, job: Any, arguments: dict[str, Any]) -> None:
        super().__init__("recorded")
        self.job, self.arguments = job, arguments


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cluster_pool`` yields a stand-in pool holding the job; every ``*_on_pool`` records and stops."""

    class Pool:
        def __init__(self, spec: Any) -> None:
            self.spec = spec

    @contextmanager
    def cluster_pool(spec: Any, options: Any) -> Iterator[Pool]:
        yield Pool(spec)

    def recorder(pool: Pool, *args: Any, **kwargs: Any) -> None:
        raise Recorded(pool.spec, {"args": args, **kwargs})

    monkeypatch.setattr(bertology.cluster.workers, "cluster_pool", cluster_pool)
    for module, name in [
        (bertology.cluster.analyze, "analyze_on_pool"),
        (bertology.cluster.compare, "compare_on_pool"),
        (bertology.cluster.probes, "probe_dependencies_on_pool"),
        (bertology.cluster.probes, "probe_coreference_on_pool"),
        (bertology.cluster.ablation, "ablate_on_pool"),
    ]:
        monkeypatch.setattr(module, name, recorder)


def recorded(args: list[str], capsys: pytest.CaptureFixture[str]) -> Recorded:
    with pytest.raises(Recorded) as caught:
        run_in_process(args, capsys)
    return caught.value


def test_analyze_hands_every_option_to_the_run(
    no_cluster: None, sample_corpus_head: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = sample_corpus_head(6)
    run = recorded(
        ["analyze", str(corpus), "--ray", "local", "--workers", "1", "--limit", "7", "--batch-size", "5",
         "--max-len", "48", "--seed", "3", "--js-tokens", "2", "--convention", "clark", "--weights", "norm",
         "--examples-per-head", "2", "--dtype", "float32", "--device", "cpu", "-o", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    job = run.job
    assert job.model == ModelSpec("default", "cpu", "float32")
    assert job.settings == AnalysisSettings(
        max_length=48,
        limit=7,
        batch_size=5,
        seed=3,
        js_tokens_per_segment=2,
        weights="norm",
        convention="clark",
        examples_per_head=2,
    )
    sharded = run.arguments["sharded"]
    assert isinstance(sharded, ShardedRun) and sharded.on_progress is not None and not sharded.resume
    assert sharded.checkpoint is not None and sharded.checkpoint.parent == tmp_path / "out"


def test_compare_hands_every_option_to_the_run(
    no_cluster: None, sample_corpus_head: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = recorded(
        ["compare", "default", "default", "--corpus", str(sample_corpus_head(6)), "--ray", "local",
         "--limit", "6", "--batch-size", "2", "--max-len", "40", "--seed", "5", "--js-tokens", "3",
         "--level", "token", "--convention", "clark", "--device", "cpu", "-o", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    job = run.job
    assert job.model_a == job.model_b == ModelSpec("default", "cpu", "float32")
    assert job.settings == AnalysisSettings(
        max_length=40, limit=6, batch_size=2, seed=5, js_tokens_per_segment=3, convention="clark"
    )
    assert job.level == "token"
    assert run.arguments["sharded"].on_progress is not None


def test_probe_deps_hands_every_option_to_the_run(
    no_cluster: None, ewt_dev: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = recorded(
        ["probe", "deps", str(ewt_dev), "--ray", "local", "--limit", "9", "--batch-size", "4",
         "--word-mode", "first", "--format", "conllu", "-o", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert run.job.model == ModelSpec() and run.job.mode == "first"
    assert (run.arguments["limit"], run.arguments["batch_size"]) == (9, 4)
    assert run.arguments["treebank_format"] == "conllu"


def test_probe_coref_hands_its_batch_size_to_the_run(
    no_cluster: None, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gum = shared_data / "gum_v5.1_sd"
    run = recorded(
        ["probe", "coref", str(gum / "coref_conll"), "--treebank", str(gum / "dep_stanford"),
         "--ray", "local", "--batch-size", "3", "--limit", "2", "-o", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert run.job.model == ModelSpec()
    assert (run.arguments["batch_size"], run.arguments["limit"]) == (3, 2)
    assert run.arguments["treebank"] == gum / "dep_stanford"


def test_ablate_hands_every_option_to_the_run(
    no_cluster: None,
    classifier_run: Path,
    shared_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task = shared_data / "glue" / "SST-2"
    run = recorded(
        ["ablate", str(classifier_run), "--task", str(task), "--ray", "local", "--max-dev", "6",
         "--batch-size", "4", "--prune", "0.25", "-o", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    job = run.job
    assert job.model == ModelSpec(str(classifier_run.resolve()), classifier=True)
    assert (job.task, job.max_dev, job.batch_size) == (str(task.resolve()), 6, 4)
    assert run.arguments["prune_fraction"] == 0.25
