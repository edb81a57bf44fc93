"""Probes and stored head examples on a Ray cluster equal one machine's.

The session's local Ray cluster (``ray_cluster`` in conftest) runs a pool of two one-thread workers per
test; the reference runs in this process on one torch thread, as each worker does.

Tolerances: the probes' tables are float64 sums of the same per-sentence values merged in another order
(rtol 1e-9; 1e-12 for the ablation's accuracies, ratios of the same counts); the stored examples' float32
weights, recomputed for the chosen segments in other batches (rtol 1e-6, atol 1e-7).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from bertology.analysis.analyze import CorpusAnalysis, analyze_corpus, example_segments
from bertology.analysis.examples import chosen_examples, collect_examples
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.cluster.ablation import IMPORTANCE_BATCH, AblationJob, ablate_on_pool
from bertology.cluster.analyze import AnalysisJob, analyze_on_pool
from bertology.cluster.checkpoint import checkpoint_file
from bertology.cluster.driver import ShardedRun
from bertology.cluster.probes import (
    CorefJob,
    DependencyJob,
    probe_coreference_on_pool,
    probe_dependencies_on_pool,
)
from bertology.cluster.workers import ClusterOptions, WorkerPool
from bertology.corpus.segments import sample_corpus
from bertology.interventions.run import AblationRun, classifier_task, run_ablation
from bertology.models.loading import LoadedModel, ModelSpec, load_model
from bertology.probes.coreference import CorefProbe
from bertology.probes.run import probe_coreference, probe_dependencies

pytestmark = pytest.mark.slow  # each test starts a Ray cluster or runs a Ray command

MAX_LENGTH, BATCH, SHARD = 64, 8, 16
#: Sentences of GUM's Stanford-dependency treebank probed: a few documents, several shards.
GUM_SENTENCES = 72
#: GUM documents of the coreference probe, in windows of 4 per batch and 8 per shard: several shards.
GUM_DOCUMENTS, COREF_BATCH, COREF_SHARD = 3, 4, 8


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread here, as on each worker (another count may round float32 sums differently)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gum_dependencies(shared_data: Path) -> Path:
    return shared_data / "gum_v5.1_sd" / "dep_stanford"


@pytest.fixture(scope="module")
def gum_coref(shared_data: Path) -> dict[str, Path]:
    gum = shared_data / "gum_v5.1_sd"
    return {"path": gum / "coref_conll", "treebank": gum / "dep_stanford"}


@pytest.fixture(scope="module")
def local_coref(default_model: LoadedModel, gum_coref: dict[str, Path]) -> CorefProbe:
    return probe_coreference(
        gum_coref["path"],
        default_model,
        treebank=gum_coref["treebank"],
        limit=GUM_DOCUMENTS,
        batch_size=COREF_BATCH,
    ).probe


def assert_same_coref(mine: CorefProbe, expected: CorefProbe) -> None:
    """Every count equal: per head, per baseline, and the documents, windows and mentions left out."""
    assert mine.to_dict() == expected.to_dict()
    pd.testing.assert_frame_equal(mine.table(), expected.table(), check_exact=True)


class Interrupted(Exception):
    pass


#: Dev examples of the ablation: more than two importance batches, so they split across the workers.
ABLATION_EXAMPLES = 2 * IMPORTANCE_BATCH + 7


@pytest.fixture(scope="module")
def ablation_task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GLUE-style two-label task of short sentences of different lengths."""
    task = tmp_path_factory.mktemp("ablation-task")
    text = "the film was long , and the actors seemed tired but the music saved a few scenes"
    words = text.split()
    rows = "".join(
        f"{' '.join(words[index % 5 : index % 5 + 3 + index % 9])} .\t{index % 2}\n"
        for index in range(ABLATION_EXAMPLES)
    )
    for name in ("train.tsv", "dev.tsv"):
        (task / name).write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    return task


@pytest.fixture(scope="module")
def centred_classifier_run(
    tiny_classifier_run: Path, ablation_task: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny classifier (``tiny_classifier_run``: the sweep split by heads and the importance split by
    examples are the same code whatever the model, at a small part of the default model's cost) with its
    decision boundary moved into the widest gap among the middle half of the task's logit differences: the
    random model's logits barely depend on the input, so it would give every example one label and no head
    removal would change a prediction. Where the boundary lies, removing heads flips some predictions."""
    loaded = load_model(str(tiny_classifier_run), classifier=True)
    texts = [line.split("\t")[0] for line in (ablation_task / "dev.tsv").read_text().splitlines()[1:]]
    with torch.no_grad():
        inputs = loaded.tokenizer(texts, padding=True, return_tensors="pt")
        inputs.pop("token_type_ids", None)
        logits = loaded.model(**inputs).logits
        differences = np.sort((logits[:, 1] - logits[:, 0]).numpy())
        gaps = np.diff(differences)
        cut = max(range(len(differences) // 4, 3 * len(differences) // 4), key=lambda i: gaps[i])
        loaded.model.classifier.bias[1] -= float(differences[cut] + differences[cut + 1]) / 2
    run = tmp_path_factory.mktemp("centred_classifier_run")
    loaded.model.save_pretrained(run / "model")
    loaded.tokenizer.save_pretrained(run / "model")
    return run


@pytest.fixture(scope="module")
def local_ablation(centred_classifier_run: Path, ablation_task: Path) -> AblationRun:
    """The local run of the measurements compared (self-attention attribution, computed on the driver either
    way and checked in tests/interventions/test_attention_attribution.py, is left out)."""
    loaded = load_model(str(centred_classifier_run), classifier=True)
    return run_ablation(
        *classifier_task(loaded, ablation_task, None), prune_fraction=0, attribution_examples=0
    )


def stored_examples(analysis: CorpusAnalysis, loaded: LoadedModel, target: Path) -> dict[str, np.ndarray]:
    """What ``save_analysis`` stores as head_examples.npz for ``analysis``, read back."""
    _, chosen, _ = chosen_examples(analysis.patterns, analysis.examples_per_head)
    segments = example_segments(analysis, loaded, {int(index) for index in np.unique(chosen) if index >= 0})
    collect_examples(
        analysis.patterns,
        segments,
        loaded,
        per_head=analysis.examples_per_head,
        max_length=analysis.max_length,
    ).save(target)
    with np.load(target, allow_pickle=False) as stored:
        return {name: stored[name] for name in stored.files}


@pytest.mark.filterwarnings("ignore::bertology.errors.TruncationWarning")
def test_a_ray_analysis_stores_the_same_head_examples(
    ray_cluster: None, default_model: LoadedModel, tmp_path: Path
) -> None:
    settings = AnalysisSettings(max_length=MAX_LENGTH, batch_size=BATCH, examples_per_head=3)
    local = analyze_corpus(sample_corpus(), default_model, settings)
    with WorkerPool(AnalysisJob(ModelSpec(), settings), ClusterOptions(workers=2)) as pool:
        distributed = analyze_on_pool(pool, sample_corpus(), default_model, segments_per_shard=SHARD)
    assert distributed.examples_per_head == 3
    mine = stored_examples(distributed, default_model, tmp_path / "ray.npz")
    expected = stored_examples(local, default_model, tmp_path / "local.npz")
    assert mine.keys() == expected.keys() and len(mine) > 1
    for name, array in expected.items():
        np.testing.assert_array_equal(mine[name], array, err_msg=name)


def test_ray_dependency_probe_equals_a_local_run(
    ray_cluster: None, default_model: LoadedModel, gum_dependencies: Path
) -> None:
    local = probe_dependencies(gum_dependencies, default_model, limit=GUM_SENTENCES, batch_size=BATCH)
    progress: list[tuple[int, int | None]] = []
    with WorkerPool(DependencyJob(ModelSpec(), keep_examples=5), ClusterOptions(workers=2)) as pool:
        distributed = probe_dependencies_on_pool(
            pool,
            gum_dependencies,
            default_model,
            limit=GUM_SENTENCES,
            batch_size=BATCH,
            sentences_per_shard=SHARD,
            sharded=ShardedRun(on_progress=lambda done, total: progress.append((done, total))),
        )
    pd.testing.assert_frame_equal(distributed.probe.to_frame(), local.probe.to_frame(), check_exact=True)
    pd.testing.assert_frame_equal(distributed.probe.table(), local.probe.table(), rtol=1e-9)
    assert (distributed.sentences, distributed.skipped) == (local.sentences, local.skipped)
    assert local.sentences + local.skipped == GUM_SENTENCES
    # the examples are the treebank's first sentences, in its order, with the same attention
    assert [sentence.words for sentence, _ in distributed.examples] == [
        sentence.words for sentence, _ in local.examples[:5]
    ]
    for (_, mine), (_, theirs) in zip(distributed.examples, local.examples, strict=False):
        np.testing.assert_allclose(mine.probs, theirs.probs, rtol=1e-6, atol=1e-7)
    assert len(progress) == -(-GUM_SENTENCES // SHARD) and progress[-1] == (local.sentences, local.sentences)


def test_probe_deps_with_ray_on_the_command_line(
    ray_cluster: None, gum_dependencies: Path, tmp_path: Path
) -> None:
    """The command joins the session's cluster (one worker) and writes what a local run writes."""
    common = [str(gum_dependencies), "--limit", "24"]
    ray_result = CliRunner().invoke(
        app, ["probe", "deps", *common, "-o", str(tmp_path / "ray"), "--ray", "local", "--workers", "1"]
    )
    assert ray_result.exit_code == 0, ray_result.output
    local_result = CliRunner().invoke(app, ["probe", "deps", *common, "-o", str(tmp_path / "local")])
    assert local_result.exit_code == 0, local_result.output
    for name in ("table.csv", "accuracies.csv"):
        pd.testing.assert_frame_equal(
            pd.read_csv(tmp_path / "ray" / name), pd.read_csv(tmp_path / "local" / name), rtol=1e-9
        )
    assert not (tmp_path / "ray" / "ray-checkpoint-probe-deps.pickle").exists()


def test_ray_coreference_probe_equals_a_local_run_and_resumes(
    ray_cluster: None,
    default_model: LoadedModel,
    gum_coref: dict[str, Path],
    local_coref: CorefProbe,
    tmp_path: Path,
) -> None:
    """A run stopped on the driver after its first shard and resumed counts every document, window and
    mention once: the same counts as a local run, from two workers."""
    assert local_coref.documents == GUM_DOCUMENTS and local_coref.windows > 3 * COREF_SHARD
    assert local_coref.out_of_reach.sum() > 0 and local_coref.count() > 0
    run = {
        "treebank": gum_coref["treebank"],
        "limit": GUM_DOCUMENTS,
        "batch_size": COREF_BATCH,
        "windows_per_shard": COREF_SHARD,
    }
    keeping = ShardedRun(checkpoint_file(tmp_path, "probe-coref"), checkpoint_seconds=0)

    def stop_after_one_shard(done: int, total: int | None = None, *, stage: str = "") -> None:
        raise Interrupted

    def record(done: int, total: int | None = None, *, stage: str = "") -> None:
        progress.append((done, total))

    progress: list[tuple[int, int | None]] = []
    with WorkerPool(CorefJob(ModelSpec()), ClusterOptions(workers=2)) as pool:
        with pytest.raises(Interrupted):
            stopping = replace(keeping, on_progress=stop_after_one_shard)
            probe_coreference_on_pool(pool, gum_coref["path"], default_model, sharded=stopping, **run)
        result = probe_coreference_on_pool(
            pool,
            gum_coref["path"],
            default_model,
            sharded=replace(keeping, resume=True, on_progress=record),
            **run,
        )
    resumed, summary = result.probe, result.summary()
    assert_same_coref(resumed, local_coref)
    assert progress[0][0] == 2 * COREF_SHARD  # the first shard came from the checkpoint
    assert progress[-1][0] == progress[-1][1] and progress[-1][0] >= local_coref.windows
    # progress counts windows: no total until the corpus has been read (never the limit, which is documents)
    assert {total for _, total in progress} <= {None, progress[-1][1]}
    assert (
        summary["mentions out of reach (every antecedent before the window)"]
        == local_coref.out_of_reach.sum()
    )


def test_probe_coref_with_ray_on_the_command_line(
    ray_cluster: None, gum_coref: dict[str, Path], tmp_path: Path
) -> None:
    """The command joins the session's cluster (one worker) and writes what a local run writes."""
    common = [str(gum_coref["path"]), "--treebank", str(gum_coref["treebank"]), "--limit", "2"]
    ray_result = CliRunner().invoke(
        app, ["probe", "coref", *common, "-o", str(tmp_path / "ray"), "--ray", "local", "--workers", "1"]
    )
    assert ray_result.exit_code == 0, ray_result.output
    local_result = CliRunner().invoke(app, ["probe", "coref", *common, "-o", str(tmp_path / "local")])
    assert local_result.exit_code == 0, local_result.output
    for name in ("table.csv", "accuracies.csv"):
        pd.testing.assert_frame_equal(
            pd.read_csv(tmp_path / "ray" / name), pd.read_csv(tmp_path / "local" / name), check_exact=True
        )
    assert not (tmp_path / "ray" / "ray-checkpoint-probe-coref.pickle").exists()


def test_ray_ablation_equals_a_local_run(
    ray_cluster: None, centred_classifier_run: Path, ablation_task: Path, local_ablation: AblationRun
) -> None:
    """The sweep split by heads and the importance split by examples, on two workers: the same numbers."""
    loaded = load_model(str(centred_classifier_run), classifier=True)
    stages: dict[str, list[tuple[int, int]]] = {}
    job = AblationJob(ModelSpec(str(centred_classifier_run), classifier=True), str(ablation_task))
    with WorkerPool(job, ClusterOptions(workers=2)) as pool:
        distributed = ablate_on_pool(
            pool,
            loaded,
            prune_fraction=0,
            attribution_examples=0,
            on_progress=lambda done, total=None, *, stage="": stages.setdefault(stage, []).append(
                (done, total)
            ),
        )
    local = local_ablation
    assert distributed.examples == local.examples == ABLATION_EXAMPLES
    assert distributed.ablation.baseline == local.ablation.baseline
    np.testing.assert_array_equal(distributed.ablation.scores, local.ablation.scores)
    assert len(np.unique(local.ablation.scores)) > 1  # removing heads changes some predictions
    np.testing.assert_array_equal(distributed.importance.raw, local.importance.raw)
    np.testing.assert_array_equal(distributed.curves["importance"], local.curves["importance"])
    np.testing.assert_array_equal(distributed.curves["ablation"], local.curves["ablation"])
    heads = loaded.num_layers * loaded.num_heads * ABLATION_EXAMPLES
    assert len(stages["Ablating single heads"]) == 4 and stages["Ablating single heads"][-1] == (heads, heads)
    assert stages["Head importance"][-1] == (ABLATION_EXAMPLES, ABLATION_EXAMPLES)


def test_ablate_with_ray_on_the_command_line(
    ray_cluster: None,
    centred_classifier_run: Path,
    ablation_task: Path,
    local_ablation: AblationRun,
    tmp_path: Path,
) -> None:
    """The command joins the session's cluster (one worker) and writes the local run's per-head numbers."""
    result = CliRunner().invoke(
        app,
        [
            *("ablate", str(centred_classifier_run), "--task", str(ablation_task), "--prune", "0"),
            *("--attribution-examples", "0"),
            *("-o", str(tmp_path), "--ray", "local", "--workers", "1"),
        ],
    )
    assert result.exit_code == 0, result.output
    expected = {"ablation.csv": local_ablation.ablation, "importance.csv": local_ablation.importance}
    for name, measure in expected.items():
        pd.testing.assert_frame_equal(pd.read_csv(tmp_path / name), measure.to_frame(), rtol=1e-12)
