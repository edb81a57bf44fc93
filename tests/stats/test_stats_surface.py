"""Surface statistics: known answers on constructed heads, a brute-force reference, merging, a real batch.

Tolerances: per-segment statistics are float32 (the attention's type, unit roundoff 2^-24 = 6e-8) summed
over at most a dozen keys, then averaged in float64: against exact values, rtol 1e-6 (and atol 1e-6 for an
entropy of 0, a float32 sum of p log p terms); against the float64 token-loop reference, rtol 1e-5 with atol
1e-6; against Clark et al.'s notebook's code run here in float64 on the same weights (ours smooths the
float32 rows in float32), rtol 2e-5, and a smoothed one-hot row's small entropy (about 1e-3, so float32's
absolute rounding is a larger part of it), rtol 1e-4; merged float64 sums in another order, rtol 1e-12.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from support.synthetic_batches import (
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
from bertology.attention.capturing import Attention, AttentionBatch
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.stats import SURFACE_STATISTICS, SpecialTokens, SurfaceAccumulator, TokenRoles
from bertology.stats.surface import CONVENTIONS


def next_head(s: Layout) -> np.ndarray:
    return from_targets([[min(q + 1, len(s) - 1)] for q in range(len(s))])


def previous_head(s: Layout) -> np.ndarray:
    return from_targets([[max(q - 1, 0)] for q in range(len(s))])


def sep_head(s: Layout) -> np.ndarray:
    seps = [k for k, token in enumerate(s.tokens) if token in ("[SEP]", "</s>")]
    return from_targets([seps] * len(s))


def uniform_head(s: Layout) -> np.ndarray:
    return from_targets([range(len(s))] * len(s))


def cls_head(s: Layout) -> np.ndarray:
    return from_targets([[0]] * len(s))


HEADS = (next_head, previous_head, sep_head, uniform_head, cls_head)

# Tolerances. Rows are summarised in float32 (u = 2^-24 ~ 6e-8), means over segments in float64.
#: A float32 sum over one row or one segment's queries of at most n <= 8 equal terms (the constructed
#: heads; each term itself a rounded 1 / n or (1 / n) ln n): relative error <= n u ~ 5e-7.
FLOAT32_SHORT_SUMS = 1e-6
#: Random rows of up to n ~ 51 keys (two 24-piece texts and 3 specials), summed in float32 and then over
#: up to n queries: relative error <= 2 n u ~ 6e-6 against the float64 token loop; the relative bound
#: says nothing for entries near 0 (masses on keys the peaky softmax barely reaches), hence the atol.
FLOAT32_ROWS_RTOL, FLOAT32_ROWS_ATOL = 1e-5, 1e-6
#: Float64 sums (segment counts and sums of means) merged in another order: a few ulps of 1e-16.
FLOAT64_REORDERED = 1e-12
TEXTS = [
    layout(["the", "cat", "sat", "."]),
    layout(["a", "dog", ",", "a", ["un", "##bel"]]),
    layout(["hi"]),
]


def surface(
    batch: AttentionBatch, special: SpecialTokens | None = None, convention: str = "bertology"
) -> dict[str, np.ndarray]:
    accumulator = SurfaceAccumulator(special, convention=convention)  # type: ignore[arg-type]
    accumulator.update(batch)
    return accumulator.result().columns


def batch_of(segments: list[Layout], layers: int = 1) -> AttentionBatch:
    return attention_batch(segments, [stack_heads(segment, HEADS, layers) for segment in segments])


def test_constructed_heads_have_known_statistics() -> None:
    stats = surface(batch_of(TEXTS, layers=2))
    assert stats["next"].shape == (2, len(HEADS))
    nxt, prev, sep, uniform, cls = range(len(HEADS))
    np.testing.assert_allclose(stats["next"][:, nxt], 1.0)
    np.testing.assert_allclose(stats["previous"][:, nxt], 0.0)
    np.testing.assert_allclose(stats["previous"][:, prev], 1.0)
    np.testing.assert_allclose(stats["next"][:, prev], 0.0)
    for name in ("sep", "sep_to_sep", "other_to_sep", "confidence"):
        np.testing.assert_allclose(stats[name][:, sep], 1.0, err_msg=name)
    np.testing.assert_allclose(stats["voita_confidence"][:, sep], 0.0)
    np.testing.assert_allclose(stats["confidence_without_delimiters"][:, sep], 0.0)
    # Voita et al. leave out only the end-of-sentence token: a head on [CLS] is fully confident there,
    # and 0 once [CLS] is left out as well.
    np.testing.assert_allclose(stats["voita_confidence"][:, cls], 1.0)
    np.testing.assert_allclose(stats["confidence_without_delimiters"][:, cls], 0.0)
    # The next-token head's last two queries look at [SEP] (the last one at itself): 0 there.
    np.testing.assert_allclose(
        stats["voita_confidence"][:, nxt], np.mean([(len(s) - 2) / len(s) for s in TEXTS])
    )
    np.testing.assert_allclose(stats["cls"][:, cls], 1.0)
    np.testing.assert_allclose(stats["cls"][:, sep], 0.0)

    mean_log_n = np.mean([math.log(len(s)) for s in TEXTS])
    np.testing.assert_allclose(stats["entropy"][:, uniform], mean_log_n, rtol=FLOAT32_SHORT_SUMS)
    np.testing.assert_allclose(stats["entropy_uniform"], mean_log_n, rtol=FLOAT32_SHORT_SUMS)
    np.testing.assert_allclose(stats["cls_entropy"][:, uniform], mean_log_n, rtol=FLOAT32_SHORT_SUMS)
    # Exact by construction (1 ln 1 = 0 and 0 ln(tiny) = 0); atol=0 would pass too.
    np.testing.assert_allclose(stats["entropy"][:, [nxt, prev, sep, cls]], 0.0, atol=1e-6)
    inverse_n = np.mean([1 / len(s) for s in TEXTS])
    # The maximum is one float32 1 / n: within u / 2 ~ 3e-8 of it.
    np.testing.assert_allclose(stats["confidence"][:, uniform], inverse_n, rtol=FLOAT32_SHORT_SUMS)
    # Every query of "a dog , a un ##bel" spreads over its 8 tokens, "," among them; "the cat sat ."
    # over its 6 with "."; "hi" has no punctuation.
    np.testing.assert_allclose(
        stats["punct"][:, uniform], np.mean([1 / 6, 1 / 8, 0.0]), rtol=FLOAT32_SHORT_SUMS
    )


def test_the_sink_is_a_decoders_mass_on_the_first_token_after_it() -> None:
    """Causal heads on 3 segments: all on token 0 (sink 1), on the previous token (sink 1 only from query
    1: the mean over queries 1..n-1 of [q == 1]), uniform over the keys up to the query (1 / (q + 1))."""
    segments = [layout(["a", "b", "c", "d", "e"], None), layout(["a", "b", "c"], None), layout(["a"], None)]
    probs = []
    for segment in segments:
        n = len(segment)
        sink, previous, uniform = np.zeros((3, n, n))
        sink[:, 0] = 1.0
        previous[0, 0] = 1.0
        previous[np.arange(1, n), np.arange(n - 1)] = 1.0
        uniform[:] = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
        probs.append(np.stack([sink, previous, uniform])[None])
    batch = attention_batch(segments, probs)
    decoder = surface(batch, SpecialTokens(None, None, causal=True))["sink"][0]
    lengths = [len(segment) for segment in segments]
    assert lengths[-1] > 1  # every segment has a query after its first token (with [CLS] and [SEP])
    np.testing.assert_allclose(decoder[0], 1.0)
    np.testing.assert_allclose(decoder[1], np.mean([1 / (n - 1) for n in lengths]), rtol=FLOAT32_SHORT_SUMS)
    uniform_sinks = [np.mean([1 / (q + 1) for q in range(1, n)]) for n in lengths]
    np.testing.assert_allclose(decoder[2], np.mean(uniform_sinks), rtol=FLOAT32_SHORT_SUMS)
    assert np.isnan(surface(batch)["sink"]).all()  # an encoder's first token is [CLS]: no sink column
    halves = [SurfaceAccumulator(SpecialTokens(None, None, causal=True)) for _ in range(2)]
    for half, part in zip(halves, split(batch, 2), strict=True):  # shards, as a cluster runs them
        half.update(part)
    np.testing.assert_allclose(
        halves[1].merge(halves[0]).result()["sink"][0], decoder, rtol=FLOAT64_REORDERED
    )


def test_roberta_special_tokens_are_found_by_their_own_strings() -> None:
    segments = [layout(["the", "cat"], ["a", "dog"], cls="<s>", sep="</s>", double_sep=True)]
    batch = batch_of(segments)
    roberta = surface(batch, SpecialTokens("<s>", "</s>"))
    sep = HEADS.index(sep_head)
    assert roberta["sep"][0, sep] == pytest.approx(1.0)
    assert roberta["sep_to_sep"][0, sep] == pytest.approx(1.0)
    assert roberta["cls"][0, HEADS.index(cls_head)] == pytest.approx(1.0)
    roles = TokenRoles.of(batch.encoded, batch.probs.shape[-1], cls_token="<s>", sep_token="</s>")
    assert roles.is_sep[0].tolist() == [False, False, False, True, True, False, False, True]
    with_bert_strings = surface(batch)  # no [CLS] or [SEP] found: attention to them is undefined, not 0
    for name in ("sep", "cls", "other_to_sep", "sep_to_sep", "cls_entropy"):
        assert np.isnan(with_bert_strings[name]).all()


def reference_segment(example: Attention, cls: str, sep: str) -> dict[str, np.ndarray]:
    """Each statistic's ``[layers, heads]`` mean over one segment's queries, token by token."""
    n = len(example.tokens)
    is_cls = [bool(s) and t == cls for t, s in zip(example.tokens, example.special, strict=True)]
    is_sep = [bool(s) and t == sep for t, s in zip(example.tokens, example.special, strict=True)]
    is_punct = [not s and t in (".", ",") for t, s in zip(example.tokens, example.special, strict=True)]
    every = list(range(n))

    def mass(row: np.ndarray, keys: list[bool]) -> float:
        return sum(row[k] for k in every if keys[k])

    def row_entropy(row: np.ndarray) -> float:
        return -sum(p * math.log(p) for p in row if p > 0)

    definitions = {
        "previous": (range(1, n), lambda row, q: row[q - 1]),
        "next": (range(n - 1), lambda row, q: row[q + 1]),
        "current": (every, lambda row, q: row[q]),
        "cls": (every, lambda row, q: mass(row, is_cls)),
        "sep": (every, lambda row, q: mass(row, is_sep)),
        "punct": (every, lambda row, q: mass(row, is_punct)),
        "sep_to_sep": ([q for q in every if is_sep[q]], lambda row, q: mass(row, is_sep)),
        "other_to_sep": ([q for q in every if not is_sep[q]], lambda row, q: mass(row, is_sep)),
        "entropy": (every, lambda row, q: row_entropy(row)),
        "entropy_uniform": (every, lambda row, q: math.log(n)),
        "cls_entropy": ([q for q in every if is_cls[q]], lambda row, q: row_entropy(row)),
        "cls_entropy_uniform": ([q for q in every if is_cls[q]], lambda row, q: math.log(n)),
        "confidence": (every, lambda row, q: max(row)),
        "voita_confidence": (every, lambda row, q: max(row[k] for k in every if not is_sep[k])),
        "confidence_without_delimiters": (
            every,
            lambda row, q: max(row[k] for k in every if not (is_cls[k] or is_sep[k])),
        ),
    }
    means = {}
    for name, (queries, value) in definitions.items():
        if len(queries) > 0:
            means[name] = np.zeros((example.num_layers, example.num_heads))
            for layer, head in np.ndindex(*means[name].shape):
                rows = example.probs[layer, head].astype(np.float64)
                means[name][layer, head] = np.mean([value(rows[q], q) for q in queries])
    return means


def reference_surface(batch: AttentionBatch, cls: str = "[CLS]", sep: str = "[SEP]") -> dict[str, np.ndarray]:
    """Clark-style averages: each segment's query mean, averaged over the segments that define it."""
    per_segment = [reference_segment(example, cls, sep) for example in batch]
    return {
        name: np.mean([means[name] for means in per_segment if name in means], axis=0)
        for name in SURFACE_STATISTICS
    }


@pytest.mark.parametrize("pairs", [False, True])
def test_vectorised_statistics_equal_the_token_loop(pairs: bool) -> None:
    rng = np.random.default_rng(7 + pairs)
    batch = random_attention(random_segments(6, rng, pairs=pairs), layers=2, heads=3, rng=rng)
    assert len(set(batch.lengths.tolist())) > 1  # padding is exercised
    stats = surface(batch)
    expected = reference_surface(batch)
    assert list(stats) == list(SURFACE_STATISTICS)
    for name in SURFACE_STATISTICS:
        np.testing.assert_allclose(
            stats[name], expected[name], rtol=FLOAT32_ROWS_RTOL, atol=FLOAT32_ROWS_ATOL, err_msg=name
        )


def test_merged_halves_equal_one_pass_in_any_order() -> None:
    rng = np.random.default_rng(3)
    batch = random_attention(random_segments(9, rng, pairs=True), layers=2, heads=2, rng=rng)
    whole = SurfaceAccumulator()
    whole.update(batch)
    first, second = split(batch, 4)
    halves = []
    for part in (first, second):
        halves.append(SurfaceAccumulator())
        halves[-1].update(part)
    forward = SurfaceAccumulator().merge(halves[0]).merge(halves[1]).result()
    backward = SurfaceAccumulator().merge(halves[1]).merge(halves[0]).result()
    for merged in (forward, backward):
        assert merged.segments == 9 and merged.defined_segments == whole.result().defined_segments
        for name in SURFACE_STATISTICS:
            np.testing.assert_allclose(
                merged[name], whole.result()[name], rtol=FLOAT64_REORDERED, err_msg=name
            )


def test_frame_and_json() -> None:
    table = SurfaceAccumulator()
    table.update(batch_of(TEXTS, layers=2))
    result = table.result()
    frame = result.to_frame()
    assert list(frame.columns) == ["layer", "head", *SURFACE_STATISTICS]
    assert len(frame) == 2 * len(HEADS)
    assert frame[["layer", "head"]].iloc[len(HEADS)].tolist() == [1, 0]
    assert frame["next"].iloc[0] == pytest.approx(1.0)
    data = json.loads(result.to_json())
    assert data["segments"] == 3 and data["layers"] == 2 and data["heads"] == len(HEADS)
    assert data["columns"]["previous"][1][1] == pytest.approx(1.0)


def test_errors_are_clear() -> None:
    with pytest.raises(BertologyError, match="no segments"):
        SurfaceAccumulator().result()
    accumulator = SurfaceAccumulator()
    accumulator.update(batch_of(TEXTS))
    other = SurfaceAccumulator()
    other.update(batch_of(TEXTS, layers=2))
    with pytest.raises(BertologyError, match="1 layers x 5 heads"):
        accumulator.merge(other)
    with pytest.raises(BertologyError, match="one model"):
        accumulator.update(batch_of(TEXTS, layers=2))


def test_real_batch_is_sane(default_model: LoadedModel) -> None:
    special = SpecialTokens.of(default_model)
    assert special == SpecialTokens("[CLS]", "[SEP]")
    texts = ["The quick brown fox jumps over the lazy dog.", "Unbelievably, it rained."]
    pairs = ["It was, however, tired.", "We stayed in."]
    batch = bertology.capture_batch(texts, pairs, model=default_model)
    accumulator = SurfaceAccumulator(special)
    accumulator.update(batch)
    stats = accumulator.result()
    assert stats["next"].shape == (default_model.num_layers, default_model.num_heads)
    for name in (
        "previous",
        "next",
        "current",
        "cls",
        "sep",
        "punct",
        "sep_to_sep",
        "other_to_sep",
        "confidence",
        "voita_confidence",
        "confidence_without_delimiters",
    ):
        assert np.all((stats[name] >= 0) & (stats[name] <= 1 + 1e-6)), name
    # previous, next and current are averaged over slightly different queries (a segment's first token
    # has no previous one), so their sum is bounded by n / (n - 1) rather than 1.
    bound = 1 + 1 / (batch.lengths.min() - 1) + 1e-6
    assert np.all(stats["previous"] + stats["next"] + stats["current"] <= bound)
    assert np.all(stats["entropy"] <= stats["entropy_uniform"] + 1e-6)
    assert np.all(stats["cls_entropy"] <= stats["cls_entropy_uniform"] + 1e-6)
    assert np.all(stats["confidence_without_delimiters"] <= stats["voita_confidence"])
    assert np.all(stats["voita_confidence"] <= stats["confidence"])
    assert stats["sep"].max() > 0.2 and stats["cls"].max() > 0.5


# --- Clark et al.'s released code -------------------------------------------------------------------

CLARK_NAMES = {"self": "current", "right": "next", "left": "previous", "sep": "sep", "sep_sep": "sep_to_sep"}
CLARK_NAMES |= {"rest_sep": "other_to_sep", "cls": "cls", "punct": "punct"}


def clark_notebook(documents: list[tuple[list[str], np.ndarray]]) -> dict[str, np.ndarray]:
    """General_Analysis.ipynb of github.com/clarkkev/attention-analysis, cells "Computing Average
    Attention to Particular Tokens/Positions" and "Computing Attention Head Entropies", as written there
    (``attns``: one document's unpadded ``[layers, heads, n, n]``), its 12 x 12 made ``layers x heads``."""
    n_docs = len(documents)
    shape = documents[0][1].shape[:2]
    avg_attns = {
        k: np.zeros(shape) for k in ["self", "right", "left", "sep", "sep_sep", "rest_sep", "cls", "punct"]
    }
    for tokens, attns in documents:
        n_tokens = attns.shape[-1]
        seps, clss, puncts = (np.zeros(n_tokens) for _ in range(3))
        for position, token in enumerate(tokens):
            if token == "[SEP]":
                seps[position] = 1
            if token == "[CLS]":
                clss[position] = 1
            if token == "." or token == ",":
                puncts[position] = 1
        sep_seps = np.ones((n_tokens, n_tokens))
        sep_seps *= seps[np.newaxis]
        sep_seps *= seps[:, np.newaxis]
        rest_seps = np.ones((n_tokens, n_tokens))
        rest_seps *= (np.ones(n_tokens) - seps)[:, np.newaxis]
        rest_seps *= seps[np.newaxis]
        selectors = {
            "self": np.eye(n_tokens, n_tokens),
            "right": np.eye(n_tokens, n_tokens, 1),
            "left": np.eye(n_tokens, n_tokens, -1),
            "sep": np.tile(seps[np.newaxis], [n_tokens, 1]),
            "sep_sep": sep_seps,
            "rest_sep": rest_seps,
            "cls": np.tile(clss[np.newaxis], [n_tokens, 1]),
            "punct": np.tile(puncts[np.newaxis], [n_tokens, 1]),
        }
        for key, selector in selectors.items():
            if key == "sep_sep":
                denom = 2
            elif key == "rest_sep":
                denom = n_tokens - 2
            else:
                denom = n_tokens
            avg_attns[key] += (attns * selector[np.newaxis, np.newaxis]).sum(-1).sum(-1) / (n_docs * denom)
    uniform_attn_entropy = 0.0
    entropies = np.zeros(shape)
    entropies_cls = np.zeros(shape)
    for _, attns in documents:
        attns = 0.9999 * attns + (0.0001 / attns.shape[-1])
        uniform_attn_entropy -= np.log(1.0 / attns.shape[-1])
        entropies -= (attns * np.log(attns)).sum(-1).mean(-1)
        entropies_cls -= (attns * np.log(attns))[:, :, 0].sum(-1)
    uniform_attn_entropy /= n_docs
    entropies /= n_docs
    entropies_cls /= n_docs
    results = {CLARK_NAMES[key]: values for key, values in avg_attns.items()}
    return results | {
        "entropy": entropies,
        "cls_entropy": entropies_cls,
        "entropy_uniform": uniform_attn_entropy,
    }


@pytest.mark.parametrize("pairs", [True, False])
def test_clark_convention_reproduces_the_released_notebook(pairs: bool) -> None:
    rng = np.random.default_rng(11 + pairs)
    batch = random_attention(random_segments(7, rng, pairs=pairs), layers=2, heads=3, rng=rng)
    assert len(set(batch.lengths.tolist())) > 1  # padding is exercised
    stats = surface(batch, convention="clark")
    expected = clark_notebook([(example.tokens, example.probs.astype(np.float64)) for example in batch])
    # As FLOAT32_ROWS_*, and the smoothed entropy's float32 logs: each weight p is rounded by ~p u, moving
    # p ln p by ~p u (|ln p| + 1), i.e. the entropy by ~u (H + 1); twice the plain-row rtol covers it.
    for name, values in expected.items():
        np.testing.assert_allclose(
            stats[name], np.broadcast_to(values, (2, 3)), rtol=2e-5, atol=FLOAT32_ROWS_ATOL, err_msg=name
        )
    default = surface(batch)
    for name in SURFACE_STATISTICS.keys() - CLARK_NAMES.values() - {"entropy", "cls_entropy"}:
        np.testing.assert_array_equal(stats[name], default[name], err_msg=name)


def test_conventions_differ_where_documented() -> None:
    """A head on the previous token: 1 over the n - 1 queries that have one, (n - 1) / n over all n."""
    stats = {convention: surface(batch_of(TEXTS), convention=convention) for convention in CONVENTIONS}
    prev = HEADS.index(previous_head)
    np.testing.assert_allclose(stats["bertology"]["previous"][:, prev], 1.0)
    expected = np.mean([(len(s) - 1) / len(s) for s in TEXTS])
    # float32 sums of ones are exact; only the float64 division by n rounds (an ulp): exact in effect.
    np.testing.assert_allclose(stats["clark"]["previous"][:, prev], expected, rtol=1e-6)
    # Smoothing lifts a one-hot row's entropy above 0 (0.9999 + 0.0001 / n on one key, 0.0001 / n elsewhere).
    n = np.array([len(s) for s in TEXTS])
    top, rest = 0.9999 + 1e-4 / n, 1e-4 / n
    one_hot = np.mean(-(top * np.log(top) + (n - 1) * rest * np.log(rest)))
    # The entropy is only ~1e-3 (n = 3..8), and float32 rounds the top weight near 1 by up to u / 2 ~ 3e-8,
    # which moves top ln(top) by as much: ~4e-5 of the entropy for n = 3; 1e-4 leaves a margin.
    np.testing.assert_allclose(stats["clark"]["entropy"][:, prev], one_hot, rtol=1e-4)


def test_clark_convention_needs_smoothed_rows_and_does_not_merge_with_the_other() -> None:
    from bertology.stats.rows import RowSummary

    batch = batch_of(TEXTS)
    with pytest.raises(BertologyError, match="smoothing"):
        SurfaceAccumulator(convention="clark").update_rows(RowSummary.of(batch, SpecialTokens()))
    with pytest.raises(BertologyError, match="convention"):
        SurfaceAccumulator().merge(SurfaceAccumulator(convention="clark"))
    with pytest.raises(BertologyError, match="Unknown convention"):
        SurfaceAccumulator(convention="paper")  # type: ignore[arg-type]
