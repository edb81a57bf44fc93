"""Compare two models head by head on the same corpus: statistics, labels, and which head matches which.

Both models read the same segments (packed with model A's tokenizer). Each model's heads get the
statistics of ``bertology analyze`` (:class:`bertology.analysis.analyze.CorpusAccumulators`), and every head
``a`` of A is compared with every head ``b`` of B by the mean Jensen-Shannon divergence of their attention
(Clark et al.'s distance between heads, per query unit), across the two models::

    D[a, b] = (1 / T) * sum over query units t of JS(A_a(t), B_b(t))      (nats, 0 .. ln 2)

where ``A_a(t)`` is head ``a``'s attention row for ``t`` and ``T`` the number of query units. The units
are tokens when the two tokenizers give the same tokens (the query tokens the analysis samples, seeded
per segment). When they do not, the rows are compared at the word level (:func:`bertology.attention.words
.word_attention`, Clark et al. 2019, Sec. 4.1): a query word's row is the mean of its pieces' rows,
attention to a word is the sum over its pieces, and everything else (special tokens, words one model
cut) is pooled into one last column, so each row still sums to 1; only words both models kept are used.

Heads are then matched one-to-one to minimise the total distance (``scipy.optimize.linear_sum_assignment``,
Hungarian algorithm); with different head counts the assignment is rectangular and the extra heads of
the larger model stay unmatched. Each head's nearest head in the other model is reported as well.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, Self

import numpy as np
import pandas as pd
import torch
from scipy.optimize import linear_sum_assignment

from bertology.analysis.analyze import CorpusAccumulators, CorpusAnalysis, corpus_batches
from bertology.analysis.distances import RowSampler, js_cross_sums
from bertology.analysis.settings import DEFAULT_SETTINGS, AnalysisSettings
from bertology.attention.norms import WEIGHT_DESCRIPTIONS
from bertology.attention.words import WordAttention, word_attention
from bertology.corpus.batching import prefetched
from bertology.corpus.cache import CacheUse
from bertology.corpus.encoding import EncodedBatch
from bertology.corpus.reader_processes import default_readers
from bertology.corpus.segments import Segment, iter_segments
from bertology.errors import BertologyError
from bertology.models.devices import float64_home
from bertology.models.heads import head_name
from bertology.models.loading import LoadedModel
from bertology.options import Level
from bertology.progress import Progress
from bertology.summaries import Summarised

if TYPE_CHECKING:
    from pathlib import Path

LEVELS: tuple[Level, ...] = ("auto", "token", "word")


def head_names(num_layers: int, num_heads: int) -> list[str]:
    """``"layer-head"`` (0-based) of every head, layer-major."""
    return [head_name(layer, head) for layer, head in itertools.product(range(num_layers), range(num_heads))]


@dataclass
class HeadMatching:
    """Heads of model A matched to heads of model B (heads numbered layer-major, ``layer * H + head``).

    distance: [Ga, Gb] float64 mean JS divergence per query unit (nats) of A's head ``a`` and B's head ``b``.
    b_of_a: [Ga] the B head matched one-to-one to each A head (optimal assignment), -1 where none.
    a_of_b: [Gb] the inverse, -1 for a B head left unmatched.
    """

    distance: np.ndarray
    b_of_a: np.ndarray
    a_of_b: np.ndarray

    @classmethod
    def of(cls, distance: np.ndarray) -> HeadMatching:
        """The optimal one-to-one matching of ``distance`` [Ga, Gb] (rectangular when Ga != Gb)."""
        rows, columns = linear_sum_assignment(distance)
        b_of_a = np.full(distance.shape[0], -1, dtype=np.int64)
        a_of_b = np.full(distance.shape[1], -1, dtype=np.int64)
        b_of_a[rows], a_of_b[columns] = columns, rows
        return cls(distance, b_of_a, a_of_b)

    @property
    def nearest_b(self) -> np.ndarray:
        """[Ga] each A head's closest B head (the first on ties)."""
        return self.distance.argmin(1)

    @property
    def nearest_a(self) -> np.ndarray:
        """[Gb] each B head's closest A head."""
        return self.distance.argmin(0)

    @property
    def matched_distance(self) -> np.ndarray:
        """[Ga] distance of each A head to its matched B head, NaN where unmatched."""
        found = self.b_of_a >= 0
        values = np.full(len(self.b_of_a), np.nan)
        values[found] = self.distance[found, self.b_of_a[found]]
        return values

    def is_identity(self) -> bool:
        """Whether every head is matched to the head with its own number."""
        return self.distance.shape[0] == self.distance.shape[1] and bool(
            (self.b_of_a == np.arange(len(self.b_of_a))).all()
        )


@dataclass(repr=False)
class ModelComparison(Summarised):
    """Two models' per-head results on the same corpus and their head matching.

    a, b: each model's :class:`~bertology.analysis.analyze.CorpusAnalysis` (surface statistics, pattern
        labels, within-model distances) on the same segments.
    matching: the cross-model distances and the matching (:class:`HeadMatching`).
    level: ``"token"`` or ``"word"``: the units the cross-model rows were compared on (see the module).
    query_units: query tokens (or words) summed over in the cross distances.
    model_types: the two models' architectures (their configs' ``model_type``, e.g. ``"bert"``, ``"llama"``).
    """

    a: CorpusAnalysis
    b: CorpusAnalysis
    matching: HeadMatching
    level: Literal["token", "word"]
    query_units: int
    seconds: float
    model_types: tuple[str, str]

    @property
    def shape_a(self) -> tuple[int, int]:
        """(layers, heads) of model A."""
        return self.a.surface.num_layers, self.a.surface.num_heads

    @property
    def shape_b(self) -> tuple[int, int]:
        """(layers, heads) of model B."""
        return self.b.surface.num_layers, self.b.surface.num_heads

    @property
    def shapes_agree(self) -> bool:
        return self.shape_a == self.shape_b

    @property
    def one_design(self) -> bool:
        """Whether the two models share one architecture, layers x heads and tokenizer (compared token by
        token), as a model and its own fine-tuned copy do: then B's heads are A's heads, changed; otherwise
        the comparison is of two different models, whose matched heads are only the most alike."""
        return self.model_types[0] == self.model_types[1] and self.shapes_agree and self.level == "token"

    @property
    def statistics(self) -> list[str]:
        """Surface statistics both models have."""
        return [name for name in self.a.surface.columns if name in self.b.surface.columns]

    def to_frame(self) -> pd.DataFrame:
        """One row per matched pair, then one per unmatched head of either model.

        Columns: ``layer_a``, ``head_a``, ``layer_b``, ``head_b`` (0-based; NaN where a model has no head in
        the row), ``js_divergence`` (the matched pair's mean JS divergence, nats),
        ``same_head_js_divergence`` (A's head against B's head of the same number, when the shapes agree),
        ``nearest_b`` / ``nearest_b_js_divergence`` (the A head's closest B head, ``"layer-head"``),
        ``nearest_a`` / ``nearest_a_js_divergence`` (the B head's closest A head),
        ``label_a``, ``label_b``, then per statistic ``<name>_a``, ``<name>_b`` and ``<name>_delta`` (B's
        matched head minus A's head).
        """
        matching = self.matching
        extra_b = np.flatnonzero(matching.a_of_b < 0)
        # Each row's A head and B head (layer-major), NaN where the row has none.
        index_a = np.concatenate([np.arange(len(matching.b_of_a)), np.full(len(extra_b), np.nan)])
        index_b = np.concatenate([np.where(matching.b_of_a >= 0, matching.b_of_a, np.nan), extra_b])
        heads_a, heads_b = self.shape_a[1], self.shape_b[1]

        def split(index: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
            return np.floor_divide(index, heads), np.mod(index, heads)

        def pick(values: np.ndarray, index: np.ndarray) -> np.ndarray:
            flat = np.asarray(values).ravel()
            picked = np.full(len(index), np.nan, dtype=object if flat.dtype == object else float)
            found = ~np.isnan(index)
            picked[found] = flat[index[found].astype(np.int64)]
            return picked

        layer_a, head_a = split(index_a, heads_a)
        layer_b, head_b = split(index_b, heads_b)
        names_a, names_b = head_names(*self.shape_a), head_names(*self.shape_b)
        frame = pd.DataFrame(
            {
                "layer_a": layer_a,
                "head_a": head_a,
                "layer_b": layer_b,
                "head_b": head_b,
                "js_divergence": np.concatenate([matching.matched_distance, np.full(len(extra_b), np.nan)]),
                "same_head_js_divergence": pick(np.diag(matching.distance), index_a)
                if self.shapes_agree
                else np.nan,
                "nearest_b": pick(np.array(names_b, dtype=object)[matching.nearest_b], index_a),
                "nearest_b_js_divergence": pick(matching.distance.min(1), index_a),
                "nearest_a": pick(np.array(names_a, dtype=object)[matching.nearest_a], index_b),
                "nearest_a_js_divergence": pick(matching.distance.min(0), index_b),
                "label_a": pick(self.a.patterns.labels, index_a),
                "label_b": pick(self.b.patterns.labels, index_b),
            }
        )
        for name in self.statistics:
            values_a = pick(self.a.surface[name], index_a)
            values_b = pick(self.b.surface[name], index_b)
            frame[f"{name}_a"], frame[f"{name}_b"], frame[f"{name}_delta"] = (
                values_a,
                values_b,
                values_b - values_a,
            )
        return frame

    def most_changed(self, count: int = 10) -> pd.DataFrame:
        """The ``count`` matched pairs with the largest mean JS divergence, largest first (ties: A's head
        order)."""
        frame = self.to_frame()
        matched = frame[frame["js_divergence"].notna()]
        order = np.argsort(-matched["js_divergence"].to_numpy(), kind="stable")[:count]
        return matched.iloc[order].reset_index(drop=True)

    def position_delta(self, name: str) -> np.ndarray:
        """[layers, heads] B's statistic ``name`` minus A's at the same head number (shapes must agree)."""
        if not self.shapes_agree:
            raise BertologyError("Head-by-head differences need two models with the same layers and heads.")
        return self.b.surface[name] - self.a.surface[name]

    def summary(self) -> dict[str, str | int | float]:
        shape_a, shape_b = self.shape_a, self.shape_b
        return {
            "model A": self.a.model_name,
            "model B": self.b.model_name,
            "layers x heads, A": f"{shape_a[0]} x {shape_a[1]}",
            "layers x heads, B": f"{shape_b[0]} x {shape_b[1]}",
            "architectures": " and ".join(self.model_types),
            "corpus": self.a.corpus,
            "segments": self.a.segments,
            "compared at": f"{self.level} level",
            "weights": WEIGHT_DESCRIPTIONS[self.a.weights],
            "convention": self.a.convention,
            "query units": self.query_units,
            "identity matching": "yes" if self.matching.is_identity() else "no",
            "seconds": round(self.seconds, 2),
            **{name: value for name, value in self.a.summary().items() if name.startswith("corpus_cache")},
        }

    def with_cache(self, use: CacheUse) -> ModelComparison:
        """The comparison with ``use`` as both analyses' ``corpus_cache`` (they read the same segments)."""
        return replace(self, a=replace(self.a, corpus_cache=use), b=replace(self.b, corpus_cache=use))

    def to_json(self) -> str:
        """JSON text: the summary, one record per row of :meth:`to_frame` (NaN as ``null``), the matching
        (``b_of_a``, ``a_of_b``, layer-major indices, -1 = unmatched) and the ``[Ga][Gb]`` mean JS
        divergences (``js_divergence``)."""
        data = {
            "summary": self.summary(),
            "unit": "mean Jensen-Shannon divergence per query unit, nats",
            "heads": json.loads(self.to_frame().to_json(orient="records")),
            "b_of_a": self.matching.b_of_a.tolist(),
            "a_of_b": self.matching.a_of_b.tolist(),
            "js_divergence": self.matching.distance.tolist(),
        }
        return json.dumps(data, allow_nan=False)


def same_tokenizer(a: LoadedModel, b: LoadedModel) -> bool:
    """Whether the two tokenizers are of one kind with one vocabulary (so tokens line up)."""
    return type(a.tokenizer) is type(b.tokenizer) and a.tokenizer.get_vocab() == b.tokenizer.get_vocab()


def _token_rows(sampler: RowSampler, count: int) -> list[torch.Tensor]:
    """A batch's sampled token rows of each of its ``count`` segments, ``[L*H, T*n]`` each."""
    return [sampler.segment_rows(index) for index in range(count)]


def word_rows(words: WordAttention, queries: np.ndarray, columns: np.ndarray) -> torch.Tensor:
    """``[L*H, Q * (C + 1)]``: the attention rows of the query words ``queries`` over the words ``columns``
    (indices into the input's words, all with a position) plus one last column with the rest of the row
    (special tokens and any other word), laid end to end; each row sums to 1."""
    positions = words.word_positions
    rows = words.probs[:, :, positions[queries], :].astype(np.float64)  # [L, H, Q, m]
    kept = rows[..., positions[columns]]
    rest = np.clip(1.0 - kept.sum(-1, keepdims=True), 0.0, None)
    joined = np.concatenate([kept, rest], axis=-1)
    return torch.from_numpy(joined.reshape(joined.shape[0] * joined.shape[1], -1).astype(np.float32))


def _query_words(common: np.ndarray, limit: int | None, seed: int, segment: int) -> np.ndarray:
    """Sorted sample of at most ``limit`` query words among ``common``, seeded by ``[seed, segment]``."""
    if limit is None or len(common) <= limit:
        return common
    return np.sort(np.random.default_rng([seed, segment]).choice(common, size=limit, replace=False))


def _check_tokens_agree(encoded_a: EncodedBatch, encoded_b: EncodedBatch) -> None:
    for tokens_a, tokens_b in zip(encoded_a.tokens, encoded_b.tokens, strict=True):
        if tokens_a != tokens_b:
            raise BertologyError(
                "The two tokenizers split the same text into different tokens; compare at the word level "
                "(--level word)."
            )


class ComparisonAccumulators:
    """Both models' streaming accumulators (:class:`~bertology.analysis.analyze.CorpusAccumulators`) and the
    sums of the cross-model JS divergences, fed a batch of segments at a time (:meth:`update`) and read with
    :meth:`result` (an :class:`~bertology.accumulator.Accumulator`). corpus: as for
    ``CorpusAccumulators``. settings: of both sides (:class:`~bertology.analysis.settings.AnalysisSettings`);
    level: as in :func:`compare_models`. first_segment: the number of the first segment added, so that the
    accumulators of consecutive shards of a corpus, merged (:meth:`merge`), equal one pass (as in
    ``CorpusAccumulators``).

    Raises:
        BertologyError: an unknown level.
    """

    def __init__(
        self,
        model_a: LoadedModel,
        model_b: LoadedModel,
        settings: AnalysisSettings = DEFAULT_SETTINGS,
        *,
        level: Level = "auto",
        corpus: str | Path = "",
        first_segment: int = 0,
    ) -> None:
        if level not in LEVELS:
            raise BertologyError(f"Unknown comparison level '{level}'; use one of: {', '.join(LEVELS)}.")
        self.level: Literal["token", "word"] = (
            ("token" if same_tokenizer(model_a, model_b) else "word") if level == "auto" else level
        )
        self.settings = settings
        self.model_types = (model_a.model_type, model_b.model_type)
        self.sides = tuple(
            CorpusAccumulators(model, settings, corpus=corpus, first_segment=first_segment)
            for model in (model_a, model_b)
        )
        self.cross: np.ndarray | None = None  # [Ga, Gb] float64 sums of JS divergences (nats)
        self.units = 0
        self.next_segment = first_segment

    @property
    def items(self) -> int:
        """Segments added (or merged) so far."""
        return self.sides[0].segments

    def update(self, batch: list[Segment]) -> None:
        """Run one batch of segments through both models and fold it in."""
        if self.level == "token":
            _check_tokens_agree(*(side.update(batch) for side in self.sides))
            samples = [side.last_sample for side in self.sides]
            assert samples[0] is not None and samples[1] is not None
            rows_a, rows_b = (_token_rows(sample, len(batch)) for sample in samples)
            self.units += sum(len(queries) for queries in samples[0].queries)
        else:
            # One forward pass per model serves both its statistics and its word-level attention.
            words_a, words_b = (
                [word_attention(attention) for attention in side.add_captured(batch)] for side in self.sides
            )
            rows_a, rows_b = [], []
            for offset, (first, second) in enumerate(zip(words_a, words_b, strict=True)):
                common = np.flatnonzero((first.word_positions >= 0) & (second.word_positions >= 0))
                segment = self.next_segment + offset
                queries = _query_words(
                    common, self.settings.js_tokens_per_segment, self.settings.seed, segment
                )
                rows_a.append(word_rows(first, queries, common))
                rows_b.append(word_rows(second, queries, common))
                self.units += len(queries)
        left, right = torch.cat(rows_a, dim=1), torch.cat(rows_b, dim=1)
        home = float64_home(left.device)  # where the float64 sums can be taken: MPS has none
        sums = js_cross_sums(left.to(home), right.to(home)).cpu().numpy()
        self.cross = sums if self.cross is None else self.cross + sums
        self.next_segment += len(batch)

    def merge(self, other: ComparisonAccumulators) -> Self:
        """Fold in ``other`` (another shard, compared with the same models and settings); returns ``self``.

        Raises:
            BertologyError: ``other`` compared at another level or with other settings.
        """
        if other.level != self.level:
            raise BertologyError(
                f"Cannot merge a {other.level}-level comparison into a {self.level}-level one."
            )
        for mine, theirs in zip(self.sides, other.sides, strict=True):
            mine.merge(theirs)
        if other.cross is not None:
            self.cross = other.cross.copy() if self.cross is None else self.cross + other.cross
        self.units += other.units
        self.next_segment = max(self.next_segment, other.next_segment)
        return self

    def result(self) -> ModelComparison:
        """The :class:`ModelComparison` of everything added so far.

        Raises:
            BertologyError: no segment was added.
        """
        if self.cross is None or self.units == 0:
            raise BertologyError(f"The corpus '{self.sides[0].corpus}' gave no segments to compare.")
        a, b = (side.result() for side in self.sides)
        distance = np.clip(self.cross / self.units, 0.0, np.log(2))
        return ModelComparison(
            a, b, HeadMatching.of(distance), self.level, self.units, a.seconds, self.model_types
        )


def comparison_batches(
    corpus: str | Path,
    model_a: LoadedModel,
    model_b: LoadedModel,
    settings: AnalysisSettings,
    readers: int = 1,
    on_cache: Callable[[CacheUse], None] | None = None,
) -> Iterator[list[Segment]]:
    """The batches both models read (:func:`~bertology.analysis.analyze.corpus_batches` with A's tokenizer,
    the settings' reading options, ``readers`` reader processes and ``on_cache``)."""
    return corpus_batches(
        corpus,
        model_a.tokenizer,
        max_length=settings.max_length,
        limit=settings.limit,
        batch_size=settings.batch_size,
        corpus_format=settings.corpus_format,
        pairs=model_a.kind == model_b.kind == "encoder",  # a decoder reads single texts
        cache=settings.cache,
        readers=readers,
        on_cache=on_cache,
        model=model_a.name,
    )


def compare_models(
    model_a: LoadedModel,
    model_b: LoadedModel,
    corpus: str | Path,
    settings: AnalysisSettings = DEFAULT_SETTINGS,
    *,
    level: Level = "auto",
    readers: int | None = None,
    on_progress: Progress | None = None,
) -> ModelComparison:
    """Stream ``corpus`` through both models and compare every head of A with every head of B.

    Segments are built with A's tokenizer and given to both models as text; each batch's attention is
    reduced and dropped (flat memory). settings: how the corpus is read and both models measured
    (:class:`~bertology.analysis.settings.AnalysisSettings`; its ``js_tokens_per_segment`` query tokens,
    or words, are sampled per segment for the distances, seeded). level: ``"token"``, ``"word"`` or
    ``"auto"`` (tokens when :func:`same_tokenizer`, else words); see the module docstring. readers and
    on_progress as in :func:`~bertology.analysis.analyze.analyze_corpus` (the readers' default for A's
    device).

    Raises:
        BertologyError: an unknown level, an unreadable or empty corpus, or token-level comparison of two
            tokenizers that split the text differently.
    """
    accumulators = ComparisonAccumulators(model_a, model_b, settings, level=level, corpus=corpus)
    readers = readers or default_readers(str(model_a.device))
    uses: list[CacheUse] = []  # how the pass uses the cache, told as it starts
    for batch in prefetched(comparison_batches(corpus, model_a, model_b, settings, readers, uses.append)):
        accumulators.update(batch)
        if on_progress is not None:
            on_progress(accumulators.items, settings.limit)
    return accumulators.result().with_cache(uses[0])


def first_segment(
    corpus: str | Path,
    model_a: LoadedModel,
    model_b: LoadedModel | None = None,
    *,
    max_length: int = 128,
    corpus_format: str | None = None,
) -> Segment:
    """The corpus's first segment as the comparison reads it (the input of the side-by-side views): packed
    by A's tokenizer, a pair only when both models are encoders (a decoder reads one running text)."""
    pairs = model_a.kind == "encoder" and (model_b is None or model_b.kind == "encoder")
    return next(
        iter_segments(corpus, model_a.tokenizer, max_length=max_length, format=corpus_format, pairs=pairs)
    )
