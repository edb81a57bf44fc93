"""Corpus search index (bertology.index.token_index): exact neighbours on a small index, recall on UD EWT,
token metadata, the command."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import conllu
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from usearch.index import Index

from bertology.cli import app
from bertology.corpus.segments import iter_segments, sample_corpus
from bertology.errors import BertologyError
from bertology.index import token_index
from bertology.index.token_index import TokenIndex, build_index, encode_segment, histogram, query_vectors
from bertology.models.loading import LoadedModel
from bertology.server import create_app

LAYERS = [1, 5]


@pytest.fixture(scope="session")
def sample_index(default_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> TokenIndex:
    """The sample corpus (plain text, packed into pairs) indexed at layers 1 and 5."""
    return build_index(
        sample_corpus(), tmp_path_factory.mktemp("index"), model=default_model, layers=LAYERS, threads=1
    )


def _model_vectors(loaded: LoadedModel, index: TokenIndex, layer: int) -> np.ndarray:
    """Every indexed token's vector [N, d] at ``layer``, computed independently: one unpadded forward pass
    per segment, the model's own ``hidden_states``, rows placed by the index's segment starts."""
    vectors = np.zeros((len(index), index.width), dtype=np.float32)
    for number, segment in enumerate(index.segments):
        inputs, _ = encode_segment(loaded.tokenizer, segment, 128)
        with torch.inference_mode():
            hidden = loaded.model(
                **{name: torch.tensor([values]) for name, values in inputs.items()}, output_hidden_states=True
            ).hidden_states[layer + 1][0]
        start = int(index.tables["start"][number])
        vectors[start : start + len(hidden)] = torch.nn.functional.normalize(hidden, dim=-1).numpy()
    return vectors


@pytest.mark.parametrize("layer", LAYERS)
def test_search_returns_the_exact_nearest_tokens(
    sample_index: TokenIndex, default_model: LoadedModel, layer: int
) -> None:
    vectors = _model_vectors(default_model, sample_index, layer)
    queries = np.random.default_rng(0).choice(len(vectors), 40, replace=False)
    rows, similarities = sample_index.search(vectors[queries], layer, k=10)
    for query, found, found_similarity in zip(queries, rows, similarities, strict=True):
        exact = vectors @ vectors[query]
        best = np.sort(exact)[::-1][:10]
        # float16 storage: the same neighbours, up to ties within its rounding
        assert exact[found] == pytest.approx(best, abs=2e-3)
        assert found_similarity == pytest.approx(exact[found], abs=2e-3)
        assert found[0] == query or exact[found[0]] == pytest.approx(1.0, abs=2e-3)


def test_both_insertion_layouts_build_the_same_index(
    sample_index: TokenIndex,
    default_model: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graphs grow beside the forward passes where torch leaves a core free, else between them; the
    layout the fixture did not use gives the same vectors under the same keys, so the same neighbours."""
    fixture_overlapped = torch.get_num_threads() < token_index._usable_cores()
    other_cores = 1 if fixture_overlapped else torch.get_num_threads() + 1
    monkeypatch.setattr(token_index, "_usable_cores", lambda: other_cores)
    told: list[int] = []
    other = build_index(
        sample_corpus(),
        tmp_path,
        model=default_model,
        layers=LAYERS,
        threads=1,
        batch_size=8,
        on_progress=lambda done, total=None, *, stage="": told.append(done),
    )
    rows = np.arange(len(sample_index))
    assert len(other) == len(sample_index)
    # progress after each batch of 8 segments, the last report every segment
    assert told[-1] == len(other.segments) > 8
    assert np.diff([0, *told]).tolist() == [8] * (len(told) - 1) + [told[-1] - 8 * (len(told) - 1)]
    for layer in LAYERS:
        stored = sample_index.vectors(rows, layer)
        np.testing.assert_array_equal(other.vectors(rows, layer), stored)
        assert other.search(stored[:50], layer, k=5)[0].tolist() == (
            sample_index.search(stored[:50], layer, k=5)[0].tolist()
        )


def test_rows_describe_their_token_word_and_context(sample_index: TokenIndex) -> None:
    tokenizer = sample_index.tokenizer
    for row in range(0, len(sample_index), 97):
        item = sample_index.describe(row, 5)
        if item["word"] < 0:
            assert item["token"] in tokenizer.all_special_tokens
            continue
        pieces = tokenizer.tokenize(item["context"][item["word"]])
        assert item["token"] in pieces
    assert sample_index.describe(0, 1)["token"] == tokenizer.cls_token
    assert TokenIndex.open(sample_index.folder).tables["token_id"].tolist() == (
        sample_index.tables["token_id"].tolist()
    )


def test_attended_token_is_the_head_average_argmax_over_ordinary_tokens(
    sample_index: TokenIndex, default_model: LoadedModel
) -> None:
    """[CLS] and [SEP] draw most of layer 5's attention, so they are left out: the token named is the
    ordinary one the heads, averaged, attend to most."""
    segment = sample_index.segments[3]
    inputs, _ = encode_segment(default_model.tokenizer, segment, 128)
    with torch.inference_mode():
        attentions = default_model.model(
            **{name: torch.tensor([values]) for name, values in inputs.items()}, output_attentions=True
        ).attentions[5][0]
    start = int(sample_index.tables["start"][3])
    tokens = default_model.tokenizer.convert_ids_to_tokens(inputs["input_ids"])
    mean = attentions.mean(dim=0)  # [T, T]
    assert {tokens[key] for key in mean.argmax(dim=-1).tolist()} & {"[CLS]", "[SEP]"}  # what it would say
    ordinary = [position for position, token in enumerate(tokens) if token not in ("[CLS]", "[SEP]")]
    expected = [tokens[ordinary[int(mean[query, ordinary].argmax())]] for query in range(len(tokens))]
    assert [
        sample_index.describe(start + position, 5)["attends"] for position in range(len(tokens))
    ] == expected


def test_query_vectors_find_the_same_sentence_in_the_corpus(
    sample_index: TokenIndex, default_model: LoadedModel
) -> None:
    segment = sample_index.segments[0]
    inputs, _ = encode_segment(default_model.tokenizer, segment, 128)
    text = default_model.tokenizer.decode(inputs["input_ids"], skip_special_tokens=True)
    tokens, vectors = query_vectors(default_model, text, 5, 128)
    assert vectors.shape == (len(tokens), sample_index.width)
    rows, similarities = sample_index.search(vectors[1], 5, k=1)
    assert sample_index.describe(int(rows[0][0]), 5)["token"] == tokens[1]
    assert similarities[0][0] > 0.95


def test_find_word_ignores_case(sample_index: TokenIndex) -> None:
    rows = sample_index.find_word("THE", 1000)
    assert rows
    assert all(
        sample_index.describe(row, 1)["context"][sample_index.describe(row, 1)["word"]].lower() == "the"
        for row in rows
    )


#: UD EWT dev sentences indexed by the recall test (of 2,001): about 7,500 tokens, enough for an HNSW
#: graph of several levels (connectivity 16: about one node in 16 per level above 0), where a greedy
#: search from the top can miss; the test checks the levels.
UD_EWT_SENTENCES = 500


@pytest.mark.slow
def test_recall_at_10_on_ud_ewt_dev(shared_data: Path, default_model: LoadedModel, tmp_path: Path) -> None:
    """HNSW recall against exact search over the same stored vectors (UD EWT dev's first 500 sentences,
    about 7,500 tokens: a graph of several levels, where a greedy search can miss)."""
    index = build_index(
        shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu",
        tmp_path,
        model=default_model,
        layers=[4],
        threads=1,
        limit=UD_EWT_SENTENCES,
    )
    assert len(index) > 5_000
    (graph,) = tmp_path.glob("*/layer_4.usearch")
    assert Index.restore(str(graph), view=True).max_level >= 2  # levels 0, 1, 2 at least
    stored = index.vectors(np.arange(len(index)), 4).astype(np.float32)
    queries = np.random.default_rng(1).choice(len(stored), 300, replace=False)
    rows, _ = index.search(stored[queries], 4, k=10)
    exact = np.argsort(-(stored[queries] @ stored.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact, strict=True)])
    assert recall >= 0.95
    relations = {index.describe(int(row), 4)["relation"] for row in rows[:20].ravel()}
    assert relations & {"det", "nsubj", "obj", "punct", "case", "amod", "root", "nmod"}
    # Each token found carries its word's gold UPOS and relation, as the conllu package reads the file.
    gold = [
        [(token["upos"], token["deprel"]) for token in sentence if isinstance(token["id"], int)]
        for sentence in conllu.parse(
            (shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu").read_text(encoding="utf-8")
        )
    ]
    described = [index.describe(int(row), 4) for row in rows.ravel()]
    words = [item for item in described if item["word"] >= 0]
    assert len(words) > 1000
    for item, row in zip(described, rows.ravel(), strict=True):
        expected = (
            gold[int(index.tables["segment"][row])][item["word"]] if item["word"] >= 0 else (None, None)
        )
        assert (item["pos"], item["relation"]) == expected
    assert {item["pos"] for item in words} >= {"NOUN", "VERB", "DET", "ADP", "PUNCT"}
    assert sum(count for _, count in histogram(described, "pos")) == len(described)


def test_index_command_writes_a_reusable_index(
    sample_corpus_head: Callable[[int], Path], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        app, ["index", str(sample_corpus_head(6)), "-o", str(tmp_path), "--layers", "0,5"]
    )
    assert result.exit_code == 0, result.output
    reopened = TokenIndex.open(tmp_path)
    assert reopened.layers == [0, 5]
    assert f"Indexed {len(reopened)} tokens" in result.output


def test_index_command_limit_indexes_the_first_segments_as_analyze_counts_them(
    sample_corpus_head: Callable[[int], Path], default_model: LoadedModel, tmp_path: Path
) -> None:
    """--limit 3: the first 3 segments of the corpus, as `analyze --limit 3` reads them (issue 34)."""
    corpus = sample_corpus_head(12)
    result = CliRunner().invoke(app, ["index", str(corpus), "-o", str(tmp_path), "--limit", "3"])
    assert result.exit_code == 0, result.output
    segments = list(itertools.islice(iter_segments(corpus, default_model.tokenizer), 4))
    assert len(segments) == 4  # the corpus has more than the limit
    indexed = TokenIndex.open(tmp_path).segments
    assert [segment.origin for segment in indexed] == [segment.origin for segment in segments[:3]]
    assert "of 3 segments" in result.output


def test_index_command_refuses_a_missing_layer(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["index", str(sample_corpus()), "-o", str(tmp_path), "--layers", "9"])
    assert isinstance(result.exception, BertologyError)
    assert str(result.exception) == "Layer 9 does not exist: the model has layers 0-5."


def test_opening_a_folder_without_index_says_so(tmp_path: Path) -> None:
    with pytest.raises(BertologyError, match="is not a token index"):
        TokenIndex.open(tmp_path)


@pytest.fixture(scope="module")
def search_client(sample_index: TokenIndex, default_model: LoadedModel) -> Iterator[TestClient]:
    with TestClient(create_app([default_model], index=sample_index.folder)) as client:
        yield client


def test_api_lists_the_nearest_corpus_tokens_of_an_input_token(
    search_client: TestClient, sample_index: TokenIndex, default_model: LoadedModel
) -> None:
    info = search_client.post("/api/search/info", json={}).json()
    assert info == {
        "available": True,
        "model": default_model.name,
        "layers": LAYERS,
        "tokens": len(sample_index),
        "segments": 61,
    }
    text = "The river flows through the city."
    tokens, vectors = query_vectors(default_model, text, 5, 512)
    answer = search_client.post(
        "/api/search/input", json={"text": text, "layer": 5, "token": 2, "k": 7}
    ).json()
    assert answer["tokens"] == tokens
    rows, similarities = sample_index.search(vectors[2], 5, k=7)
    assert [item["row"] for item in answer["neighbours"]] == rows[0].tolist()
    # float16 vectors: a cosine of unit vectors rounds by at most about 2^-11 (4.9e-4)
    assert [item["similarity"] for item in answer["neighbours"]] == pytest.approx(similarities[0], abs=1e-3)
    assert sum(count for _, count in answer["histogram"]) == 7
    assert answer["pos_histogram"] == [["none", 7]]  # plain text: no parts of speech
    assert all(item["pos"] is None for item in answer["neighbours"])


def test_api_lists_the_nearest_corpus_tokens_of_a_corpus_token(
    search_client: TestClient, sample_index: TokenIndex, default_model: LoadedModel
) -> None:
    """A corpus token as the query (a word search's hit, clicked): its exact nearest tokens by the model's
    own vectors, itself at similarity 1."""
    vectors = _model_vectors(default_model, sample_index, 5)
    (row,) = search_client.post("/api/search/word", json={"word": "river", "layer": 5, "k": 1}).json()[
        "neighbours"
    ]
    answer = search_client.post("/api/search/token", json={"row": row["row"], "layer": 5, "k": 8}).json()
    found = [item["row"] for item in answer["neighbours"]]
    exact = vectors @ vectors[row["row"]]
    assert row["row"] in found
    # float16 storage (as above): the same neighbours up to ties within its rounding, 4 units of 2^-11
    assert exact[found] == pytest.approx(np.sort(exact)[::-1][:8], abs=2e-3)
    assert [item["similarity"] for item in answer["neighbours"]] == pytest.approx(exact[found], abs=2e-3)
    past = search_client.post("/api/search/token", json={"row": len(sample_index), "layer": 5})
    assert past.status_code == 422  # the schema's largest row is the index's last
    assert (
        past.json()["error"]
        == f"Bad request: row: Input should be less than or equal to {len(sample_index) - 1}."
    )


def test_api_finds_a_word_and_refuses_what_is_not_there(search_client: TestClient) -> None:
    found = search_client.post("/api/search/word", json={"word": "River", "layer": 1, "k": 3}).json()
    assert 0 < len(found["neighbours"]) <= 3
    assert all(item["context"][item["word"]].lower() == "river" for item in found["neighbours"])
    refused = search_client.post("/api/search/word", json={"word": "river", "layer": 3})
    assert refused.status_code == 422
    assert refused.json()["error"] == "Bad request: layer: Input should be 1 or 5."  # the schema's enum
    past = search_client.post("/api/search/input", json={"text": "a b", "layer": 1, "token": 9})
    assert past.status_code == 422


def test_api_without_an_index_says_so(default_model: LoadedModel) -> None:
    with TestClient(create_app([default_model])) as client:
        info = client.post("/api/search/info", json={})
        search = client.post("/api/search/word", json={"word": "the", "layer": 0})
    assert info.json() == {"available": False, "model": None, "layers": [], "tokens": 0, "segments": 0}
    assert search.status_code == 404
    assert "--index" in search.json()["error"]
