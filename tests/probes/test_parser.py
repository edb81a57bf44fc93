"""Tests of the attention-only parser (Clark et al. 2019, Sec. 4.2) on constructed and real attention."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from bertology.attention.words import WordAttention
from bertology.corpus.readers.treebank import Sentence, read_treebank
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.probes.data import iter_word_attention
from bertology.probes.parser import (
    AttentionParser,
    _max_arborescence,
    arc_features,
    evaluate_parser,
    right_branching,
)

LAYERS, HEADS = 2, 3
PLANTED = (1, 2)  # (layer, head) whose attention encodes the tree
NOISE = 0.05  # attention mass the planted head spreads at random


def random_tree(rng: np.random.Generator, n: int) -> list[int]:
    """Heads (0-based, -1 root) of a random tree: words join in random order under an earlier one."""
    order = rng.permutation(n)
    heads = [-1] * n
    for position in range(1, n):
        heads[order[position]] = int(order[rng.integers(position)])
    return heads


def planted_example(
    rng: np.random.Generator,
    heads: list[int],
    *,
    direction: int = 0,
    punct: list[bool] | None = None,
    attended: list[int] | None = None,
) -> tuple[Sentence, WordAttention]:
    """A sentence and random word attention over ``[CLS] words [SEP]`` where head ``PLANTED`` points at
    the tree ``attended`` (default: the gold ``heads``), ROOT being [CLS].

    direction 0: each word attends to its head; 1: each head spreads its attention over its dependents.
    """
    n = len(heads)
    m = n + 2
    probs = rng.dirichlet(np.ones(m), size=(LAYERS, HEADS, m))
    target = heads if attended is None else attended
    planted = np.zeros((m, m))
    for word, head in enumerate(target):
        if direction == 0:
            planted[word + 1, head + 1] = 1.0
        else:
            planted[head + 1, word + 1] = 1.0
    rows = planted.sum(axis=1, keepdims=True)
    planted = np.divide(planted, rows, out=np.full_like(planted, 1.0 / m), where=rows > 0)
    probs[PLANTED] = (1 - NOISE) * planted + NOISE * probs[PLANTED]
    words = [f"w{index}" for index in range(n)]
    sentence = Sentence(words, heads, ["dep"] * n, punct or [False] * n, "synthetic")
    attention = WordAttention(probs.astype(np.float32), ["[CLS]", *words, "[SEP]"], np.arange(1, n + 1))
    return sentence, attention


def planted_examples(seed: int, count: int, direction: int = 0) -> list[tuple[Sentence, WordAttention]]:
    rng = np.random.default_rng(seed)
    return [
        planted_example(rng, random_tree(rng, int(rng.integers(1, 9))), direction=direction)
        for _ in range(count)
    ]


@pytest.mark.parametrize("direction", [0, 1])
def test_a_head_that_encodes_the_tree_is_found_and_parses_perfectly(direction: int) -> None:
    parser = AttentionParser.fit(planted_examples(0, 60, direction))
    assert parser.weights.shape == (2, LAYERS, HEADS)
    assert parser.best_single_head == (("dependent->head", "head->dependent")[direction], *PLANTED)
    report = evaluate_parser(parser, planted_examples(1, 40, direction))
    assert report.uas == 1.0
    # A single head never predicts ROOT (as in Clark et al.): it gets every other word right.
    roots = sum(sentence.heads.count(-1) for sentence, _ in planted_examples(1, 40, direction))
    assert report.single_head_correct == report.words - roots
    assert (report.single_head_layer, report.single_head_head) == PLANTED
    assert report.single_head_train_uas == pytest.approx(parser.single_head_train_uas.max())
    assert evaluate_parser(parser, planted_examples(1, 40, direction), decode="mst").uas == 1.0


def test_results_as_frames_and_json() -> None:
    parser = AttentionParser.fit(planted_examples(0, 30))
    weights = parser.to_frame()
    assert len(weights) == LAYERS * HEADS
    assert list(weights.columns[:4]) == ["layer", "head", "w", "u"]
    planted = weights.set_index(["layer", "head"]).loc[PLANTED]
    assert planted["w"] == weights["w"].max()
    report = evaluate_parser(parser, planted_examples(1, 10))
    frame = report.to_frame()
    assert frame["predictor"].tolist() == ["parser (argmax)", "right-branching", report.single_head_name]
    assert json.loads(report.to_json())["uas"] == report.uas


def test_right_branching_baseline_scores_a_right_branching_tree_perfectly() -> None:
    assert right_branching(4).tolist() == [1, 2, 3, -1]
    rng = np.random.default_rng(2)
    parser = AttentionParser.fit(planted_examples(0, 30))
    chains = [planted_example(rng, right_branching(n).tolist()) for n in (1, 3, 6)]
    report = evaluate_parser(parser, chains)
    assert report.right_branching_uas == 1.0
    assert report.right_branching_correct == report.words == 10


def test_punctuation_is_not_scored() -> None:
    parser = AttentionParser.fit(planted_examples(0, 60))
    rng = np.random.default_rng(3)
    examples = []
    for _ in range(20):
        n = int(rng.integers(3, 9))
        heads = random_tree(rng, n)
        punct = [bool(p) and head >= 0 for p, head in zip(rng.random(n) < 0.3, heads, strict=True)]
        # The attention (so the parser) gets every punctuation word's head wrong, and nothing else.
        wrong = [
            next(j for j in range(n) if j not in (word, head)) if is_punct else head
            for word, (head, is_punct) in enumerate(zip(heads, punct, strict=True))
        ]
        examples.append(planted_example(rng, heads, punct=punct, attended=wrong))
    assert any(any(sentence.punct) for sentence, _ in examples)
    for sentence, attention in examples:
        predicted = parser.predict(attention)
        assert (predicted != np.array(sentence.heads)).tolist() == sentence.punct
    report = evaluate_parser(parser, examples)
    assert report.uas == 1.0
    assert report.words == sum(punct.count(False) for punct in (s.punct for s, _ in examples))


def test_training_is_deterministic() -> None:
    first = AttentionParser.fit(planted_examples(4, 30), max_iter=20)
    second = AttentionParser.fit(iter(planted_examples(4, 30)), max_iter=20)
    assert np.array_equal(first.weights, second.weights)
    assert first.root_bias == second.root_bias
    assert first.loss == second.loss


def test_long_sentences_are_skipped_in_training_and_bad_inputs_rejected() -> None:
    examples = planted_examples(5, 20)
    parser = AttentionParser.fit(examples, max_words=4, max_iter=5)
    long_ones = sum(len(sentence.words) > 4 for sentence, _ in examples)
    assert (parser.skipped, parser.train_sentences) == (long_ones, 20 - long_ones)
    with pytest.raises(BertologyError, match="no sentence"):
        AttentionParser.fit([])
    sentence, attention = examples[0]
    shorter = Sentence(sentence.words[:-1], sentence.heads[:-1], [], [], "short")
    with pytest.raises(BertologyError, match="short has"):
        evaluate_parser(parser, [(shorter, attention)])
    no_specials = WordAttention(
        attention.probs[:, :, 1:-1, 1:-1], sentence.words, np.arange(len(sentence.words))
    )
    with pytest.raises(BertologyError, match="ROOT"):
        parser.predict(no_specials)


def test_arc_features_put_root_first_and_heads_last() -> None:
    _, attention = planted_example(np.random.default_rng(6), [1, -1, 1])
    features = arc_features(attention)
    assert features.shape == (4, 4, LAYERS * HEADS)
    units = [0, 1, 2, 3]  # [CLS] then the words; [SEP] (unit 4) is left out
    expected = attention.probs[:, :, units][:, :, :, units].reshape(LAYERS * HEADS, 4, 4)
    np.testing.assert_array_equal(features, expected.transpose(1, 2, 0))


def test_mst_decoding_matches_networkx() -> None:
    networkx = pytest.importorskip("networkx")
    rng = np.random.default_rng(7)
    for size in itertools.chain(range(2, 10), [12] * 30):
        scores = rng.normal(size=(size, size))
        heads = _max_arborescence(scores)
        assert heads[0] == -1
        graph = networkx.DiGraph()
        graph.add_weighted_edges_from(
            (head, dependent, scores[dependent, head])
            for dependent in range(1, size)
            for head in range(size)
            if head != dependent
        )
        tree = networkx.maximum_spanning_arborescence(graph)
        expected = {dependent: head for head, dependent in tree.edges}
        assert heads[1:].tolist() == [expected[dependent] for dependent in range(1, size)]


def test_real_attention_beats_right_branching(default_model: LoadedModel, shared_data: Path) -> None:
    start = time.perf_counter()
    gum = shared_data / "gum_v5.1_sd" / "dep_stanford"
    sentences = list(itertools.islice(read_treebank(gum, "conllx"), 300))
    parser = AttentionParser.fit(iter_word_attention(sentences[:200], default_model))
    report = evaluate_parser(parser, iter_word_attention(sentences[200:], default_model))
    print(
        f"\nGUM 200 train / {report.sentences} eval sentences, {report.words} words: "
        f"parser UAS {report.uas:.3f}, right-branching {report.right_branching_uas:.3f}, "
        f"{report.single_head_name} {report.single_head_uas:.3f} ({time.perf_counter() - start:.1f} s)"
    )
    assert report.sentences == 100
    assert report.uas > report.right_branching_uas
