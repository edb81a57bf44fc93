"""Head pattern scores and labels: constructed heads, a brute-force reference, best segments, merging.

Tolerances: pattern scores of float32 attention against a float64 token-loop reference, rtol 1e-5 with
atol 1e-6 (float32 weights <= 1 summed over a row in another order); merged float64 sums in another order,
rtol 1e-12.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from support.synthetic_batches import (
    Head,
    Layout,
    attention_batch,
    from_targets,
    layout,
    random_attention,
    random_segments,
    split,
    stack_heads,
)

import bertology
from bertology.analysis import (
    PATTERN_DESCRIPTIONS,
    PATTERNS,
    PatternAccumulator,
    PatternThresholds,
    label_heads,
)
from bertology.attention.capturing import Attention, AttentionBatch
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.stats import SpecialTokens


def key(token: str) -> str:
    return token.lower().removeprefix("##")


def targets_where(s: Layout, related: Callable[[int, int], bool]) -> np.ndarray:
    """Each query attends to the keys ``related(q, k)`` picks, or to itself if there are none."""
    n = len(s)
    return from_targets([[k for k in range(n) if related(q, k)] or [q] for q in range(n)])


def next_head(s: Layout) -> np.ndarray:
    return from_targets([[min(q + 1, len(s) - 1)] for q in range(len(s))])


def previous_head(s: Layout) -> np.ndarray:
    return from_targets([[max(q - 1, 0)] for q in range(len(s))])


def sep_head(s: Layout) -> np.ndarray:
    return targets_where(s, lambda q, k: s.tokens[k] == "[SEP]")


def uniform_head(s: Layout) -> np.ndarray:
    return from_targets([range(len(s))] * len(s))


def word_piece_head(s: Layout) -> np.ndarray:
    return targets_where(s, lambda q, k: k != q and s.word_ids[q] >= 0 and s.word_ids[k] == s.word_ids[q])


def other_sentence_head(s: Layout) -> np.ndarray:
    return targets_where(
        s,
        lambda q, k: (
            not s.special[q]
            and not s.special[k]
            and s.segment_ids[q] != s.segment_ids[k]
            and key(s.tokens[q]) == key(s.tokens[k])
        ),
    )


def self_head(s: Layout) -> np.ndarray:
    return from_targets([[q] for q in range(len(s))])


def skip_head(s: Layout) -> np.ndarray:
    """Two tokens ahead: none of the patterns."""
    return from_targets([[min(q + 2, len(s) - 1)] for q in range(len(s))])


HEADS = {
    "next": next_head,
    "previous": previous_head,
    "delimiters": sep_head,
    "broad": uniform_head,
    "word_pieces": word_piece_head,
    "other_sentence": other_sentence_head,
    "same_word": self_head,
    "none": skip_head,
}
SINGLE = [layout(["the", "cat", ["un", "##bel", "##ie"], "sat", ".", "The", "mat"])]
PAIRS = [
    layout(["the", "dog", "barked", "loudly"], ["The", "dog", ["sle", "##pt"], "then"]),
    layout([["re", "##ad"], "a", "book", "today"], ["a", "cat", "sat", "down"]),
]


def batch_of(segments: list[Layout], heads: Sequence[Head] | None = None) -> AttentionBatch:
    chosen = list(HEADS.values()) if heads is None else heads
    return attention_batch(segments, [stack_heads(segment, chosen) for segment in segments])


def accumulate(*batches: AttentionBatch, **options: object) -> PatternAccumulator:
    accumulator = PatternAccumulator(**options)
    for batch in batches:
        accumulator.update(batch)
    return accumulator


def test_constructed_heads_get_their_labels() -> None:
    result = accumulate(batch_of(SINGLE), batch_of(PAIRS)).result()
    assert result.labels[0].tolist() == list(HEADS)
    scores = result.scores
    for column, label in enumerate(HEADS):
        if label not in ("broad", "none"):
            assert scores[label][0, column] == pytest.approx(1.0), label
    assert scores["broad"][0, 3] >= 1.0  # uniform over the segment is at least uniform over a sentence
    assert scores["same_word"][0, 4] == pytest.approx(1.0)  # word pieces win the tie by being specific
    assert result.scores.defined_segments["other_sentence"] == 2  # pairs only
    assert set(PATTERN_DESCRIPTIONS) == {*PATTERNS, "none"}


def test_broad_exceeds_1_exactly_where_rows_spread_beyond_the_sentence() -> None:
    """Uniform attention over the whole segment: in a single text that is uniform over the sentence (1);
    in a pair each query's row spreads over both sentences, so it scores ln n / ln m(q) > 1, m(q) being
    its own sentence's tokens (the broad docstring's account of scores above 1)."""
    single = accumulate(batch_of(SINGLE, [uniform_head])).result().scores["broad"]
    assert single[0, 0] == pytest.approx(1.0)
    pair = PAIRS[0]
    scores = accumulate(batch_of([pair], [uniform_head])).result().scores["broad"]
    sizes = np.bincount(pair.segment_ids)[pair.segment_ids]  # m(q): the tokens of q's sentence
    expected = np.mean(np.log(len(pair.tokens)) / np.log(sizes))
    assert scores[0, 0] == pytest.approx(expected) and expected > 1.3  # ln 12 / ln 6


def test_thresholds_decide_the_label() -> None:
    result = accumulate(batch_of(PAIRS)).result()
    strict = PatternThresholds(next=1.01, broad=2.0)
    labels = label_heads(result.scores.columns, strict)
    # Half of the next head's word-piece queries ("re", "sle") attend to their word's next piece.
    assert labels[0, 0] == "word_pieces" and labels[0, 3] == "none"
    nan_scores = {name: np.full((1, 1), np.nan) for name in PATTERNS}
    assert label_heads(nan_scores, PatternThresholds()).tolist() == [["none"]]


def mixed_head(strength: float) -> Head:
    """``strength`` on the next token, the rest on the token itself."""

    def head(s: Layout) -> np.ndarray:
        return strength * next_head(s) + (1 - strength) * self_head(s)

    return head


def test_best_segment_is_remembered_across_batches_and_merges() -> None:
    segments = PAIRS + SINGLE
    strengths = [0.6, 0.7, 0.55], [0.9, 0.65, 0.6]
    batches = [
        attention_batch(
            segments, [stack_heads(s, [mixed_head(x)]) for s, x in zip(segments, row, strict=True)]
        )
        for row in strengths
    ]
    one_pass = accumulate(*batches).result()
    assert one_pass.labels[0, 0] == "next"
    assert one_pass.label_segment[0, 0] == 3  # the first segment of the second batch
    assert one_pass.best_score["next"][0, 0] == pytest.approx(0.9)
    first = accumulate(batches[0])
    second = accumulate(batches[1], first_segment=3)
    for merged in (
        first.merge(second).result(),
        accumulate(batches[1], first_segment=3).merge(accumulate(batches[0])).result(),
    ):
        assert merged.label_segment[0, 0] == 3
        assert merged.best_segment["next"][0, 0] == 3


def test_ties_keep_the_earliest_segment() -> None:
    batch = batch_of(PAIRS + PAIRS, [next_head])
    later, earlier = accumulate(batch, first_segment=10), accumulate(batch, first_segment=2)
    assert later.merge(earlier).result().label_segment[0, 0] == 2
    single = accumulate(batch_of(SINGLE, [next_head])).result()
    assert single.best_segment["other_sentence"][0, 0] == -1
    assert single.best_score["other_sentence"][0, 0] == -np.inf


def reference_segment(example: Attention) -> dict[str, np.ndarray]:
    """Each pattern's ``[layers, heads]`` mean over one segment's queries, token by token."""
    n = len(example.tokens)
    word, segment, special = example.word_ids, example.segment_ids, example.special
    texts = [key(token) for token in example.tokens]

    def words(q: int, k: int) -> bool:
        return not special[q] and not special[k]

    related = {
        "word_pieces": lambda q, k: k != q and word[q] >= 0 and word[q] == word[k],
        "other_sentence": lambda q, k: words(q, k) and segment[q] != segment[k] and texts[q] == texts[k],
        "same_word": lambda q, k: words(q, k) and (texts[q] == texts[k] or word[q] == word[k]),
        "next": lambda q, k: k == q + 1,
        "previous": lambda q, k: k == q - 1,
        "delimiters": lambda q, k: bool(special[k]),
    }
    sentence_size = [sum(segment[k] == segment[q] for k in range(n)) for q in range(n)]

    def score(name: str, row: np.ndarray, q: int) -> float:
        if name == "broad":
            return -sum(p * math.log(p) for p in row if p > 0) / math.log(sentence_size[q])
        return sum(row[k] for k in range(n) if related[name](q, k))

    means = {}
    for name in PATTERNS:
        if name == "broad":
            queries = [q for q in range(n) if sentence_size[q] >= 2]
        else:
            queries = [q for q in range(n) if any(related[name](q, k) for k in range(n))]
        if queries:
            means[name] = np.zeros((example.num_layers, example.num_heads))
            for layer, head in np.ndindex(*means[name].shape):
                rows = example.probs[layer, head].astype(np.float64)
                means[name][layer, head] = np.mean([score(name, rows[q], q) for q in queries])
    return means


def reference_patterns(batch: AttentionBatch) -> dict[str, np.ndarray]:
    """Pattern scores: each segment's query mean, averaged over the segments that define it."""
    per_segment = [reference_segment(example) for example in batch]
    nothing = np.full(batch.probs.shape[1:3], np.nan)
    return {
        name: np.mean([means[name] for means in per_segment if name in means], axis=0)
        if any(name in means for means in per_segment)
        else nothing
        for name in PATTERNS
    }


@pytest.mark.parametrize("pairs", [False, True])
def test_vectorised_scores_equal_the_token_loop(pairs: bool) -> None:
    rng = np.random.default_rng(11 + pairs)
    batch = random_attention(random_segments(6, rng, pairs=pairs), layers=2, heads=3, rng=rng)
    scores = accumulate(batch).result().scores
    expected = reference_patterns(batch)
    for name in PATTERNS:
        np.testing.assert_allclose(scores[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_merged_halves_equal_one_pass_in_any_order() -> None:
    rng = np.random.default_rng(5)
    batch = random_attention(random_segments(9, rng, pairs=True), layers=2, heads=3, rng=rng)
    whole = accumulate(batch).result()
    first, second = split(batch, 5)
    for merged in (
        accumulate(first).merge(accumulate(second, first_segment=5)).result(),
        accumulate(second, first_segment=5).merge(accumulate(first)).result(),
        PatternAccumulator().merge(accumulate(second, first_segment=5)).merge(accumulate(first)).result(),
    ):
        assert merged.scores.segments == 9
        np.testing.assert_array_equal(merged.labels, whole.labels)
        np.testing.assert_array_equal(merged.label_segment, whole.label_segment)
        for name in PATTERNS:
            np.testing.assert_allclose(merged.scores[name], whole.scores[name], rtol=1e-12, err_msg=name)
            np.testing.assert_array_equal(merged.best_segment[name], whole.best_segment[name])
            np.testing.assert_allclose(merged.best_score[name], whole.best_score[name], rtol=1e-12)


def test_frame_json_and_errors() -> None:
    result = accumulate(batch_of(PAIRS)).result()
    frame = result.to_frame()
    assert list(frame.columns[:4]) == ["layer", "head", "label", "label_segment"]
    assert frame["label"].tolist() == list(HEADS) and list(frame.columns[4:]) == list(PATTERNS)
    data = json.loads(result.to_json())
    assert data["labels"][0] == list(HEADS) and data["thresholds"]["broad"] == 0.9
    assert data["label_segment"][0][-1] == -1  # "none" has no example
    with pytest.raises(BertologyError, match="no segments"):
        PatternAccumulator().result()


def test_real_batch_labels(default_model: LoadedModel) -> None:
    batch = bertology.capture_batch(
        ["The cat sat on the mat.", "Unbelievably, the dog barked."],
        ["The cat slept.", "The dog was loud, unbelievably loud."],
        model=default_model,
    )
    result = accumulate(batch, special=SpecialTokens.of(default_model)).result()
    assert result.labels.shape == (default_model.num_layers, default_model.num_heads)
    assert set(result.labels.reshape(-1)) <= set(PATTERN_DESCRIPTIONS)
    for name in PATTERNS[:-1]:
        assert np.all((result.scores[name] >= 0) & (result.scores[name] <= 1 + 1e-6)), name
    assert np.all((result.label_segment >= -1) & (result.label_segment < len(batch)))
    assert "previous" in result.labels and "delimiters" in result.labels
