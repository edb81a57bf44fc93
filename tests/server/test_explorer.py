"""The explorer: each head's stored top examples (the true top-k of its pattern score over the corpus,
checked by capturing every segment alone), and the explorer's routes over an analysis folder with a
dependency probe and an ablation beside it (known answers), paths and damaged files refused.

Tolerances: stored example scores (float32, computed per segment alone) against the statistics' column,
atol 1e-6; the map is the same seeded MDS of the same float64 distances, through JSON, atol 1e-6.
"""

from __future__ import annotations

import itertools
import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
from fastapi.testclient import TestClient
from support.run_folders import MAX_LENGTH, PER_HEAD, write_analysis

from bertology.analysis.analyze import CorpusAnalysis, corpus_batches
from bertology.analysis.examples import EXAMPLES_FILE, HeadExamples, example_patterns
from bertology.analysis.patterns import PATTERNS, PatternAccumulator
from bertology.attention.capturing import capture_batch
from bertology.errors import BertologyError, TruncationWarning
from bertology.models.loading import LoadedModel
from bertology.report.analysis import save_analysis
from bertology.report.plots import label_style
from bertology.server import create_app
from bertology.stats.rows import SpecialTokens


@pytest.fixture(scope="module")
def analysed(
    default_model: LoadedModel, sample_corpus_head: object, tmp_path_factory: pytest.TempPathFactory
) -> tuple[CorpusAnalysis, Path]:
    corpus = sample_corpus_head(24)  # type: ignore[operator]
    folder = tmp_path_factory.mktemp("explorer") / "runs" / "analysis"
    return write_analysis(corpus, default_model, folder), folder


def test_stored_examples_are_the_true_top_k(
    analysed: tuple[CorpusAnalysis, Path], default_model: LoadedModel
) -> None:
    analysis, folder = analysed
    examples = HeadExamples.load(folder / EXAMPLES_FILE)
    segments = list(
        itertools.chain.from_iterable(
            corpus_batches(analysis.corpus, default_model.tokenizer, max_length=MAX_LENGTH)
        )
    )
    assert len(segments) == analysis.segments > 2 * PER_HEAD
    # Brute force: every segment captured alone, its pattern scores from a one-segment accumulator.
    scores = np.empty((len(segments), len(PATTERNS), *examples.patterns.shape))
    attention = []
    for index, segment in enumerate(segments):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TruncationWarning)  # cut as the analysis cut them
            batch = capture_batch(
                [segment.text_a], [segment.text_b], model=default_model, max_length=MAX_LENGTH
            )
        alone = PatternAccumulator(SpecialTokens.of(default_model))
        alone.update(batch)
        assert alone.best_score is not None
        scores[index] = alone.best_score
        attention.append(batch.probs[0].numpy())
    chosen = example_patterns(analysis.patterns)
    assert (examples.patterns == chosen).all()
    assert set(chosen.ravel()) > {"broad"}  # more than one pattern ranks examples
    for (layer, head), pattern in np.ndenumerate(chosen):
        column = scores[:, PATTERNS.index(pattern), layer, head]
        order = sorted(range(len(segments)), key=lambda index: (-column[index], index))[:PER_HEAD]
        stored = examples.head(layer, head)
        assert [example.rank for example in stored] == list(range(PER_HEAD))
        # Scores (<= 1) of the analysis's padded batches against one segment at a time: float32 sums over the
        # segment's tokens reordered, a few u = 6e-8 (seen 9e-8); 1e-6 leaves a margin.
        np.testing.assert_allclose([example.score for example in stored], column[order], rtol=0, atol=1e-6)
        for example, index in zip(stored, order, strict=True):
            tied = abs(column[example.segment] - column[index]) < 1e-6
            assert example.segment == index or tied, (layer, head, example.rank)
            probs = attention[example.segment][layer, head]
            assert example.codes.shape == probs.shape
            assert np.abs(example.probs - probs).max() <= 1 / 510 + 1e-4  # 8-bit codes of that attention
            assert example.tokens.tokens[0] == "[CLS]" and len(example.tokens.tokens) == probs.shape[0]


def test_top_k_is_the_same_merged_from_shards() -> None:
    rng = np.random.default_rng(0)
    scores = rng.random((len(PATTERNS), 2, 3, 40))  # [patterns, layers, heads, segments]
    kept = torch.from_numpy(scores)
    whole, first, second = (PatternAccumulator(keep=4) for _ in range(3))
    whole._keep_best(kept, torch.arange(40).expand(kept.shape))
    first._keep_best(kept[..., :25], torch.arange(25).expand(kept[..., :25].shape))
    second._keep_best(kept[..., 25:], torch.arange(25, 40).expand(kept[..., 25:].shape))
    assert first._top_score is not None and first._top_segment is not None
    second._keep_best(first._top_score, first._top_segment)  # as merge() folds another shard in
    expected = np.argsort(-scores, axis=-1, kind="stable")[..., :4]
    assert (whole.top_segment == expected).all() and (second.top_segment == expected).all()


def test_no_examples_file_with_zero_examples(
    analysed: tuple[CorpusAnalysis, Path], default_model: LoadedModel, tmp_path: Path
) -> None:
    analysis, _ = analysed
    analysis_without = CorpusAnalysis(**{**analysis.__dict__, "examples_per_head": 0})
    save_analysis(analysis_without, default_model, tmp_path)
    assert (tmp_path / "heads.csv").is_file() and not (tmp_path / EXAMPLES_FILE).exists()


def test_a_damaged_examples_file_is_named(analysed: tuple[CorpusAnalysis, Path], tmp_path: Path) -> None:
    _, folder = analysed
    cut = tmp_path / EXAMPLES_FILE
    cut.write_bytes((folder / EXAMPLES_FILE).read_bytes()[:5000])
    with pytest.raises(BertologyError, match="not a readable examples file"):
        HeadExamples.load(cut)


# --- The explorer's routes ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(analysed: tuple[CorpusAnalysis, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The analysis beside a dependency probe and an ablation of known values, a secret outside."""
    analysis, folder = analysed
    root = folder.parent
    layers, heads = analysis.surface.num_layers, analysis.surface.num_heads
    layer, head = np.indices((layers, heads)).reshape(2, -1)
    deps = root / "probes" / "deps"
    deps.mkdir(parents=True)
    rows = []
    for relation, direction in itertools.product(["all", "nsubj", "det"], [0, 1]):
        accuracy = (layer * heads + head) / (layers * heads) * (0.5 if relation == "det" else 0.9)
        rows.append(
            pd.DataFrame(
                {
                    "relation": relation,
                    "direction": direction,
                    "layer": layer,
                    "head": head,
                    "accuracy": accuracy + 0.01 * direction,
                    "count": 50,
                }
            )
        )
    pd.concat(rows).to_csv(deps / "accuracies.csv", index=False)
    pd.DataFrame(
        {
            "relation": ["all", "nsubj", "det"],
            "count": [100, 50, 50],
            "best_head": ["5-11"] * 3,
            "accuracy": [0.91, 0.91, 0.51],
            "baseline_accuracy": [0.5, 0.4, 0.6],  # "all" ties "nsubj" in accuracy, but gains less
        }
    ).to_csv(deps / "table.csv", index=False)
    coref = root / "coref"
    coref.mkdir()
    pd.DataFrame(
        {
            "type": "pronoun",
            "layer": layer,
            "head": head,
            "accuracy": (layer * heads + head) / 100,
            "count": 40,
        }
    ).to_csv(coref / "accuracies.csv", index=False)
    ablation = root / "ablation"
    ablation.mkdir()
    change = -(layer * heads + head) / 1000.0
    pd.DataFrame({"layer": layer, "head": head, "accuracy": 0.9 + change, "change": change}).to_csv(
        ablation / "ablation.csv", index=False
    )
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(folder / "heads.csv", outside / "heads.csv")
    (root / "leak").mkdir()
    (root / "leak" / "report.html").write_text("<title>leak</title>")
    for name in ("heads.csv", "summary.json", "head_js_divergence.csv"):
        target = outside / name
        if not target.exists():
            shutil.copy(folder / name, target)
        (root / "leak" / name).symlink_to(target)
    return root


@pytest.fixture(scope="module")
def client(default_model: LoadedModel, runs: Path) -> Iterator[TestClient]:
    with TestClient(create_app([default_model], runs=runs)) as test_client:
        yield test_client


def test_runs_list_links_the_explorer(client: TestClient) -> None:
    listed = {run["path"]: run for run in client.get("/api/runs").json()["runs"]}
    assert listed["analysis"]["explore"] == "/explore?run=analysis"
    page = client.get("/explore?run=analysis")
    assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]


def test_the_analysis_overview(client: TestClient, analysed: tuple[CorpusAnalysis, Path]) -> None:
    analysis, _ = analysed
    answer = client.post("/api/explore/analysis", json={"run": "analysis"}).json()
    assert (answer["layers"], answer["heads"]) == (6, 12)
    assert answer["labels"] == analysis.patterns.labels.tolist()
    np.testing.assert_allclose(answer["statistics"]["score_broad"], analysis.patterns.scores["broad"])
    # The report's map: the same seeded MDS of the distances the run saved at full precision, so exact in
    # practice (seen 0); 1e-6 allows a last-digit difference in a distance read back.
    np.testing.assert_allclose(answer["map"], analysis.mds(), atol=1e-6)
    assert answer["examples_per_head"] == PER_HEAD
    assert answer["summary"]["examples_per_head"] == PER_HEAD  # summary.json records --examples-per-head
    assert answer["related"] == {
        "dependency": "probes/deps",
        "coreference": "coref",
        "ablation": "ablation",
        "ablation_model": None,  # its folder has no summary.json: not taken for the analysis's model
        "ablation_same_model": False,
        "patching": None,  # no patching run in the runs folder
        "circuit": None,  # nor a circuit run
    }
    # the labels' colours are the report's map's (matplotlib's tab10 order, grey for none)
    tab10 = [matplotlib.colors.to_hex(colour) for colour in matplotlib.colormaps["tab10"].colors]
    expected = {
        "next": tab10[0],
        "previous": tab10[1],
        "delimiters": tab10[5],
        "broad": tab10[6],
        "none": tab10[7],
    }
    present = set(analysis.patterns.labels.ravel())
    assert answer["label_colours"] == {label: expected[label] for label in present}
    assert answer["label_colours"] == {label: label_style(label)[0] for label in present}


def test_a_head_shows_its_neighbours_relations_and_ablation(
    client: TestClient, analysed: tuple[CorpusAnalysis, Path]
) -> None:
    analysis, _ = analysed
    answer = client.post("/api/explore/head", json={"run": "analysis", "layer": 2, "head": 5}).json()
    assert answer["label"] == analysis.patterns.labels[2, 5]
    assert answer["statistics"]["entropy"] == pytest.approx(analysis.surface["entropy"][2, 5])
    distances = analysis.distances.distance[2 * 12 + 5].copy()
    distances[2 * 12 + 5] = np.inf
    nearest = [(entry["layer"], entry["head"]) for entry in answer["nearest"]]
    assert nearest == [divmod(int(index), 12) for index in np.argsort(distances, kind="stable")[:5]]
    relations = answer["relations"]
    # ranked by the gain over the baseline: nsubj 0.3725 - 0.4, all 0.3725 - 0.5, det 0.2114 - 0.6
    assert [row["relation"] for row in relations] == ["nsubj", "all", "det"]
    assert relations[0]["direction"] == 1 and relations[0]["accuracy"] == pytest.approx(29 / 72 * 0.9 + 0.01)
    assert [row["gain"] for row in relations] == pytest.approx(
        [29 / 72 * 0.9 + 0.01 - 0.4, 29 / 72 * 0.9 + 0.01 - 0.5, 29 / 72 * 0.5 + 0.01 - 0.6]
    )
    assert relations[2]["baseline_accuracy"] == pytest.approx(0.6)
    assert answer["ablation"] == {
        "change": pytest.approx(-0.029),
        "accuracy": pytest.approx(0.871),
        "importance": None,
        "rank": 72 - 29,
    }
    assert answer["coreference"] == [{"type": "pronoun", "accuracy": 0.29, "rank": 72 - 29, "count": 40}]
    assert [example["rank"] for example in answer["examples"]] == list(range(PER_HEAD))


def _ablation(folder: Path, model: str, change: np.ndarray) -> None:
    """An ablation folder of ``model`` whose heads' accuracy changes are ``change`` [layers, heads]."""
    folder.mkdir(parents=True)
    layer, head = np.indices(change.shape).reshape(2, -1)
    pd.DataFrame(
        {"layer": layer, "head": head, "accuracy": 0.5 + change.ravel(), "change": change.ravel()}
    ).to_csv(folder / "ablation.csv", index=False)
    (folder / "summary.json").write_text(json.dumps({"model": model}), encoding="utf-8")


def test_an_ablation_of_another_model_is_named_and_one_of_the_same_model_preferred(
    default_model: LoadedModel, analysed: tuple[CorpusAnalysis, Path], tmp_path: Path
) -> None:
    _, folder = analysed
    shutil.copytree(folder, tmp_path / "analysis")
    changes = -np.arange(72.0).reshape(6, 12) / 1000
    _ablation(tmp_path / "a_finetuned", "runs/finetuned", changes)  # found first, another model
    with TestClient(create_app([default_model], runs=tmp_path)) as client:
        related = client.post("/api/explore/analysis", json={"run": "analysis"}).json()["related"]
        assert (related["ablation"], related["ablation_model"]) == ("a_finetuned", "runs/finetuned")
        assert related["ablation_same_model"] is False
        head = client.post("/api/explore/head", json={"run": "analysis", "layer": 0, "head": 1}).json()
        assert head["ablation"]["rank"] == 71  # the second-smallest loss of accuracy

    # an ablation of the analysis's own model beside it wins; every change 0: no head ranks first
    _ablation(tmp_path / "b_same", "all-MiniLM-L6-v2", np.zeros((6, 12)))
    with TestClient(create_app([default_model], runs=tmp_path)) as client:
        related = client.post("/api/explore/analysis", json={"run": "analysis"}).json()["related"]
        assert (related["ablation"], related["ablation_same_model"]) == ("b_same", True)
        head = client.post("/api/explore/head", json={"run": "analysis", "layer": 0, "head": 1}).json()
        assert head["ablation"] == {"change": 0.0, "accuracy": 0.5, "importance": None, "rank": None}


def test_a_patching_run_of_the_same_model_gives_each_head_its_effect(
    default_model: LoadedModel, analysed: tuple[CorpusAnalysis, Path], tmp_path: Path
) -> None:
    _, folder = analysed
    shutil.copytree(folder, tmp_path / "analysis")
    effect = np.arange(72.0).reshape(6, 12) / 100
    effect[0, 0] = -0.9  # the largest by size: ranked first though the most negative
    layer, head = np.indices(effect.shape).reshape(2, -1)
    for name, model in (("a_other", "another-model"), ("b_patching", "all-MiniLM-L6-v2")):
        (tmp_path / name).mkdir()
        frame = pd.DataFrame({"layer": layer, "head": head, "effect": effect.ravel()})
        frame.to_csv(tmp_path / name / "head_effects.csv", index=False)
        summary = {"model": model, "granularity": "head", "direction": "denoising", "methods": ["exact"]}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    with TestClient(create_app([default_model], runs=tmp_path)) as client:
        related = client.post("/api/explore/analysis", json={"run": "analysis"}).json()["related"]
        assert related["patching"] == "b_patching"
        head = client.post("/api/explore/head", json={"run": "analysis", "layer": 5, "head": 10}).json()
        assert head["patching"] == {
            "effect": pytest.approx(0.70),
            "rank": 3,
            "direction": "denoising",
            "method": "exact",
            "ablation": "counterfactual",
        }
        first = client.post("/api/explore/head", json={"run": "analysis", "layer": 0, "head": 0}).json()
        assert first["patching"]["rank"] == 1


CIRCUIT_EDGES = """upstream,downstream,score
input,a5.h10<q>,0.2
a5.h10,logits,-0.9
a0.h1,a5.h10<v>,0.5
a5.h10,m5,0.1
m4,a5.h10<k>,-0.3
a0.h0,m0,0.05
"""


def test_a_circuit_run_of_the_same_model_gives_each_head_its_edges(
    default_model: LoadedModel, analysed: tuple[CorpusAnalysis, Path], tmp_path: Path
) -> None:
    _, folder = analysed
    shutil.copytree(folder, tmp_path / "analysis")
    runs = {
        "a_other": ("another-model", CIRCUIT_EDGES),
        "a_wider": ("all-MiniLM-L6-v2", CIRCUIT_EDGES + "a6.h0,logits,1.0\n"),  # a layer beyond the 6
        "b_circuit": ("all-MiniLM-L6-v2", CIRCUIT_EDGES),
    }
    for name, (model, edges) in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "edges.csv").write_text(edges, encoding="utf-8")
        summary = {"model": model, "method": "eap-ig"}
        (tmp_path / name / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    with TestClient(create_app([default_model], runs=tmp_path)) as client:
        related = client.post("/api/explore/analysis", json={"run": "analysis"}).json()["related"]
        assert related["circuit"] == "b_circuit"
        head = client.post("/api/explore/head", json={"run": "analysis", "layer": 5, "head": 10}).json()
        # ranked by |score|: -0.9, 0.5, -0.3, 0.2, 0.1, 0.05
        assert head["circuit"] == {
            "method": "eap-ig",
            "edges": 6,
            "into": [
                {"node": "a0.h1", "kind": "v", "score": 0.5, "rank": 2},
                {"node": "m4", "kind": "k", "score": -0.3, "rank": 3},
                {"node": "input", "kind": "q", "score": 0.2, "rank": 4},
            ],
            "out": [
                {"node": "logits", "kind": "", "score": -0.9, "rank": 1},
                {"node": "m5", "kind": "", "score": 0.1, "rank": 5},
            ],
        }
        other = client.post("/api/explore/head", json={"run": "analysis", "layer": 0, "head": 3}).json()
        assert other["circuit"] == {"method": "eap-ig", "edges": 6, "into": [], "out": []}


def test_an_example_is_a_head_view_of_the_stored_attention(client: TestClient) -> None:
    page = client.post("/api/explore/example", json={"run": "analysis", "layer": 1, "head": 3, "rank": 2})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '"layerNames":["1"]' in page.text and '"headNames":["3"]' in page.text
    missing = client.post("/api/explore/example", json={"run": "analysis", "layer": 1, "head": 3, "rank": 9})
    assert missing.status_code == 404 and "no example 9" in missing.json()["error"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"run": "../outside"}, 403, "refused"),
        ({"run": "/etc"}, 403, "refused"),
        ({"run": "leak"}, 403, "leads outside"),
        ({"run": "probes/deps"}, 404, "not an analysis folder"),
        ({"run": "nowhere"}, 404, "nothing at"),
        ({"run": 1}, 422, "run"),
        ({"run": "analysis", "extra": 1}, 422, "extra"),
    ],
)
def test_refused_requests(client: TestClient, body: dict[str, object], status: int, message: str) -> None:
    answer = client.post("/api/explore/analysis", json=body)
    assert answer.status_code == status and message in answer.json()["error"]


def test_a_head_outside_the_grid(client: TestClient) -> None:
    answer = client.post("/api/explore/head", json={"run": "analysis", "layer": 6, "head": 0})
    assert answer.status_code == 422 and "6 layers x 12 heads" in answer.json()["error"]


def _cut_lines(text: str, keep: int) -> str:
    """The first ``keep`` lines of ``text`` and half of the next, as a copy stopped mid-write leaves it."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2]


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        (
            "heads.csv",
            lambda text: _cut_lines(
                text, 1 + 50
            ).encode(),  # the header and 50 of the 72 heads, then half a row
            "has a damaged heads.csv: it lists 51 heads, where its layers and heads span 5 x 12 = 60 and "
            "head_js_divergence.csv has 72 (is it cut short?).",
        ),
        (
            "summary.json",
            lambda _: bytes(range(256)),
            "has a damaged summary.json: it is not UTF-8 text (byte 128).",
        ),
        (
            "summary.json",
            lambda _: b"\x00{}",
            "has a damaged summary.json: it is not JSON (Expecting value at line 1, column 1).",
        ),
        (
            "summary.json",
            lambda _: b"[1, 2]",
            "has a damaged summary.json: it holds a JSON list, not an object.",
        ),
        (
            "head_js_divergence.csv",
            lambda text: _cut_lines(text, 1 + 30).encode(),
            "has a damaged head_js_divergence.csv: it holds 31 rows of 72 distances, not one row and column "
            "per head.",
        ),
    ],
)
def test_a_damaged_analysis_file_is_named_with_what_is_wrong(
    default_model: LoadedModel,
    analysed: tuple[CorpusAnalysis, Path],
    tmp_path: Path,
    name: str,
    damage: object,
    message: str,
) -> None:
    _, folder = analysed
    copy = tmp_path / "runs" / "damaged"
    shutil.copytree(folder, copy)
    (copy / name).write_bytes(damage((folder / name).read_text(encoding="utf-8")))  # type: ignore[operator]
    with TestClient(create_app([default_model], runs=tmp_path / "runs")) as fresh:
        answer = fresh.post("/api/explore/analysis", json={"run": "damaged"})
    assert answer.status_code == 422
    assert answer.json()["error"] == f"The analysis 'damaged' {message}"
