"""Distances between attention heads by Jensen-Shannon divergence, and a 2-D map of the heads.

Clark et al. 2019 (Sec. 6) define the distance of heads ``Hi`` and ``Hj`` as
``D(Hi, Hj) = sum over query tokens t of JS(Hi(t), Hj(t))``, where ``Hi(t)`` is head ``i``'s attention
row for token ``t`` and ``JS`` the Jensen-Shannon divergence (natural log, so in nats, at most
``ln 2``). :class:`DistanceAccumulator` streams that sum for every pair of a model's ``L*H`` heads and
reports it per query token (the sum divided by the number of query tokens): the mean JS divergence,
which does not grow with the corpus and has the same MDS picture. It is a divergence, not the
Jensen-Shannon distance (its square root). Heads are numbered layer-major: index ``layer * H + head``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.models.devices import float64_home
from bertology.stats.base import SegmentCounter, check_same_shape, on_the_host

if TYPE_CHECKING:
    import pandas as pd

    from bertology.attention.capturing import AttentionBatch

#: Probabilities are raised to at least this before taking logs; ``x ln x`` there is ~1e-28, i.e. 0.
_TINY = 1e-30

#: Heads per block of the pairwise computation (8: fastest on a 2-core CPU, benchmarks/RESULTS.md).
_BLOCK_HEADS = 8


def _default_chunk(rows: torch.Tensor) -> int:
    """Scratch buffer size in elements: ``2**19`` on the CPU (2 MB, about a core's L2 cache), ``2**24`` on a
    GPU."""
    return 2**19 if rows.device.type == "cpu" else 2**24


def _row_terms(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows as float32 raised to :data:`_TINY`, ``sum p ln p`` [G] and ``sum p`` [G], both float64)."""
    rows = rows.float().clamp_min(_TINY)
    return (
        rows,
        torch.special.xlogy(rows, rows).sum(-1, dtype=torch.float64),
        rows.sum(-1, dtype=torch.float64),
    )


def _mixed_block(
    left: torch.Tensor, right: torch.Tensor, sums: torch.Tensor, logs: torch.Tensor
) -> torch.Tensor:
    """``[len(left), len(right)]`` float64 ``sum s ln s`` over the columns, ``s = left_i + right_j``;
    ``sums`` and ``logs`` are scratch buffers of at least that many rows and ``left``'s columns."""
    used = left.shape[1]
    pair_sums = sums[: len(left), : len(right), :used]
    torch.add(left[:, None, :], right[None, :, :], out=pair_sums)
    pair_logs = torch.log(pair_sums, out=logs[: len(left), : len(right), :used])
    return pair_logs.mul_(pair_sums).sum(-1).double()  # float32 within a chunk, float64 across


def _js_from_terms(
    mixed: torch.Tensor,
    entropy_left: torch.Tensor,
    totals_left: torch.Tensor,
    entropy_right: torch.Tensor,
    totals_right: torch.Tensor,
) -> torch.Tensor:
    """``JS = (sum p ln p + sum q ln q) / 2 - sum s ln s / 2 + ln 2 * (sum p + sum q) / 2`` for every pair."""
    halves = (entropy_left[:, None] + entropy_right[None, :]) / 2
    return halves - mixed / 2 + math.log(2) * (totals_left[:, None] + totals_right[None, :]) / 2


def js_divergence_sums(rows: torch.Tensor, *, chunk_elements: int | None = None) -> torch.Tensor:
    """``[G, G]`` float64: for every pair of heads, the sum over tokens of ``JS(p_i(t), p_j(t))`` in nats.

    rows: [G, M] float, each head's attention rows laid end to end (e.g. ``[G, T, K]`` reshaped, or the
        rows of several segments of different lengths concatenated); the columns must line up across
        heads, and each row of every token sums to 1.
    chunk_elements: size of each of the two scratch buffers, in elements; bounds the memory. Default:
        ``2**19`` on the CPU (buffers about the size of a core's L2 cache, fastest there), ``2**24`` on a
        GPU.

    Because ``JS(p, q) = sum_k [p_k ln p_k / 2 + q_k ln q_k / 2 - m_k ln m_k]`` with ``m = (p + q) / 2``
    is a sum over keys, the sum over tokens is a sum over the ``M`` columns. With ``s = p + q``,
    ``m ln m = (s ln s - s ln 2) / 2``, so per pair only ``sum s ln s`` needs the pair's values; it is
    computed in blocks of heads and columns into preallocated buffers. Runs on ``rows``' device.
    """
    heads, width = rows.shape
    chunk_elements = chunk_elements or _default_chunk(rows)
    rows, entropy_terms, totals = _row_terms(rows)
    block = min(heads, _BLOCK_HEADS)
    columns = min(width, max(1, chunk_elements // (block * block)))
    pair_sums = rows.new_empty(block, block, columns)
    pair_logs = torch.empty_like(pair_sums)
    mixed = torch.zeros(heads, heads, dtype=torch.float64, device=rows.device)  # sum s ln s
    for start in range(0, width, columns):
        part = rows[:, start : start + columns]
        for i in range(0, heads, block):
            left = part[i : i + block]
            for j in range(i, heads, block):
                term = _mixed_block(left, part[j : j + block], pair_sums, pair_logs)
                mixed[i : i + block, j : j + block] += term
                if j != i:
                    mixed[j : j + block, i : i + block] += term.T
    js = _js_from_terms(mixed, entropy_terms, totals, entropy_terms, totals)
    return js.fill_diagonal_(0.0)


def js_cross_sums(
    left: torch.Tensor, right: torch.Tensor, *, chunk_elements: int | None = None
) -> torch.Tensor:
    """``[Ga, Gb]`` float64: for every head ``a`` of one model and ``b`` of another, the sum over tokens of
    ``JS(p_a(t), q_b(t))`` in nats (at least 0), computed as in :func:`js_divergence_sums`.

    left: [Ga, M], right: [Gb, M] float, each head's attention rows on the same inputs laid end to end;
        the columns of the two must line up (the same query tokens and keys, in the same order).
    chunk_elements: as in :func:`js_divergence_sums`.

    Raises:
        BertologyError: the two have different numbers of columns.
    """
    if left.shape[1] != right.shape[1]:
        raise BertologyError(
            f"Cross distances need rows over the same tokens, but got {left.shape[1]} and {right.shape[1]} "
            "columns."
        )
    chunk_elements = chunk_elements or _default_chunk(left)
    left, entropy_left, totals_left = _row_terms(left)
    right, entropy_right, totals_right = _row_terms(right)
    block = min(max(len(left), len(right)), _BLOCK_HEADS)
    columns = min(left.shape[1], max(1, chunk_elements // (block * block)))
    pair_sums = left.new_empty(block, block, columns)
    pair_logs = torch.empty_like(pair_sums)
    mixed = torch.zeros(len(left), len(right), dtype=torch.float64, device=left.device)
    for start in range(0, left.shape[1], columns):
        part_right = right[:, start : start + columns]
        for i in range(0, len(left), block):
            part_left = left[i : i + block, start : start + columns]
            for j in range(0, len(right), block):
                mixed[i : i + block, j : j + block] += _mixed_block(
                    part_left, part_right[j : j + block], pair_sums, pair_logs
                )
    return _js_from_terms(mixed, entropy_left, totals_left, entropy_right, totals_right).clamp_min_(0.0)


@dataclass
class HeadDistances:
    """The mean Jensen-Shannon divergence between every two heads of a model (Clark et al.'s distance
    between heads, divided by the number of query tokens).

    js_sum: [G, G] float64, ``G = layers * heads`` (layer-major), the sum over query tokens of the JS
        divergence (nats) of the two heads' attention rows.
    tokens: query tokens summed over. segments: segments seen.
    """

    js_sum: np.ndarray
    tokens: int
    segments: int
    num_layers: int
    num_heads: int

    @property
    def distance(self) -> np.ndarray:
        """[G, G] float64 mean JS divergence per query token, in nats (0 .. ln 2); symmetric, 0 diagonal."""
        return np.clip(self.js_sum / self.tokens, 0.0, math.log(2))

    @property
    def heads(self) -> list[tuple[int, int]]:
        """``(layer, head)`` of each row / column, 0-based."""
        return [divmod(index, self.num_heads) for index in range(self.num_layers * self.num_heads)]

    def to_frame(self) -> pd.DataFrame:
        """:attr:`distance` as a square frame, rows and columns indexed by ``(layer, head)`` (0-based)."""
        import pandas as pd

        index = pd.MultiIndex.from_tuples(self.heads, names=["layer", "head"])
        return pd.DataFrame(self.distance, index=index, columns=index)

    def to_json(self) -> str:
        """JSON text with the sizes and :attr:`distance` as ``js_divergence``, a ``[G][G]`` list (rows
        layer-major)."""
        return json.dumps(
            {
                "layers": self.num_layers,
                "heads": self.num_heads,
                "segments": self.segments,
                "tokens": self.tokens,
                "unit": "mean Jensen-Shannon divergence per query token, nats",
                "js_divergence": self.distance.tolist(),
            }
        )


class RowSampler:
    """Collects, layer by layer, the attention rows of each segment's sampled query tokens.

    queries: per segment, the positions of its query tokens; lengths: per segment, its real tokens (its real
    keys, where they are other tokens than the queries).
    Each layer's rows of all segments are taken in one gather, ``[M, H, N]`` for the ``M`` sampled
    queries of the batch.
    """

    def __init__(self, queries: list[np.ndarray], lengths: list[int]) -> None:
        self.queries = queries
        self.lengths = lengths
        counts = [len(positions) for positions in queries]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self.segment_of = torch.from_numpy(np.repeat(np.arange(len(queries)), counts))
        self.position = torch.from_numpy(np.concatenate(queries).astype(np.int64))
        self.layers: list[torch.Tensor] = []  # [layer] -> [M, heads, N]

    @property
    def heads_per_layer(self) -> int:
        return self.layers[0].shape[1]

    def add_layer(self, probs: torch.Tensor) -> None:
        """Keep the sampled rows of one layer: ``probs`` [B, H, N, N]."""
        segment, position = self.segment_of.to(probs.device), self.position.to(probs.device)
        self.add_rows(probs[segment, :, position])

    def add_rows(self, rows: torch.Tensor) -> None:
        """Keep one layer's sampled rows, already taken: ``rows`` [M, H, N], row ``i`` query
        :attr:`position` ``[i]`` of segment :attr:`segment_of` ``[i]`` (e.g. computed from queries and
        keys, :meth:`bertology.attention.long_capture.LayerQueriesKeys.rows_at`)."""
        self.layers.append(rows.float())

    def segment_rows(self, index: int) -> torch.Tensor:
        """``[L*H, T*n]``: segment ``index``'s sampled rows of every head (layer-major), laid end to end."""
        start, end, n = self.starts[index], self.starts[index + 1], self.lengths[index]
        rows = torch.stack([layer[start:end, :, :n] for layer in self.layers])  # [L, T, H, n]
        return rows.transpose(1, 2).reshape(-1, (end - start) * n)


class DistanceAccumulator:
    """Streams :func:`js_divergence_sums` over every segment's query tokens; ``result()`` is
    :class:`HeadDistances`.

    max_tokens_per_segment: if set, only this many query tokens of a longer segment are used, drawn
        uniformly without replacement by ``numpy.random.default_rng([seed, segment_index])``, so the
        sample depends on the seed and the segment's index only (not on batching or sharding). The cost
        is ``(L*H)^2 / 2 * tokens * n`` log evaluations; e.g. 32 tokens of each 128-token segment cut
        it fourfold. ``None`` (default) uses every token.
    seed: for that sample.
    first_segment: index of the first segment this accumulator will see (see
        :class:`~bertology.stats.base.SegmentCounter`).
    group_columns: segments are processed together until their rows reach this many columns
        (tokens x keys), which bounds the memory of the copied rows to about ``4 * L*H * group_columns``
        bytes.
    """

    def __init__(
        self,
        *,
        max_tokens_per_segment: int | None = None,
        seed: int = 0,
        first_segment: int = 0,
        group_columns: int = 2**18,
    ) -> None:
        if max_tokens_per_segment is not None and max_tokens_per_segment < 1:
            raise BertologyError(f"max_tokens_per_segment must be at least 1, not {max_tokens_per_segment}.")
        self.max_tokens_per_segment = max_tokens_per_segment
        self.seed = seed
        self.group_columns = group_columns
        self.counter = SegmentCounter(first_segment)
        self.js_sum: torch.Tensor | None = None  # [G, G] float64, where the rows are (the CPU for MPS)
        self.shape: tuple[int, int] | None = None
        self.tokens = 0
        self.segments = 0

    def query_tokens(self, length: int, segment: int) -> np.ndarray:
        """Sorted positions of the query tokens used from a segment of ``length`` tokens."""
        limit = self.max_tokens_per_segment
        if limit is None or length <= limit:
            return np.arange(length)
        return np.sort(np.random.default_rng([self.seed, segment]).choice(length, size=limit, replace=False))

    @property
    def items(self) -> int:
        """Segments seen."""
        return self.segments

    def update(self, batch: AttentionBatch) -> None:
        sampler = self.sampler(batch.lengths)
        for layer in range(batch.probs.shape[1]):
            sampler.add_layer(batch.probs[:, layer])
        self.add(sampler)

    def sampler(self, lengths: np.ndarray, key_lengths: np.ndarray | None = None) -> RowSampler:
        """A :class:`RowSampler` for the next batch, whose segments have ``lengths`` [B] real tokens;
        numbers the segments and picks their query tokens. key_lengths: [B] the real keys of each segment's
        rows where they are other tokens than the queries (an encoder-decoder's cross-attention: the
        source's); default ``lengths``."""
        segments = self.counter.take(len(lengths))
        keys = lengths if key_lengths is None else key_lengths
        return RowSampler(
            [self.query_tokens(int(n), int(segment)) for n, segment in zip(lengths, segments, strict=True)],
            [int(n) for n in keys],
        )

    def add(self, sampler: RowSampler) -> None:
        """Fold in the rows a sampler collected (every layer of its batch)."""
        heads = sampler.heads_per_layer
        shape = (len(sampler.layers), heads)
        check_same_shape(self.shape, shape, "This distance accumulator")
        total = None  # [G, G] float64 on the rows' device (the CPU for MPS, which has no float64)
        group: list[torch.Tensor] = []
        width = 0
        for index in range(len(sampler.lengths)):
            group.append(sampler.segment_rows(index))
            width += group[-1].shape[1]
            if width >= self.group_columns or index == len(sampler.lengths) - 1:
                rows = torch.cat(group, dim=1)
                sums = js_divergence_sums(rows.to(float64_home(rows.device)))
                total = sums if total is None else total + sums
                group, width = [], 0
        assert total is not None
        self.js_sum = total if self.js_sum is None else self.js_sum + total.to(self.js_sum.device)
        self.shape = shape
        self.tokens += sum(len(queries) for queries in sampler.queries)
        self.segments += len(sampler.lengths)

    def merge(self, other: Self) -> Self:
        if other.js_sum is None or other.shape is None:
            return self
        check_same_shape(self.shape, other.shape, "This distance accumulator")
        self.js_sum = (
            other.js_sum.clone() if self.js_sum is None else self.js_sum + other.js_sum.to(self.js_sum.device)
        )
        self.shape = other.shape
        self.tokens += other.tokens
        self.segments += other.segments
        self.counter.merge(other.counter)
        return self

    def result(self) -> HeadDistances:
        if self.js_sum is None or self.shape is None or self.tokens == 0:
            raise BertologyError(
                "The distance accumulator has seen no segments yet; update it with a batch first."
            )
        return HeadDistances(self.js_sum.cpu().numpy().copy(), self.tokens, self.segments, *self.shape)

    def __getstate__(self) -> dict[str, Any]:
        return on_the_host(self.__dict__)


def _precomputed_mds(seed: int) -> Any:
    """scikit-learn's metric MDS on a precomputed dissimilarity matrix, seeded (scikit-learn >= 1.8)."""
    from sklearn.manifold import MDS

    return MDS(n_components=2, metric="precomputed", metric_mds=True, init="classical_mds", random_state=seed)


def mds_embedding(distance: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """[G, 2] coordinates whose Euclidean distances approximate ``distance`` (metric MDS, Clark et al.
    2019, Fig. 6).

    distance: [G, G] symmetric, finite, non-negative (e.g. :attr:`HeadDistances.distance`).
    seed: makes the result reproducible.

    Raises:
        BertologyError: fewer than 3 heads, or a matrix that is not square, symmetric and finite.
    """
    matrix = np.asarray(distance, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise BertologyError(f"MDS needs a square distance matrix, not one of shape {matrix.shape}.")
    if matrix.shape[0] < 3:
        raise BertologyError(f"MDS needs at least 3 heads to place; got {matrix.shape[0]}.")
    if not np.isfinite(matrix).all() or (matrix < 0).any() or not np.allclose(matrix, matrix.T):
        raise BertologyError(
            "MDS needs finite, non-negative, symmetric distances; accumulate segments or check the input."
        )
    return _precomputed_mds(seed).fit_transform((matrix + matrix.T) / 2)
