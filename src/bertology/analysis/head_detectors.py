"""The heads decoder language models are known for: previous-token, duplicate-token and induction heads
on repeated random tokens (TransformerLens's ``head_detector``), and attention sinks over a corpus
(Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks").

**Sequences.** Sequence ``s`` of a run with seed ``seed`` is ``[f, r_1 .. r_L, r_1 .. r_L]``: ``f`` the
tokenizer's first token (its BOS token, else [CLS], else its end-of-text token; none if it has none of
them, as TransformerLens prepends BOS) and ``r`` ``L`` distinct tokens drawn from the vocabulary without
its special tokens by ``numpy.random.default_rng([seed, s])``. Every token of the second half has
exactly one earlier occurrence, and no token of the first half has one.

**Detection patterns** (TransformerLens's, for the tokens ``t`` of one sequence; ``D[i, j]`` is 1 for
the keys ``j <= i`` a head of that kind attends to from query ``i``):

- previous token: ``D[i, i - 1] = 1``;
- duplicate token: ``D[i, j] = 1`` for ``j < i`` with ``t_j = t_i`` (an earlier occurrence of ``t_i``);
- induction: ``D[i, j] = 1`` for ``1 <= j <= i`` with ``t_{j-1} = t_i`` and ``j - 1 < i`` (the token
  after an earlier occurrence of ``t_i``).

**Score** of a head for a pattern: the attention mass it puts on the pattern's keys, averaged over the
queries that have at least one such key, then over the sequences::

    score = mean_s  mean_{i in R_s}  sum_j A_s[i, j] D_s[i, j],    R_s = {i : sum_j D_s[i, j] > 0}

This is TransformerLens's ``"mul"`` measure (``sum(A * D) / sum(A)``, averaged over sequences) except
for the rows it averages over: TransformerLens divides by ``sum(A)``, i.e. by all ``n`` query rows, so
rows without a key of the pattern count as 0 and a perfect induction head scores only about 1/2 on a
twice-repeated sequence. Here a perfect head of each kind scores 1; TransformerLens's number is this
one times ``|R|/n`` (``|R|`` is ``n - 1`` for previous token and ``L`` for the other two, ``n = 2L + 1``).

**Attention sink** of a head: the mean attention mass on a segment's first token, over the queries after
it, then over the corpus's segments (the decoders' tokenizers here add no BOS token, so that is the
segment's first text token, whatever it is)::

    sink = mean_segments  mean_{1 <= i < n}  A[i, 0]

**Labels**: a head gets every kind whose score reaches its threshold
(:class:`~bertology.analysis.patterns.DetectorThresholds`), joined by ``+`` in the order of
:data:`HEAD_SCORES`; ``"none"`` if it reaches none. A decoder's corpus analysis gives each head one label
instead, by the precedence of :func:`~bertology.analysis.patterns.decoder_labels`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bertology.analysis.patterns import DetectorThresholds
from bertology.attention.capturing import Attention, capture_encoded, encode_for_model, stream_batch
from bertology.corpus.encoding import EncodedBatch, Text, encode_token_ids
from bertology.corpus.segments import iter_segments
from bertology.errors import BertologyError
from bertology.models.devices import float64_home
from bertology.models.loading import LoadedModel, require_single_stack
from bertology.models.model_store import model_note
from bertology.progress import Progress, part_of

if TYPE_CHECKING:
    import pandas as pd
    from transformers import PreTrainedTokenizerFast

#: The scores on repeated random tokens, in table order.
DETECTORS = ("previous_token", "duplicate_token", "induction")
#: Every score of a head: the detectors, then the attention sink.
HEAD_SCORES = (*DETECTORS, "sink")

#: What each score measures, for reports.
SCORE_DESCRIPTIONS = {
    "previous_token": "mass on the previous token",
    "duplicate_token": "mass on earlier occurrences of the query's token",
    "induction": "mass on the token after an earlier occurrence of the query's token",
    "sink": "mass on the segment's first token (attention sink)",
}

#: Random tokens per half of a repeated sequence, sequences and corpus segments, by default.
REPEATED_LENGTH = 50
SEQUENCES = 20
SINK_SEGMENTS = 100


def first_token_id(tokenizer: PreTrainedTokenizerFast) -> int | None:
    """The token a repeated sequence starts with: BOS, else [CLS], else end-of-text, else none."""
    for token_id in (tokenizer.bos_token_id, tokenizer.cls_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    return None


def repeated_random_tokens(
    tokenizer: PreTrainedTokenizerFast, *, length: int, sequences: int, seed: int
) -> np.ndarray:
    """``[sequences, n]`` int64 token ids, ``n = 2 * length`` plus one for the first token (see the module
    docstring); sequence ``s`` depends only on ``(seed, s)``, so a longer run starts with a shorter one's.

    Raises:
        BertologyError: ``length`` or ``sequences`` below 1, or more random tokens than the vocabulary has.
    """
    if length < 1 or sequences < 1:
        raise BertologyError("A repeated sequence needs at least one random token and one sequence.")
    vocabulary = np.setdiff1d(np.arange(len(tokenizer)), np.array(tokenizer.all_special_ids, dtype=np.int64))
    if length > len(vocabulary):
        raise BertologyError(
            f"The vocabulary has only {len(vocabulary)} tokens to draw {length} distinct ones."
        )
    first = first_token_id(tokenizer)
    rows = []
    for number in range(sequences):
        drawn = np.random.default_rng([seed, number]).choice(vocabulary, size=length, replace=False)
        rows.append(np.concatenate([[first] if first is not None else [], drawn, drawn]))
    return np.stack(rows).astype(np.int64)


def detection_patterns(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """TransformerLens's detection patterns of each sequence (module docstring), keyed by
    :data:`DETECTORS`: ``ids [batch, n]`` -> ``D [batch, n, n]`` bool, rows = queries, columns = keys."""
    n = ids.shape[-1]
    query, key = torch.arange(n, device=ids.device)[:, None], torch.arange(n, device=ids.device)[None, :]
    same = ids[:, :, None] == ids[:, None, :]  # [batch, query, key]: t_i == t_j
    duplicate = same & (key < query)
    induction = torch.zeros_like(duplicate)
    induction[:, :, 1:] = duplicate[:, :, :-1]  # key j marked when j - 1 is an earlier occurrence
    previous = (key == query - 1).expand_as(duplicate)
    return {"previous_token": previous, "duplicate_token": duplicate, "induction": induction}


def pattern_scores(probs: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
    """Each sequence's score for one pattern: ``probs [batch, heads, n, n]`` (one layer),
    ``pattern [batch, n, n]`` bool -> ``[batch, heads]`` float64, the mass on the pattern's keys averaged
    over the queries that have one (NaN for a sequence where none has)."""
    probs = probs.to(float64_home(probs.device), torch.float64)  # MPS has no float64: the CPU there
    pattern = pattern.to(probs.device)
    mass = (probs * pattern[:, None]).sum(-1)  # [batch, heads, n]
    rows = pattern.any(-1)[:, None].double()  # [batch, 1, n]
    return (mass * rows).sum(-1) / rows.sum(-1)


def sink_scores(probs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each segment's mean attention on its first token over the queries after it: ``probs [batch, heads,
    N, N]`` (one layer, right-padded), ``lengths [batch]`` (at least 2) -> ``[batch, heads]`` float64."""
    first = probs[..., 0].to(float64_home(probs.device), torch.float64)  # [batch, heads, N]
    positions = torch.arange(probs.shape[-1], device=first.device)
    queries = ((positions >= 1) & (positions < lengths[:, None].to(first.device))).double()  # [batch, N]
    return (first * queries[:, None]).sum(-1) / queries.sum(-1)[:, None]


@dataclass(frozen=True)
class HeadDetection:
    """The heads' scores of one model (module docstring).

    scores: per name of :data:`HEAD_SCORES`, ``[layers, heads]`` float64. length, sequences, seed: the
    repeated random tokens. segments: the corpus segments of the sink score, corpus: their file.
    note: what to know about the model (:func:`~bertology.models.model_store.model_note`; empty if nothing).
    """

    model_name: str
    scores: dict[str, np.ndarray]
    length: int
    sequences: int
    seed: int
    corpus: str
    segments: int
    thresholds: DetectorThresholds = field(default_factory=DetectorThresholds)
    note: str = ""

    @property
    def labels(self) -> np.ndarray:
        """``[layers, heads]`` object array: the kinds each head reaches the threshold of, joined by ``+``
        in :data:`HEAD_SCORES` order, or ``"none"``."""
        limits = asdict(self.thresholds)
        reached = np.stack([self.scores[name] >= limits[name] for name in HEAD_SCORES], -1)  # NaN: False
        names = np.array(HEAD_SCORES)
        labels = ["+".join(names[row]) or "none" for row in reached.reshape(-1, len(HEAD_SCORES))]
        return np.array(labels, dtype=object).reshape(reached.shape[:-1])

    def top(self, name: str, count: int = 5) -> list[tuple[int, int, float]]:
        """The ``count`` heads with the highest ``name`` score, highest first: ``(layer, head, score)``."""
        values = self.scores[name]
        order = np.argsort(-np.nan_to_num(values, nan=-np.inf), axis=None, kind="stable")[:count]
        return [
            (int(layer), int(head), float(values[layer, head]))
            for layer, head in zip(*np.unravel_index(order, values.shape), strict=True)
        ]

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), each score and ``labels``."""
        import pandas as pd

        layers, heads = self.scores[HEAD_SCORES[0]].shape
        grid = np.indices((layers, heads)).reshape(2, -1)
        columns = {name: self.scores[name].ravel() for name in HEAD_SCORES}
        return pd.DataFrame({"layer": grid[0], "head": grid[1], **columns, "labels": self.labels.ravel()})

    def to_json(self) -> str:
        """The settings, thresholds, each score's strongest heads and every score grid, as JSON."""
        return json.dumps(
            {
                "model": self.model_name,
                "note": self.note,
                "repeated_tokens": {"length": self.length, "sequences": self.sequences, "seed": self.seed},
                "sink_corpus": {"file": self.corpus, "segments": self.segments},
                "thresholds": asdict(self.thresholds),
                "top_heads": {
                    name: [
                        {"layer": layer, "head": head, "score": score}
                        for layer, head, score in self.top(name)
                    ]
                    for name in HEAD_SCORES
                },
                "scores": {name: _nan_as_none(self.scores[name]) for name in HEAD_SCORES},
            },
            indent=2,
        )


def _nan_as_none(grid: np.ndarray) -> list[list[float | None]]:
    """``grid`` as nested lists, NaN as ``None`` (JSON null)."""
    return np.where(np.isnan(grid), None, grid).tolist()


def _summing(
    sums: dict[str, list[torch.Tensor]], score_of: Callable[[torch.Tensor], dict[str, torch.Tensor]]
) -> Callable[[torch.Tensor], None]:
    """What :func:`~bertology.attention.capturing.stream_batch` hands each layer's ``probs`` to, for one
    batch: the layer's per-input scores (``score_of(probs) -> {name: [batch, heads]}``, NaN where undefined)
    are summed over the batch into ``sums[name][layer]`` ([heads] float64 where the scores are computed)."""
    layer = 0

    def take(probs: torch.Tensor) -> None:
        nonlocal layer
        for name, values in score_of(probs).items():
            total = values.nansum(0)  # stays where it was computed: one transfer at the end
            if layer == len(sums[name]):
                sums[name].append(total)
            else:
                sums[name][layer] += total
        layer += 1

    return take


def _repeated_ids(loaded: LoadedModel, *, length: int, sequences: int, seed: int) -> np.ndarray:
    """:func:`repeated_random_tokens` of ``loaded``'s tokenizer, checked against the model's length limit."""
    ids = repeated_random_tokens(loaded.tokenizer, length=length, sequences=sequences, seed=seed)
    if ids.shape[1] > loaded.max_length:
        raise BertologyError(
            f"A repeated sequence of 2 x {length} tokens is longer than '{loaded.name}' takes "
            f"({loaded.max_length} tokens); give a shorter length."
        )
    return ids


def repeated_sequence_attention(loaded: LoadedModel, *, length: int, seed: int) -> Attention:
    """The attention of a run's first repeated sequence (number 0), for views."""
    ids = _repeated_ids(loaded, length=length, sequences=1, seed=seed)
    return capture_encoded(loaded, encode_token_ids(loaded.tokenizer, ids))[0]


def _detector_sums(
    loaded: LoadedModel, ids: np.ndarray, batch_size: int, on_progress: Callable[[int], None]
) -> dict[str, list[torch.Tensor]]:
    """Per detector and layer, ``[heads]`` sums over the sequences ``ids`` of their scores."""
    sums: dict[str, list[torch.Tensor]] = {name: [] for name in DETECTORS}

    def consumer(encoded: EncodedBatch) -> Callable[[torch.Tensor], None]:
        patterns = detection_patterns(encoded.model_inputs["input_ids"].to(loaded.device))
        return _summing(
            sums, lambda probs: {name: pattern_scores(probs, patterns[name]) for name in DETECTORS}
        )

    for start in range(0, len(ids), batch_size):
        stream_batch(
            encode_token_ids(loaded.tokenizer, ids[start : start + batch_size]), consumer, model=loaded
        )
        on_progress(min(start + batch_size, len(ids)))
    return sums


def _sink_sums(
    loaded: LoadedModel,
    texts: list[Text],
    max_length: int,
    batch_size: int,
    on_progress: Callable[[int], None],
) -> tuple[list[torch.Tensor], int]:
    """Per layer, ``[heads]`` sums over the segments ``texts`` of their sink scores, and how many segments
    have one (two tokens or more)."""
    sums: dict[str, list[torch.Tensor]] = {"sink": []}
    counted = 0

    def consumer(encoded: EncodedBatch) -> Callable[[torch.Tensor], None]:
        lengths = torch.from_numpy(encoded.lengths)
        return _summing(sums, lambda probs: {"sink": sink_scores(probs, lengths)})

    for start in range(0, len(texts), batch_size):
        encoded = encode_for_model(
            loaded, texts[start : start + batch_size], max_length=max_length, warn=False
        )
        stream_batch(encoded, consumer, model=loaded)
        counted += int((encoded.lengths >= 2).sum())
        on_progress(min(start + batch_size, len(texts)))
    return sums["sink"], counted


def detector_scores(
    loaded: LoadedModel,
    *,
    length: int = REPEATED_LENGTH,
    sequences: int = SEQUENCES,
    seed: int = 0,
    batch_size: int = 8,
    on_progress: Progress | None = None,
) -> dict[str, np.ndarray]:
    """The detectors' scores of every head of ``loaded`` (module docstring), ``[layers, heads]`` float64 per
    name of :data:`DETECTORS`, on ``sequences`` repeated random sequences of ``2 * length`` tokens (plus the
    first): :func:`detect_heads` without the sink, which a corpus analysis measures over its own segments.
    on_progress: sequences done of ``sequences``.

    Raises:
        BertologyError: an encoder-decoder model, or a sequence longer than the model takes.
    """
    require_single_stack(loaded, "Head detection")
    ids = _repeated_ids(loaded, length=length, sequences=sequences, seed=seed)
    sums = _detector_sums(
        loaded, ids, batch_size, lambda done: on_progress(done, sequences) if on_progress else None
    )
    return {name: torch.stack(values).cpu().numpy() / sequences for name, values in sums.items()}


def detect_heads(
    loaded: LoadedModel,
    corpus: str | Path,
    *,
    length: int = REPEATED_LENGTH,
    sequences: int = SEQUENCES,
    seed: int = 0,
    segments: int = SINK_SEGMENTS,
    max_length: int = 128,
    batch_size: int = 8,
    thresholds: DetectorThresholds | None = None,
    on_progress: Progress | None = None,
) -> HeadDetection:
    """Score every head of ``loaded`` (module docstring): the detectors on ``sequences`` repeated random
    sequences of ``2 * length`` tokens (plus the first), the sink on the first ``segments`` segments of
    ``corpus`` (plain text, JSONL or CoNLL-U; cut to ``max_length`` tokens). Attention is streamed
    layer by layer, ``batch_size`` inputs at a time. on_progress: inputs done of ``sequences`` plus the
    segments read.

    Raises:
        BertologyError: an encoder-decoder model, a sequence longer than the model takes, or a corpus
            without a segment of two tokens or more.
    """
    require_single_stack(loaded, "Head detection")
    read = iter_segments(corpus, loaded.tokenizer, max_length=max_length, pairs=False)
    texts = [segment.text_a for segment in islice(read, segments)]
    total = sequences + len(texts)
    scores = detector_scores(
        loaded,
        length=length,
        sequences=sequences,
        seed=seed,
        batch_size=batch_size,
        on_progress=part_of(on_progress, total=total),
    )
    sink_part = part_of(on_progress, offset=sequences, total=total)
    sink_sums, counted = _sink_sums(
        loaded, texts, max_length, batch_size, lambda done: sink_part(done) if sink_part else None
    )
    if counted == 0:
        raise BertologyError(
            f"The corpus '{corpus}' has no segment of two tokens or more for the sink score."
        )
    scores["sink"] = torch.stack(sink_sums).cpu().numpy() / counted
    return HeadDetection(
        model_name=loaded.name,
        scores=scores,
        length=length,
        sequences=sequences,
        seed=seed,
        corpus=str(corpus),
        segments=counted,
        thresholds=thresholds or DetectorThresholds(),
        note=model_note(loaded.name),
    )
