"""Word-level attention: hand-computed numbers, the three modes, a brute-force reference, a real capture.

Tolerances: word attention sums float32 piece weights (<= 1) over a word's few pieces; the brute-force
reference sums them in float64 in another order: a few units of 2^-24, so atol 1e-6; a row's sum over all
words of a real sentence (dozens of terms) within 1e-5, over the default model's longer rows 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.attention.capturing import Attention, capture
from bertology.attention.words import (
    WORD_MODES,
    UnitMaps,
    Units,
    WordAttention,
    WordMode,
    padded_units,
    word_attention,
)
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel


def make_attention(probs: np.ndarray, tokens: list[str], word_ids: list[int], words: list[str]) -> Attention:
    """An :class:`Attention` of one text with the given ``probs [layers, heads, n, n]``."""
    n = len(tokens)
    ids = np.array(word_ids)
    return Attention(
        probs=probs.astype(np.float32),
        tokens=tokens,
        segment_ids=np.zeros(n, dtype=np.int64),
        special=ids < 0,
        word_ids=ids,
        words=words,
        word_segments=np.zeros(len(words), dtype=np.int64),
        queries=None,
        keys=None,
        scaling=np.ones(probs.shape[0]),
        truncated=0,
        model_name="constructed",
    )


# [CLS] the un ##bel ##ievable cat [SEP]: "unbelievable" is split into 3 pieces (tokens 2-4).
SPLIT_TOKENS = ["[CLS]", "the", "un", "##bel", "##ievable", "cat", "[SEP]"]
SPLIT_WORD_IDS = [-1, 0, 1, 1, 1, 2, -1]
SPLIT_WORDS = ["the", "unbelievable", "cat"]
SPLIT_PROBS = np.array(
    [
        [0.1, 0.1, 0.2, 0.2, 0.2, 0.1, 0.1],
        [0.0, 0.5, 0.1, 0.1, 0.1, 0.2, 0.0],
        [0.2, 0.0, 0.4, 0.2, 0.0, 0.0, 0.2],
        [0.0, 0.0, 0.0, 0.0, 0.6, 0.4, 0.0],
        [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.4],
        [0.3, 0.3, 0.0, 0.0, 0.0, 0.4, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    ]
)
# Attention of each token TO the units [CLS], the, unbelievable, cat, [SEP] (columns 2-4 summed).
TO_UNITS = np.array(
    [
        [0.1, 0.1, 0.6, 0.1, 0.1],
        [0.0, 0.5, 0.3, 0.2, 0.0],
        [0.2, 0.0, 0.6, 0.0, 0.2],
        [0.0, 0.0, 0.6, 0.4, 0.0],
        [0.1, 0.1, 0.3, 0.1, 0.4],
        [0.3, 0.3, 0.0, 0.4, 0.0],
        [0.0, 0.0, 0.0, 0.0, 1.0],
    ]
)
# The row FROM "unbelievable" in each mode, by hand from rows 2-4 of TO_UNITS.
SPLIT_ROW = {
    "mean": np.array([0.3, 0.1, 1.5, 0.5, 0.6]) / 3,
    "first": np.array([0.2, 0.0, 0.6, 0.0, 0.2]),
    "max": np.array([0.2, 0.1, 0.6, 0.4, 0.4]) / 1.7,
}


def split_word_attention(mode: WordMode) -> WordAttention:
    return word_attention(
        make_attention(SPLIT_PROBS[None, None], SPLIT_TOKENS, SPLIT_WORD_IDS, SPLIT_WORDS), mode
    )


@pytest.mark.parametrize("mode", WORD_MODES)
def test_split_word_by_hand(mode: WordMode) -> None:
    words = split_word_attention(mode)
    expected = np.delete(TO_UNITS, [3, 4], axis=0)  # rows of unsplit units are the token rows
    expected[2] = SPLIT_ROW[mode]
    assert words.probs.shape == (1, 1, 5, 5)
    assert words.probs.dtype == np.float32
    np.testing.assert_allclose(words.probs[0, 0], expected, atol=1e-6)
    np.testing.assert_allclose(words.probs.sum(-1), 1.0, atol=1e-6)
    assert words.labels == ["[CLS]", "the", "unbelievable", "cat", "[SEP]"]
    assert words.word_positions.tolist() == [1, 2, 3]


def test_between_words_drops_special_tokens() -> None:
    words = split_word_attention("mean")
    np.testing.assert_allclose(words.between_words()[0, 0], words.probs[0, 0, 1:4, 1:4])


def test_word_without_tokens_has_no_position() -> None:
    tokens, word_ids = ["[CLS]", "a", "b", "[SEP]"], [-1, 0, 2, -1]
    words = word_attention(make_attention(np.full((1, 1, 4, 4), 0.25), tokens, word_ids, ["a", "\x07", "b"]))
    assert words.word_positions.tolist() == [1, -1, 2]
    assert not words.covers_all_words
    with pytest.raises(BertologyError, match="1 of 3 words have no tokens"):
        words.between_words()


def test_unknown_mode() -> None:
    with pytest.raises(BertologyError, match="Unknown word mode 'sum'"):
        split_word_attention("sum")  # type: ignore[arg-type]


def brute_force(attention: Attention, mode: WordMode) -> tuple[np.ndarray, list[str]]:
    """Word attention with explicit loops over units and tokens: the reference for ``word_attention``."""
    units: list[list[int]] = []
    unit_of_word: dict[int, int] = {}
    for token, word in enumerate(attention.word_ids.tolist()):
        if word >= 0 and word in unit_of_word:
            units[unit_of_word[word]].append(token)
            continue
        if word >= 0:
            unit_of_word[word] = len(units)
        units.append([token])
    unit_words = [int(attention.word_ids[unit[0]]) for unit in units]
    labels = [
        attention.words[word] if word >= 0 else attention.tokens[unit[0]]
        for unit, word in zip(units, unit_words, strict=True)
    ]
    layers, heads, m = attention.num_layers, attention.num_heads, len(units)
    result = np.zeros((layers, heads, m, m))
    for layer in range(layers):
        for head in range(heads):
            probs = attention.probs[layer, head].astype(np.float64)
            for a, from_tokens in enumerate(units):
                rows = np.array([[probs[t, to_tokens].sum() for to_tokens in units] for t in from_tokens])
                if mode == "mean":
                    result[layer, head, a] = rows.mean(0)
                elif mode == "first":
                    result[layer, head, a] = rows[0]
                else:
                    result[layer, head, a] = rows.max(0) / rows.max(0).sum()
    return result, labels


def random_attention(rng: np.random.Generator) -> Attention:
    """Random probs over a random layout: [CLS] words [SEP] (and sometimes words [SEP] of text B),
    each word 1-3 pieces."""
    word_ids, tokens, words = [-1], ["[CLS]"], []
    for _text in range(int(rng.integers(1, 3))):
        for _word in range(int(rng.integers(1, 6))):
            pieces = int(rng.integers(1, 4))
            word_ids += [len(words)] * pieces
            tokens += [f"w{len(words)}"] + [f"##p{piece}" for piece in range(1, pieces)]
            words.append(f"word{len(words)}")
        word_ids.append(-1)
        tokens.append("[SEP]")
    logits = rng.normal(size=(2, 3, len(tokens), len(tokens))) * 2
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    return make_attention(probs, tokens, word_ids, words)


@pytest.mark.parametrize("mode", WORD_MODES)
def test_matches_brute_force(mode: WordMode) -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        attention = random_attention(rng)
        words = word_attention(attention, mode)
        expected, labels = brute_force(attention, mode)
        np.testing.assert_allclose(words.probs, expected, atol=1e-6)
        assert words.labels == labels
        np.testing.assert_allclose(words.probs.sum(-1), 1.0, atol=1e-5)
        assert [words.labels[p] for p in words.word_positions] == attention.words


def test_real_capture(default_model: LoadedModel) -> None:
    sentence = ["The", "unbelievably", "tokenizable", "cat", "sat", "."]
    attention = capture(sentence, model=default_model)
    assert len(attention.tokens) > len(sentence) + 2  # some words are split
    for mode in WORD_MODES:
        words = word_attention(attention, mode)
        m = len(sentence) + 2
        assert words.probs.shape == (default_model.num_layers, default_model.num_heads, m, m)
        np.testing.assert_allclose(words.probs.sum(-1), 1.0, atol=1e-4)
        assert words.labels == ["[CLS]", *sentence, "[SEP]"]
        assert words.word_positions.tolist() == list(range(1, len(sentence) + 1))


@pytest.mark.parametrize("mode", WORD_MODES)
def test_padded_batch_with_selected_words_matches_brute_force(mode: WordMode) -> None:
    """UnitMaps over a right-padded batch of inputs of different lengths, keeping only the words (as the
    dependency probe does): each input's rows equal the brute force's, restricted to its words."""
    rng = np.random.default_rng(11)
    inputs = [random_attention(rng) for _ in range(5)]
    width = max(len(attention.tokens) for attention in inputs) + 3  # padding past the longest too
    probs = np.zeros((len(inputs), 3, width, width))  # one layer per input: [batch, heads, n, n]
    for row, attention in enumerate(inputs):
        n = len(attention.tokens)
        probs[row, :, :n, :n] = attention.probs[1]
        probs[row, :, n:, 0] = 1.0  # padding rows attend somewhere; they must not count
    units = [Units.of(np.asarray(attention.word_ids)) for attention in inputs]
    unit, most = padded_units(units, width)
    positions = [
        u.word_positions(np.asarray(a.word_ids), len(a.words)) for u, a in zip(units, inputs, strict=True)
    ]
    select = np.zeros((len(inputs), max(len(p) for p in positions)), dtype=np.int64)
    for row, words in enumerate(positions):
        select[row, : len(words)] = words
    between = UnitMaps(unit, most, mode, select=torch.from_numpy(select))(torch.from_numpy(probs)).numpy()
    for row, attention in enumerate(inputs):
        expected, _ = brute_force(attention, mode)
        words = positions[row]
        np.testing.assert_allclose(
            between[row, :, : len(words), : len(words)], expected[1][:, words][:, :, words], atol=1e-6
        )
