"""Coreference probe (Clark et al. 2019, Section 4.3): heads, baselines, mention types, windows."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.corpus.readers.coref import read_coref
from bertology.corpus.readers.coref_documents import CorefDocument, Mention
from bertology.corpus.readers.treebank import read_treebank
from bertology.models.loading import LoadedModel
from bertology.probes.coreference import (
    ALL,
    OTHER,
    PRONOUN,
    PROPER,
    TYPES,
    CorefAccumulator,
    coref_windows,
    head_word,
    mention_type,
    score_coreference,
    with_heads,
)
from bertology.probes.rows import query_word_rows


def make_document(sentences: list[str], mentions: list[tuple[int, int, str]]) -> CorefDocument:
    """A document from whitespace-split sentences and ``(start, end, entity)`` word spans."""
    words: list[str] = []
    starts = []
    for sentence in sentences:
        starts.append(len(words))
        words.extend(sentence.split())
    sentence_of = [index for index, sentence in enumerate(sentences) for _ in sentence.split()]
    spans = sorted(mentions, key=lambda span: (span[0], -span[1], span[2]))
    return CorefDocument(
        "doc", words, starts, [Mention(s, e, ent, sentence_of[s]) for s, e, ent in spans], "test:1"
    )


def word_count(document: CorefDocument):
    """A token counter: one token per word plus two special tokens."""
    bounds = [*document.sentence_starts, len(document.words)]
    return lambda first, last: bounds[last + 1] - bounds[first] + 2


def test_a_head_pointing_at_antecedents_scores_one() -> None:
    # words: John0 saw1 Mary2 .3 | He4 liked5 her6 .7
    document = make_document(
        ["John saw Mary .", "He liked her ."], [(0, 1, "J"), (2, 3, "M"), (4, 5, "J"), (6, 7, "M")]
    )
    (window,) = coref_windows(document, None, word_count(document), 512).windows
    assert (window.first_sentence, window.last_sentence) == (0, 1)
    assert [m.head for m in window.mentions] == [4, 6]
    rng = np.random.default_rng(0)
    rows = rng.random((2, 3, 2, 8)).astype(np.float32) * 0.1
    rows[:, :, 0, 2] = rows[:, :, 1, 4] = 0.5  # every head: the nearest other mention, wrong for both
    rows[1, 2, 0, 0] = 1.0  # but head 1-2: He -> John
    rows[1, 2, 1, 2] = 1.0  # and her -> Mary
    accumulator = CorefAccumulator()
    accumulator.update(window, rows)
    probe = accumulator.result()
    assert probe.accuracy.shape == (len(TYPES) + 1, 2, 3)
    assert probe.heatmap()[1, 2] == 1.0 and probe.heatmap()[0, 0] == 0.0
    best = probe.best()
    assert (best.layer, best.head, best.score, best.label) == (1, 2, 1.0, "1-2")
    assert probe.count("pronoun") == 2 and probe.count(ALL) == 2
    assert math.isnan(probe.heatmap("proper")[0, 0])
    table = probe.table()
    assert list(table["type"]) == [*TYPES, ALL]
    assert table.iloc[-1]["best_head"] == "1-2"
    assert json.loads(probe.to_json())["types"]["pronoun"]["count"] == 2
    assert len(probe.to_frame()) == (len(TYPES) + 1) * 6
    # the best head's choice per mention: He -> John, her -> Mary; nearest picks Mary for He, He for her
    chosen = probe.antecedents()
    assert chosen[["mention_start", "mention_end", "mention", "type", "best_head"]].values.tolist() == [
        [4, 5, "He", "pronoun", "1-2"],
        [6, 7, "her", "pronoun", "1-2"],
    ]
    assert chosen[["predicted", "predicted_word", "correct", "gold"]].values.tolist() == [
        ["John", 0, True, "0"],
        ["Mary", 2, True, "2"],
    ]
    assert chosen["nearest"].tolist() == [False, False] and set(chosen["document"]) == {"doc"}


def test_baselines_nearest_same_head_sieve() -> None:
    sentences = [
        "the old house stood .",  # 0-4
        "the new house fell .",  # 5-9
        "a dog barked .",  # 10-13
        "the old house remained .",  # 14-18: nearest dog (wrong), same head new house (wrong), sieve exact
        "We met Tom .",  # 19-22
        "He smiled .",  # 23-25
        "Our day ended .",  # 26-29: nearest He, same head none; sieve agreement -> We
    ]
    mentions = [
        (0, 3, "OLD"),
        (5, 8, "NEW"),
        (10, 12, "DOG"),
        (14, 17, "OLD"),
        (19, 20, "WE"),
        (21, 22, "TOM"),
        (23, 24, "TOM"),
        (26, 27, "WE"),
    ]
    document = make_document(sentences, mentions)
    windows = coref_windows(document, None, word_count(document), 512).windows
    scored = {w.last_sentence: w.mentions for w in windows}
    assert set(scored) == {3, 5, 6}
    (house,) = scored[3]
    assert house.baselines == (False, False, True)
    (he,) = scored[5]
    assert he.baselines == (True, False, True)  # nearest Tom; a non-pronoun agrees with "He"
    (our,) = scored[6]
    assert our.kind == PRONOUN
    assert our.baselines == (False, False, True)
    accumulator = CorefAccumulator()
    for window in windows:
        accumulator.update(window, np.zeros((1, 1, len(window.mentions), window.end - window.start)))
    table = accumulator.result().table().set_index("type")
    assert table.loc[ALL, "count"] == 3
    assert table.loc[ALL, "sieve"] == 1.0
    assert table.loc[ALL, "nearest"] == pytest.approx(1 / 3)
    assert table.loc[ALL, "same_head"] == 0.0


def test_same_head_baseline_and_containing_mentions() -> None:
    # "the owner of the dog" contains "the dog"; it is not a candidate of a later mention inside it.
    document = make_document(
        ["the dog ran .", "the owner of the dog came ."],
        [(0, 2, "D"), (4, 9, "O"), (7, 9, "D")],
    )
    (window,) = coref_windows(document, None, word_count(document), 512).windows
    (dog,) = window.mentions
    assert dog.baselines == (True, True, True)
    assert window.start + dog.candidates.tolist()[0] == 1  # only "the dog" of sentence 0


def test_mention_types_and_head_words() -> None:
    document = make_document(
        [
            "The White House said the president of France agreed .",
            "He came .",
            "Dogs bark .",
            "The dog ran .",
        ],
        [(0, 3, "WH"), (4, 8, "P"), (7, 8, "F"), (10, 11, "P"), (13, 14, "D"), (16, 18, "D2")],
    )
    # heads: The->House, White->House, House->said(3), said root, the->president, president->said,
    # of->president, France->of, agreed->said, .->said
    heads = [2, 2, 3, -1, 5, 3, 5, 6, 3, 3, 11, -1, 11, 14, -1, 14, 17, 18, -1, 18]
    kinds, heads_found = {}, {}
    for mention in document.mentions:
        head = head_word(mention, heads, document.words)
        heads_found[mention.entity] = document.words[head]
        kinds[mention.entity] = mention_type(mention, head, document)
    assert heads_found == {"WH": "House", "P": "He", "F": "France", "D": "Dogs", "D2": "dog"}
    assert kinds == {"WH": PROPER, "P": PRONOUN, "F": PROPER, "D": PROPER, "D2": OTHER}
    president = next(m for m in document.mentions if m.start == 4)
    assert document.words[head_word(president, heads, document.words)] == "president"
    assert mention_type(president, 5, document) == OTHER
    assert head_word(president, None, document.words) == 7  # no heads: the last word


def test_windows_out_of_reach_and_too_long() -> None:
    sentences = ["Anna came here today ."] + [f"filler number {i} ." for i in range(3)]
    sentences += ["the cat sat down .", "the cat slept well .", "Anna left then .", "x " * 20 + "Anna ."]
    document = make_document(sentences, [])
    starts = document.sentence_starts
    mentions = [
        (0, 1, "A"),  # sentence 0
        (starts[4], starts[4] + 2, "C"),
        (starts[5], starts[5] + 2, "C"),  # in reach: sentence 4 is in its window
        (starts[6], starts[6] + 1, "A"),  # out of reach: sentence 0 is too far back
        (starts[7] + 20, starts[7] + 21, "A"),  # its sentence alone is too long
    ]
    document = make_document(sentences, mentions)
    built = coref_windows(document, None, word_count(document), 2 + 11)
    windows = {w.last_sentence: w for w in built.windows}
    assert set(windows) == {5, 6}
    assert (windows[5].first_sentence, windows[6].first_sentence) == (4, 5)
    assert len(windows[5].mentions) == 1 and windows[5].out_of_reach.sum() == 0
    assert windows[6].mentions == [] and windows[6].out_of_reach[PROPER] == 1
    assert built.skipped[PROPER] == 1
    accumulator = CorefAccumulator()
    accumulator.add_document(built.skipped)
    other = CorefAccumulator()
    for target, window in ((accumulator, windows[5]), (other, windows[6])):
        target.update(window, np.ones((2, 2, len(window.mentions), window.end - window.start)))
    probe = accumulator.merge(other).result()
    assert probe.out_of_reach.sum() == 1 and probe.skipped.sum() == 1 and probe.count() == 1
    assert probe.windows == 2 and probe.documents == 1


@pytest.mark.parametrize("path", ["queries and keys", "streamed probabilities"])
def test_query_word_rows_match_the_models_own_attention(
    default_model: LoadedModel, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Word rows (mean over the query word's tokens, summed over each key word's tokens) of a batch of two
    inputs of different lengths, against transformers' own ``output_attentions`` of each input alone, on
    both capture paths (models whose attention is not softmax(q·k) take the second)."""
    if path == "streamed probabilities":
        monkeypatch.setattr("bertology.probes.rows.long_input_refusal", lambda *args: "not q·k")
    inputs = [["Unbelievably", ",", "the", "tokenizer", "splits", "words", "."], ["Short", "one", "."]]
    queries = [[0, 3, 5, 3], [1]]
    captured = query_word_rows(inputs, queries, default_model)
    tokenizer, model = default_model.tokenizer, default_model.model
    for words, wanted, got in zip(inputs, queries, captured, strict=True):
        encoded = tokenizer(words, is_split_into_words=True, return_tensors="pt")
        with torch.inference_mode():
            attentions = model(**encoded, output_attentions=True).attentions
        probs = torch.stack(attentions)[:, 0].numpy()  # [layers, heads, n, n]
        word_ids = np.array([-1 if w is None else w for w in encoded.word_ids()])
        expected = np.stack(
            [
                np.stack(
                    [
                        probs[:, :, word_ids == q][:, :, :, word_ids == w].sum(-1).mean(-1)
                        for w in range(len(words))
                    ],
                    -1,
                )
                for q in wanted
            ],
            2,
        )
        # the same float32 attention, words' rows summed in another order: probabilities <= 1 summed over
        # a word's few pieces differ by a few units of 2^-24; 1e-5 is far above that
        np.testing.assert_allclose(got.rows, expected, atol=1e-5)
        assert got.tokens.tolist() == np.bincount(word_ids[word_ids >= 0]).tolist() and got.truncated == 0


def test_real_run_on_two_gum_documents(default_model: LoadedModel, shared_data: Path) -> None:
    gum = shared_data / "gum_v5.1_sd"
    documents = with_heads(read_coref(gum / "coref_conll"), read_treebank(gum / "dep_stanford"))
    probe = score_coreference(documents, default_model, limit_documents=2)
    assert probe.documents == 2 and probe.count() > 100
    assert probe.accuracy.shape == (len(TYPES) + 1, default_model.num_layers, default_model.num_heads)
    overall = probe.heatmap()
    assert np.all((overall >= 0) & (overall <= 1))
    table = probe.table().set_index("type")
    for column in ("accuracy", "nearest", "same_head", "sieve"):
        assert 0 <= table.loc[ALL, column] <= 1
    # Measured on these two documents: sieve 0.78, nearest 0.12 (GUM annotates singletons too).
    assert table.loc[ALL, "sieve"] > table.loc[ALL, "nearest"]
    assert table.loc[ALL, "sieve"] >= table.loc[ALL, "same_head"]
    assert probe.best().score > table.loc[ALL, "nearest"]
    # one row per scored mention; its right answers are the table's accuracies
    chosen = probe.antecedents()
    assert len(chosen) == probe.count() and set(chosen["best_head"]) == {probe.best().label}
    for column, scored in (("correct", "accuracy"), ("nearest", "nearest"), ("sieve", "sieve")):
        assert chosen[column].mean() == pytest.approx(table.loc[ALL, scored])
    pronouns = chosen[chosen["type"] == "pronoun"]
    assert pronouns["nearest"].mean() == pytest.approx(table.loc["pronoun", "nearest"])


def test_window_search_with_an_estimate_gives_the_exact_windows() -> None:
    """An estimate only guides the search: with a right one the windows come from two exact counts per
    window; with a wrong one (here, one token short per sentence) they are still the exact search's."""
    sentences = [f"sentence {i} has {'more ' * (i % 4)}words ." for i in range(30)]
    spans = [(start, start + 1, "S") for start in make_document(sentences, []).sentence_starts]
    document = make_document(sentences, spans)
    exact = word_count(document)
    calls: list[tuple[int, int]] = []

    def counted(first: int, last: int) -> int:
        calls.append((first, last))
        return exact(first, last)

    def short(first: int, last: int) -> int:
        return exact(first, last) - (last - first + 1)

    def bounds(estimate: Callable[[int, int], int] | None = None) -> list[tuple[int, int]]:
        built = coref_windows(document, None, counted, 20, estimate)
        return [(window.first_sentence, window.last_sentence) for window in built.windows]

    expected = bounds()
    searched, calls[:] = len(calls), []
    assert bounds(exact) == expected and len(calls) < searched
    assert bounds(short) == expected
    assert any(first > 0 for first, _ in expected)  # the limit cuts windows
