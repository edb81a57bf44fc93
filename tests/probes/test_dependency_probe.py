"""Dependency probe: trees encoded exactly in a head, fixed-offset baselines, merging, a real treebank run."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from bertology.attention.capturing import capture
from bertology.attention.words import WordAttention, word_attention
from bertology.corpus.readers.treebank import Sentence, read_treebank
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.probes import (
    DIRECTIONS,
    OFFSETS,
    Baseline,
    BestHead,
    DependencyAccumulator,
    iter_word_attention,
    predicted_heads,
)
from bertology.probes.data import predict_heads


def make_sentence(heads: Sequence[int], relations: Sequence[str], origin: str = "test:1") -> Sentence:
    return Sentence(
        [f"w{i}" for i in range(len(heads))], list(heads), list(relations), [False] * len(heads), origin
    )


def tree_attention(heads: Sequence[int], layers: int = 2, heads_per_layer: int = 3) -> WordAttention:
    """Word attention over ``[CLS] words [SEP]`` where everything attends to [SEP], except:
    head (0, 0): each word attends only to its gold head (the root to [SEP]);
    head (0, 1): each word spreads its attention evenly over its dependents ([SEP] if it has none)."""
    n = len(heads)
    m, sep = n + 2, n + 1
    probs = np.zeros((layers, heads_per_layer, m, m))
    probs[..., sep] = 1.0
    dependent_rows, head_rows = probs[0, 0], probs[0, 1]
    for word, head in enumerate(heads):
        if head >= 0:
            dependent_rows[word + 1] = 0.0
            dependent_rows[word + 1, head + 1] = 1.0
    for word in range(n):
        dependents = [d for d, head in enumerate(heads) if head == word]
        if dependents:
            head_rows[word + 1] = 0.0
            head_rows[word + 1, np.array(dependents) + 1] = 1.0 / len(dependents)
    return WordAttention(
        probs=probs.astype(np.float32),
        labels=["[CLS]", *(f"w{i}" for i in range(n)), "[SEP]"],
        word_positions=np.arange(1, n + 1),
    )


# "The cat sat on the mat ." in UD: heads 0-based, -1 for the root.
CAT_HEADS = [1, 2, -1, 5, 5, 2, 2]
CAT_RELATIONS = ["det", "nsubj", "root", "case", "det", "obl", "punct"]


def probe_of(*pairs: tuple[Sentence, WordAttention], **options: object) -> DependencyAccumulator:
    accumulator = DependencyAccumulator(**options)  # type: ignore[arg-type]
    for sentence, words in pairs:
        accumulator.update(sentence, words)
    return accumulator


def test_tree_in_one_head_each_direction() -> None:
    probe = probe_of((make_sentence(CAT_HEADS, CAT_RELATIONS), tree_attention(CAT_HEADS))).result()
    assert probe.relations == ["det", "case", "nsubj", "obl", "punct"]  # most dependents first, root skipped
    for relation in [*probe.relations, "all"]:
        accuracy = probe.accuracy(relation)
        assert accuracy.shape == (2, 2, 3)
        assert accuracy[0, 0, 0] == 1.0  # dependent -> head, head (0, 0)
        assert accuracy[1, 0, 1] == 1.0  # head -> dependent, head (0, 1)
        assert ((accuracy >= 0) & (accuracy <= 1)).all()
        assert probe.best(relation) == BestHead(layer=0, head=0, direction=0, score=1.0)
        assert probe.heatmap(relation, 1)[0, 1] == 1.0
    assert probe.count("all") == 6
    assert probe.count("det") == 2


def test_predicted_heads_draw_the_tree() -> None:
    words = tree_attention(CAT_HEADS)
    not_root = np.array(CAT_HEADS) >= 0
    for layer, head, direction in [(0, 0, 0), (0, 1, 1)]:
        predicted = predicted_heads(words, layer, head, direction)
        assert predicted.shape == (len(CAT_HEADS),)
        assert predicted[not_root].tolist() == np.array(CAT_HEADS)[not_root].tolist()


def test_self_is_never_predicted() -> None:
    """A word attending only to itself still predicts another word (the first, on a tie)."""
    probs = np.zeros((1, 1, 5, 5), dtype=np.float32)
    probs[0, 0, np.arange(5), np.arange(5)] = 1.0
    words = WordAttention(probs, ["[CLS]", "a", "b", "c", "[SEP]"], np.array([1, 2, 3]))
    assert predicted_heads(words, 0, 0, 0).tolist() == [1, 0, 0]
    assert predicted_heads(words, 0, 0, 1).tolist() == [1, 0, 0]


def test_fixed_offset_baseline() -> None:
    right = [1, 2, 3, 4, -1]  # every head is the next word
    probe = probe_of((make_sentence(right, ["dep"] * 5), tree_attention(right))).result()
    assert probe.baseline("dep") == Baseline(offset=1, accuracy=1.0)
    mixed = [-1, 0, 0, 1, 2]  # offsets -1, -2, -2, -2
    probe = probe_of((make_sentence(mixed, ["dep"] * 5), tree_attention(mixed))).result()
    assert probe.baseline("dep") == Baseline(offset=-2, accuracy=0.75)
    assert probe.offset_correct[0].tolist() == [3 if k == -2 else 1 if k == -1 else 0 for k in OFFSETS]


def test_relation_options() -> None:
    heads, relations = [1, -1, 1, 2], ["nmod:poss", "root", "nmod", "det"]
    pair = (make_sentence(heads, relations), tree_attention(heads))
    assert probe_of(pair).result().relations == ["det", "nmod", "nmod:poss"]
    assert probe_of(pair, strip_subtypes=True).result().relations == ["nmod", "det"]
    kept = probe_of(pair, relations=["nmod"], strip_subtypes=True).result()
    assert kept.relations == ["nmod"]
    assert kept.count("all") == 2


def random_tree(rng: np.random.Generator, n: int) -> list[int]:
    """Heads of a random tree over n words (word i > 0 takes a head among the words before it),
    then the words shuffled."""
    order = rng.permutation(n)
    heads = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    position = np.argsort(order)
    return [-1 if heads[position[w]] < 0 else int(order[heads[position[w]]]) for w in range(n)]


def random_pairs(rng: np.random.Generator, count: int) -> list[tuple[Sentence, WordAttention]]:
    pairs = []
    for index in range(count):
        n = int(rng.integers(1, 9))
        heads = random_tree(rng, n)
        relations = [str(rng.choice(["nsubj", "obj", "det", "amod"])) for _ in range(n)]
        logits = rng.normal(size=(2, 3, n + 2, n + 2))
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        words = WordAttention(probs.astype(np.float32), ["[CLS]", *["w"] * n, "[SEP]"], np.arange(1, n + 1))
        pairs.append((make_sentence(heads, relations, f"test:{index}"), words))
    return pairs


def test_merge_of_halves_equals_one_pass() -> None:
    pairs = random_pairs(np.random.default_rng(3), 30)
    whole = probe_of(*pairs).result()
    merged = probe_of(*pairs[:11]).merge(probe_of(*pairs[11:])).merge(DependencyAccumulator()).result()
    assert merged.to_dict() == whole.to_dict()
    assert DependencyAccumulator().merge(probe_of(*pairs)).result().to_dict() == whole.to_dict()
    assert whole.sentences == 30


def test_brute_force_counts() -> None:
    """Counts of every relation and head against a loop over dependents with plain argmax."""
    pairs = random_pairs(np.random.default_rng(5), 20)
    probe = probe_of(*pairs).result()
    for relation in probe.relations:
        expected = np.zeros((2, 2, 3))
        for sentence, words in pairs:
            between = words.between_words().astype(np.float64)
            n = len(sentence.words)
            for d, (head, label) in enumerate(zip(sentence.heads, sentence.relations, strict=True)):
                if head < 0 or label != relation:
                    continue
                for layer, h in itertools.product(range(2), range(3)):
                    others = [j for j in range(n) if j != d]
                    row = max(others, key=lambda j: (between[layer, h, d, j], -j))
                    column = max(others, key=lambda j: (between[layer, h, j, d], -j))
                    expected[0, layer, h] += row == head
                    expected[1, layer, h] += column == head
        np.testing.assert_array_equal(probe.correct[probe.relations.index(relation)], expected)


def test_frames_and_json() -> None:
    probe = probe_of(*random_pairs(np.random.default_rng(1), 10)).result()
    table = probe.table()
    assert list(table.columns) == [
        "relation",
        "count",
        "best_head",
        "layer",
        "head",
        "direction",
        "direction_name",
        "accuracy",
        "baseline_offset",
        "baseline_accuracy",
    ]
    assert table["relation"].tolist() == ["all", *probe.relations]
    assert set(table["direction_name"]) <= set(DIRECTIONS)
    assert (table["best_head"] == table["layer"].astype(str) + "-" + table["head"].astype(str)).all()
    frame = probe.to_frame()
    assert len(frame) == (len(probe.relations) + 1) * 2 * 2 * 3
    assert list(frame.columns) == ["relation", "direction", "layer", "head", "accuracy", "count"]
    det = frame[(frame.relation == "det") & (frame.direction == 1)]
    np.testing.assert_allclose(det["accuracy"].to_numpy().reshape(2, 3), probe.heatmap("det", 1))
    loaded = json.loads(probe.to_json())
    assert loaded["relations"]["det"]["count"] == probe.count("det")


def test_errors() -> None:
    words = tree_attention(CAT_HEADS)
    with pytest.raises(BertologyError, match="has 3 words but its attention has 7"):
        probe_of((make_sentence([1, -1, 1], ["a", "root", "b"]), words))
    with pytest.raises(BertologyError, match="no dependents yet"):
        DependencyAccumulator().result()
    with pytest.raises(BertologyError, match="different relation settings"):
        DependencyAccumulator().merge(DependencyAccumulator(strip_subtypes=True))
    probe = probe_of((make_sentence(CAT_HEADS, CAT_RELATIONS), words)).result()
    with pytest.raises(BertologyError, match="saw no 'amod' dependents"):
        probe.heatmap("amod", 0)
    other_model = tree_attention(CAT_HEADS, layers=3)
    with pytest.raises(BertologyError, match="2 layers x 3 heads but got 3 x 3"):
        probe_of(
            (make_sentence(CAT_HEADS, CAT_RELATIONS), words),
            (make_sentence(CAT_HEADS, CAT_RELATIONS), other_model),
        )


def sentences_to_skip() -> list[Sentence]:
    """Four sentences for a 16-token limit: two to probe ("short", "last"), one too long, one with a word that
    gives no token."""
    return [
        make_sentence([1, -1], ["nsubj", "root"], "short"),
        Sentence(["word"] * 30, [-1] + [0] * 29, ["root"] + ["dep"] * 29, [False] * 30, "long"),
        Sentence(["a", "\x07", "b"], [-1, 0, 0], ["root", "dep", "dep"], [False] * 3, "control"),
        make_sentence([-1, 0, 0], ["root", "obj", "obj"], "last"),
    ]


def test_stream_skips_and_counts(default_model: LoadedModel) -> None:
    sentences = sentences_to_skip()
    stream = iter_word_attention(sentences, default_model, batch_size=3, max_length=16)
    kept = list(stream)
    assert [sentence.origin for sentence, _ in kept] == ["last", "short"]  # batched longest first
    assert (stream.seen, stream.skipped.truncated, stream.skipped.untokenized) == (4, 1, 1)
    assert kept[0][1].probs.shape == (default_model.num_layers, default_model.num_heads, 5, 5)


def test_real_treebank(default_model: LoadedModel, shared_data: Path) -> None:
    sentences = list(itertools.islice(read_treebank(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"), 50))
    accumulator = DependencyAccumulator()
    stream = iter_word_attention(sentences, default_model)
    for sentence, words in stream:
        accumulator.update(sentence, words)
    probe = accumulator.result()
    assert stream.seen == 50 and stream.skipped.total == 0
    assert probe.count("all") == sum(h >= 0 for s in sentences for h in s.heads)
    accuracy = probe.to_frame()["accuracy"]
    assert accuracy.between(0, 1).all()
    table = probe.table()
    assert {"relation", "count", "best_head", "direction", "accuracy", "baseline_accuracy"} <= {*table}
    assert table["accuracy"].between(0, 1).all() and table["baseline_accuracy"].between(0, 1).all()
    assert table["baseline_offset"].isin(OFFSETS).all()
    det = table.set_index("relation").loc["det"]
    assert det["accuracy"] > 0.5  # some head finds the noun of nearly every determiner


def test_predict_heads_equals_each_sentence_alone(default_model: LoadedModel, shared_data: Path) -> None:
    """One padded batch of 40 real sentences of different lengths: every head's predictions equal the
    argmax of each sentence's own word attention (captured alone, no padding), and the kept examples'
    word attention equals it."""
    sentences = list(itertools.islice(read_treebank(shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"), 40))
    keep = [index % 7 == 0 for index in range(len(sentences))]
    scored, skipped = predict_heads(sentences, default_model, keep=keep)
    assert skipped.total == 0 and [each.sentence for each in scored] == sentences
    for each, kept in zip(scored, keep, strict=True):
        alone = word_attention(capture(each.sentence.words, model=default_model))
        between = alone.between_words().astype(np.float64)
        n = between.shape[-1]
        between[..., np.arange(n), np.arange(n)] = -np.inf
        np.testing.assert_array_equal(each.predicted[0], between.argmax(-1))
        np.testing.assert_array_equal(each.predicted[1], between.argmax(-2))
        assert (each.words is not None) == kept
        if each.words is not None:
            # batched against alone: padding changes float32 matmul blocking (a few units of 2^-24 on
            # probabilities <= 1, then summed over a word's pieces); 1e-5 leaves a wide margin
            np.testing.assert_allclose(each.words.probs, alone.probs, atol=1e-5)
            assert each.words.labels == alone.labels


def test_predict_heads_skips_and_counts(default_model: LoadedModel) -> None:
    sentences = sentences_to_skip()
    scored, skipped = predict_heads(sentences, default_model, max_length=16)
    assert [each.sentence.origin for each in scored] == ["short", "last"]
    assert (skipped.truncated, skipped.untokenized) == (1, 1)
    assert scored[1].predicted.shape == (2, default_model.num_layers, default_model.num_heads, 3)
