"""Jensen-Shannon head distances against a double loop over head pairs, sampling, merging, and MDS.

Tolerances: float32 JS divergences summed in head blocks and column chunks against a float64 reference:
atol 2e-5 over a whole corpus's sums, 2e-6 on the per-token means; merged float64 sums in another order,
rtol 1e-6, atol 1e-9; MDS recovers a Euclidean distance matrix to its solver's convergence, 1e-3; symmetry
of one float64 matrix, 1e-12.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from support.synthetic_batches import (
    attention_batch,
    from_targets,
    layout,
    random_attention,
    random_segments,
    split,
)

import bertology
from bertology.analysis import DistanceAccumulator, js_divergence_sums, mds_embedding
from bertology.attention.capturing import AttentionBatch
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel


def reference_js_sums(rows: np.ndarray) -> np.ndarray:
    """rows: [heads, tokens, keys]; the sum over tokens of JS (nats) for every pair, by a double loop."""
    heads = rows.shape[0]
    sums = np.zeros((heads, heads))
    for i in range(heads):
        for j in range(heads):
            sums[i, j] = np.sum(jensenshannon(rows[i], rows[j], axis=1) ** 2)
    return sums


def reference_distance(batch: AttentionBatch, accumulator: DistanceAccumulator) -> np.ndarray:
    """Mean JS per query token; rows of all segments padded with zero keys to a common width."""
    width = int(batch.lengths.max())
    stacked = []
    for index, example in enumerate(batch):
        n = len(example.tokens)
        heads = example.probs.reshape(-1, n, n)[:, accumulator.query_tokens(n, index)]
        stacked.append(np.pad(heads.astype(np.float64), ((0, 0), (0, 0), (0, width - n))))
    rows = np.concatenate(stacked, axis=1)
    return reference_js_sums(rows) / rows.shape[1]


def accumulate(*batches: AttentionBatch, **options: object) -> DistanceAccumulator:
    accumulator = DistanceAccumulator(**options)
    for batch in batches:
        accumulator.update(batch)
    return accumulator


def test_js_sums_equal_the_double_loop_with_blocks_chunks_and_zeros() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((30, 7, 9)) * 3
    rows = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    rows[:5, :, 3:] = 0.0  # exact zeros, as from underflow or a head that ignores keys
    rows[:5] /= rows[:5].sum(-1, keepdims=True)
    expected = reference_js_sums(rows)
    tensor = torch.from_numpy(rows.astype(np.float32)).reshape(30, -1)
    for chunk_elements in (None, 1000):  # one pass; many head blocks and column chunks
        np.testing.assert_allclose(
            js_divergence_sums(tensor, chunk_elements=chunk_elements).numpy(), expected, atol=2e-5
        )


def test_known_distances() -> None:
    segments = [layout(["the", "cat", "sat"]), layout(["a", "dog"], ["it", "ran", "off"])]

    def heads(n: int) -> np.ndarray:
        first = from_targets([[0]] * n)
        last = from_targets([[n - 1]] * n)
        return np.stack([first, first, last, from_targets([range(n)] * n)])[None]

    result = accumulate(attention_batch(segments, [heads(len(s)) for s in segments])).result()
    distance = result.distance
    assert distance[0, 1] == 0.0 and distance[0, 2] == pytest.approx(math.log(2))
    assert result.tokens == sum(len(s) for s in segments) and result.segments == 2
    np.testing.assert_allclose(distance, distance.T)
    np.testing.assert_array_equal(np.diag(distance), 0.0)


@pytest.mark.parametrize("max_tokens", [None, 4])
def test_accumulator_equals_the_double_loop(max_tokens: int | None) -> None:
    rng = np.random.default_rng(2)
    batch = random_attention(random_segments(6, rng, pairs=True), layers=2, heads=3, rng=rng)
    accumulator = accumulate(batch, max_tokens_per_segment=max_tokens, seed=5)
    result = accumulator.result()
    expected_tokens = sum(min(int(n), max_tokens or int(n)) for n in batch.lengths)
    assert result.tokens == expected_tokens and result.distance.shape == (6, 6)
    np.testing.assert_allclose(result.distance, reference_distance(batch, accumulator), atol=2e-6)


def test_sampling_is_seeded_and_independent_of_batching() -> None:
    rng = np.random.default_rng(4)
    batch = random_attention(random_segments(8, rng, pairs=False), layers=1, heads=4, rng=rng)
    options = {"max_tokens_per_segment": 3, "seed": 1}
    whole = accumulate(batch, **options).result()
    first, second = split(batch, 3)
    for merged in (
        accumulate(first, **options).merge(accumulate(second, first_segment=3, **options)),
        accumulate(second, first_segment=3, **options).merge(accumulate(first, **options)),
        DistanceAccumulator()
        .merge(accumulate(second, first_segment=3, **options))
        .merge(accumulate(first, **options)),
    ):
        result = merged.result()
        assert (result.tokens, result.segments) == (whole.tokens, whole.segments)
        np.testing.assert_allclose(result.js_sum, whole.js_sum, rtol=1e-6, atol=1e-9)
    other_seed = accumulate(batch, max_tokens_per_segment=3, seed=2).result()
    assert not np.allclose(other_seed.js_sum, whole.js_sum)
    np.testing.assert_array_equal(accumulate(batch, **options).result().js_sum, whole.js_sum)


def test_frame_json_and_errors() -> None:
    rng = np.random.default_rng(1)
    batch = random_attention(random_segments(2, rng, pairs=False), layers=2, heads=2, rng=rng)
    result = accumulate(batch).result()
    frame = result.to_frame()
    assert frame.shape == (4, 4) and frame.index.names == ["layer", "head"]
    assert frame.loc[(1, 0), (0, 1)] == result.distance[2, 1]
    data = json.loads(result.to_json())
    assert data["layers"] == 2 and data["tokens"] == result.tokens and len(data["js_divergence"]) == 4
    with pytest.raises(BertologyError, match="no segments"):
        DistanceAccumulator().result()
    with pytest.raises(BertologyError, match="at least 1"):
        DistanceAccumulator(max_tokens_per_segment=0)
    other = random_attention(random_segments(2, rng, pairs=False), layers=1, heads=2, rng=rng)
    with pytest.raises(BertologyError, match="one model"):
        accumulate(batch).update(other)


def test_mds_recovers_a_planar_configuration_and_is_seeded() -> None:
    points = np.random.default_rng(3).uniform(-1, 1, (10, 2))
    distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
    embedding = mds_embedding(distance, seed=0)
    assert embedding.shape == (10, 2)
    recovered = np.linalg.norm(embedding[:, None] - embedding[None], axis=-1)
    np.testing.assert_allclose(recovered, distance, atol=1e-3)
    np.testing.assert_array_equal(mds_embedding(distance, seed=0), embedding)


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (np.zeros((2, 2)), "at least 3 heads"),
        (np.zeros((3, 4)), "square"),
        (np.full((3, 3), np.nan), "finite"),
        (np.array([[0, 1, 2], [1, 0, 1], [0, 1, 0]]), "symmetric"),
    ],
)
def test_mds_rejects_bad_input(matrix: np.ndarray, message: str) -> None:
    with pytest.raises(BertologyError, match=message):
        mds_embedding(matrix)


def test_real_batch_distances(default_model: LoadedModel) -> None:
    batch = bertology.capture_batch(
        ["The cat sat on the mat.", "Unbelievably, the dog barked all night."], model=default_model
    )
    result = accumulate(batch, max_tokens_per_segment=6).result()
    heads = default_model.num_layers * default_model.num_heads
    distance = result.distance
    assert distance.shape == (heads, heads) and result.tokens == 12
    assert np.all((distance >= 0) & (distance <= math.log(2))) and distance.max() > 0.1
    np.testing.assert_allclose(distance, distance.T, atol=1e-12)
    assert mds_embedding(distance).shape == (heads, 2)
