"""Analyse a corpus with an encoder-decoder model (BART, T5): statistics of its three kinds of attention.

A corpus is a list of sources: plain text (each non-blank line one source) or JSON Lines with a ``text``
and an optional ``target``. The source goes through the encoder; the decoder reads the target
by teacher forcing (the decoder start token, then the target's labels but the last, as
:func:`~bertology.attention.seq2seq.capture_seq2seq` reads it) or, for a source without a target, the
model's own greedy output (:func:`greedy_outputs`, at most ``max_new_tokens`` tokens).

One forward pass per batch streams its attention calls (every encoder layer, then per decoder layer its
self-attention and its cross-attention) into three sets of accumulators; no layer outlives the next, so
memory stays flat over a corpus (a batch's peak is one layer's ``[B, H, N, N]``; sources are cut to the
model's own limit, there is no query/key path for encoder-decoders):

- ``encoder``: the surface statistics and pattern scores of an encoder
  (:mod:`bertology.stats.surface`, :mod:`bertology.analysis.patterns`), the source's ``</s>`` in [SEP]'s role
  (and BART's ``<s>`` in [CLS]'s; T5's sources have no start token).
- ``decoder``: those of a decoder: causal, keys after the query left out, no [CLS] or [SEP].
- ``cross``: the statistics defined when queries (decoder tokens) and keys (source tokens) are different
  texts, :data:`CROSS_STATISTICS`, over every decoder token as a query.

Each statistic is averaged over a segment's queries, then over the segments (as
:mod:`bertology.stats.surface` does).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bertology.analysis.analyze import head_table_frame
from bertology.analysis.distances import DistanceAccumulator, HeadDistances
from bertology.analysis.patterns import HeadPatterns, PatternAccumulator
from bertology.attention.seq2seq import ATTENTION_SETS, encoder_decoder_layers
from bertology.corpus.batching import PAD_MULTIPLE
from bertology.corpus.encoding import EncodedBatch, EncodedRow, encode, stack_rows
from bertology.corpus.readers import require_file, require_records
from bertology.corpus.readers.jsonl import read_records
from bertology.corpus.readers.text import read_paragraphs
from bertology.errors import BertologyError
from bertology.models.hook import recording
from bertology.models.loading import KIND_PHRASES, LoadedModel
from bertology.options import BATCH_SIZE, JS_TOKENS_PER_SEGMENT, MAX_NEW_TOKENS
from bertology.progress import Progress
from bertology.stats.base import HeadTable, SegmentMeans
from bertology.stats.rows import QueryValues, RowSummarizer, SpecialTokens, TokenRoles, stack_segment_means
from bertology.stats.surface import SurfaceAccumulator
from bertology.summaries import Summarised

#: Probabilities are raised to at least this before taking logs (``x ln x`` there is 0).
_TINY = 1e-30


@dataclass(frozen=True)
class Source:
    """One input of an encoder-decoder corpus: the ``source`` text and its ``target`` (``None``: the
    decoder reads the model's greedy output), from line ``line``."""

    line: int
    source: str
    target: str | None


def read_sources(path: str | Path, corpus_format: str | None = None) -> Iterator[Source]:
    """The sources of ``path``: ``.jsonl`` (or ``corpus_format="jsonl"``) objects with ``text`` and an
    optional ``target``; otherwise plain text, each non-blank line a source without a target.

    Raises:
        BertologyError: a missing or unreadable file, a bad JSONL line, or no source at all.
    """
    path = Path(path)
    require_file(path)
    jsonl = corpus_format == "jsonl" or (corpus_format is None and path.suffix == ".jsonl")
    if corpus_format not in (None, "text", "jsonl"):
        raise BertologyError(
            f"An encoder-decoder reads plain text or JSONL sources, not the '{corpus_format}' format."
        )
    if jsonl:
        records = (Source(r.line, r.text, r.text_b) for r in read_records(path, second="target"))
    else:
        records = (Source(p.first_line, str(p.text), None) for p in read_paragraphs(path))
    return require_records(records, path, "sources")


def seq2seq_special(loaded: LoadedModel) -> SpecialTokens:
    """The source's special tokens: BART's ``<s>`` as [CLS] and ``</s>`` as [SEP]; T5's ``</s>`` (its end
    token, no start token) as [SEP]."""
    tokenizer = loaded.tokenizer
    end = tokenizer.sep_token or tokenizer.eos_token
    if end is None:
        raise BertologyError(f"The tokenizer of '{loaded.name}' has no end-of-text token.")
    return SpecialTokens(tokenizer.cls_token, end)


#: The decoder's roles: a decoder's (causal, no [CLS] or [SEP]).
DECODER_SPECIAL = SpecialTokens(None, None, causal=True)


def _decoder_start(loaded: LoadedModel) -> int:
    start = loaded.model.config.decoder_start_token_id
    if start is None:
        raise BertologyError(f"'{loaded.name}' has no decoder start token in its config.")
    return int(start)


def _shifted_row(row: EncodedRow, start: int, start_token: str) -> EncodedRow:
    """The decoder's input for labels ``row``: the start token, then the labels but the last (teacher
    forcing); the start token is special, of word -1."""
    ids = np.concatenate([[start], row.features["input_ids"][:-1]]).astype(np.int64)

    def shifted(values: np.ndarray, first: int | bool) -> np.ndarray:
        return np.concatenate([np.array([first], dtype=values.dtype), values[:-1]])

    return EncodedRow(
        tokens=[start_token, *row.tokens[:-1]],
        segment_ids=shifted(row.segment_ids, 0),
        special=shifted(row.special, True),
        word_ids=shifted(row.word_ids, -1),
        words=row.words,
        word_segments=row.word_segments,
        truncated=row.truncated,
        features={"input_ids": ids, "attention_mask": np.ones(len(ids), dtype=np.int64)},
    )


def _id_row(loaded: LoadedModel, ids: list[int]) -> EncodedRow:
    """A decoder input of token ids as they are (a greedy output): each token its own word, the
    tokenizer's special tokens special."""
    tokenizer = loaded.tokenizer
    special = np.isin(ids, sorted(tokenizer.all_special_ids))
    words = [
        tokenizer.decode([token]) for token, is_special in zip(ids, special, strict=True) if not is_special
    ]
    return EncodedRow(
        tokens=tokenizer.convert_ids_to_tokens(ids),
        segment_ids=np.zeros(len(ids), dtype=np.int64),
        special=special,
        word_ids=np.where(special, -1, np.cumsum(~special) - 1),
        words=words,
        word_segments=np.zeros(len(words), dtype=np.int64),
        truncated=0,
        features={
            "input_ids": np.asarray(ids, dtype=np.int64),
            "attention_mask": np.ones(len(ids), np.int64),
        },
    )


def output_embeddings(loaded: LoadedModel) -> torch.Tensor:
    """[vocabulary, d_model]: the word embeddings a tied language-model head scores the decoder's last hidden
    state against (BART and T5 tie them; T5's scaling of the hidden state and BART's zero bias do not change
    which token scores highest).

    Raises:
        BertologyError: a model whose head is not tied to its embeddings (e.g. T5 v1.1).
    """
    if not getattr(loaded.model.config, "tie_word_embeddings", True):
        raise BertologyError(
            f"'{loaded.name}' has its own output head, which the bare model does not load, so it cannot give "
            "its greedy output; give every source a target (JSONL 'target')."
        )
    return loaded.model.get_input_embeddings().weight


def greedy_outputs(loaded: LoadedModel, encoded: EncodedBatch, max_new_tokens: int) -> list[list[int]]:
    """Each source's greedy output: the ids the decoder produced, one at a time (the highest-scoring token
    under the tied head, :func:`output_embeddings`), up to and including the end token or
    ``max_new_tokens`` ids. The decoder start token is not included."""
    model, device = loaded.model, loaded.device
    embeddings = output_embeddings(loaded)
    inputs = {name: encoded.model_inputs[name].to(device) for name in ("input_ids", "attention_mask")}
    end, start = loaded.tokenizer.eos_token_id, _decoder_start(loaded)
    outputs: list[list[int]] = [[] for _ in range(len(encoded))]
    done = np.zeros(len(encoded), dtype=bool)
    with torch.inference_mode():
        encoder_outputs = model.get_encoder()(**inputs)
        decoder = torch.full((len(encoded), 1), start, device=device)
        for _ in range(max_new_tokens):
            hidden = model(
                encoder_outputs=encoder_outputs,
                attention_mask=inputs["attention_mask"],
                decoder_input_ids=decoder,
                use_cache=False,
            ).last_hidden_state[:, -1]
            chosen = (hidden @ embeddings.T).argmax(-1)
            for index, token in enumerate(chosen.tolist()):
                if not done[index]:
                    outputs[index].append(token)
                    done[index] = token == end
            if done.all():
                break
            decoder = torch.cat([decoder, chosen[:, None]], dim=1)
    return outputs


def decoder_inputs(
    loaded: LoadedModel, batch: list[Source], max_length: int, encoded: EncodedBatch, max_new_tokens: int
) -> EncodedBatch:
    """The decoder's inputs of a batch: each target's labels (cut to ``max_length`` tokens) behind the start
    token, the last label left out; for a source without a target, the start token and its greedy output
    but the last token (the tokens the decoder read while producing it)."""
    start = _decoder_start(loaded)
    start_token = loaded.tokenizer.convert_ids_to_tokens(start)
    rows: list[EncodedRow | None] = [None] * len(batch)
    given = [index for index, item in enumerate(batch) if item.target is not None]
    if given:
        labels = encode(loaded.tokenizer, [batch[i].target for i in given], max_length=max_length, warn=False)
        for index, row in zip(given, labels.rows(), strict=True):
            rows[index] = _shifted_row(row, start, start_token)
    greedy = [index for index, item in enumerate(batch) if item.target is None]
    if greedy:
        outputs = greedy_outputs(loaded, _subset(encoded, greedy, loaded), max_new_tokens)
        for index, output in zip(greedy, outputs, strict=True):
            rows[index] = _id_row(loaded, [start, *output[:-1]])
    return stack_rows(
        [row for row in rows if row is not None], loaded.tokenizer, pad_to_multiple_of=PAD_MULTIPLE
    )


def _subset(encoded: EncodedBatch, indices: list[int], loaded: LoadedModel) -> EncodedBatch:
    rows = encoded.rows()
    return stack_rows([rows[index] for index in indices], loaded.tokenizer, pad_to_multiple_of=PAD_MULTIPLE)


@dataclass(frozen=True)
class CrossRows:
    """Per-row quantities of one batch's cross-attention, each ``[B, L, H, T]`` float32 for decoder query
    ``t`` of ``A = cross[b, l, h]`` (``[T, S]``, rows over the ``n_s`` real source tokens):
    entropy ``-sum_s A[t, s] ln A[t, s]`` (nats); maximum ``max_s A[t, s]``; end / punct: the mass on the
    source's end token (``</s>``, the [SEP] role) / on "." and ","; diagonal: :func:`diagonal_distance`.
    queries: [B, T] bool, the real decoder tokens; log_length: [B] ``ln n_s``.
    """

    entropy: torch.Tensor
    maximum: torch.Tensor
    end: torch.Tensor
    punct: torch.Tensor
    diagonal: torch.Tensor
    queries: torch.Tensor
    log_length: torch.Tensor


def diagonal_distance(
    probs: torch.Tensor, query_lengths: torch.Tensor, key_lengths: torch.Tensor
) -> torch.Tensor:
    """How far a cross-attention row lies from the monotone alignment, ``[B, H, T]``.

    Decoder token ``t`` of ``n_t`` and source token ``s`` of ``n_s`` sit at the relative positions
    ``(t + ½) / n_t`` and ``(s + ½) / n_s`` (the centres of equal slices of [0, 1]); the monotone alignment
    maps each to the other, and the distance is the attention-weighted gap
    ``d(t) = sum_s A[t, s] |(s + ½) / n_s - (t + ½) / n_t|``, in [0, 1): 0 when every decoder token attends to
    the source token at its own relative place (an identity alignment of equal lengths), about 1/3 for
    uniform attention, near 1 for attention to the far end.

    probs: [B, H, T, S]; query_lengths, key_lengths: [B] ``n_t``, ``n_s``.
    """
    _, _, queries, keys = probs.shape
    query_place = (torch.arange(queries, device=probs.device) + 0.5) / query_lengths[:, None].clamp_min(1)
    key_place = (torch.arange(keys, device=probs.device) + 0.5) / key_lengths[:, None].clamp_min(1)
    gap = (key_place[:, None, :] - query_place[:, :, None]).abs()  # [B, T, S]
    return (probs * gap[:, None]).sum(-1)


class CrossSummarizer:
    """Builds :class:`CrossRows` from a batch's cross-attention, one decoder layer at a time
    (:meth:`add_layer`)."""

    def __init__(self, source: TokenRoles, decoder_lengths: np.ndarray) -> None:
        self.source = source
        self.decoder_lengths = torch.as_tensor(decoder_lengths, device=source.valid.device)
        self.layers: list[dict[str, torch.Tensor]] = []

    def add_layer(self, probs: torch.Tensor) -> None:
        """One decoder layer's cross-attention ``probs`` [B, H, T, S]."""
        probs = probs.float()
        source = self.source
        keys = torch.stack([source.is_sep, source.is_punct], dim=-1).to(
            probs.device, probs.dtype
        )  # [B, S, 2]
        masses = torch.einsum("bhts,bsk->bhtk", probs, keys)
        key_lengths = source.valid.sum(-1).to(probs.device)
        self.layers.append(
            {
                "entropy": -(probs.clamp_min(_TINY).log() * probs).sum(-1),
                "maximum": probs.amax(-1),
                "end": masses[..., 0],
                "punct": masses[..., 1],
                "diagonal": diagonal_distance(probs, self.decoder_lengths.to(probs.device), key_lengths),
            }
        )

    def result(self) -> CrossRows:
        stacked = {name: torch.stack([layer[name] for layer in self.layers], 1) for name in self.layers[0]}
        width = stacked["entropy"].shape[-1]
        lengths = self.decoder_lengths.to(stacked["entropy"].device)
        queries = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
        log_length = torch.log(self.source.valid.sum(-1).clamp_min(1).float()).to(lengths.device)
        return CrossRows(**stacked, queries=queries, log_length=log_length)


#: The cross-attention statistics, each a per-query quantity over every decoder token, named as the surface
#: statistic they mirror (``sep``: the source's end token; ``diagonal``: :func:`diagonal_distance`).
CROSS_STATISTICS: dict[str, Callable[[CrossRows], QueryValues]] = {
    "sep": lambda rows: QueryValues(rows.end, rows.queries),
    "punct": lambda rows: QueryValues(rows.punct, rows.queries),
    "entropy": lambda rows: QueryValues(rows.entropy, rows.queries),
    "entropy_uniform": lambda rows: QueryValues(
        rows.log_length[:, None, None, None].expand(rows.entropy.shape), rows.queries
    ),
    "confidence": lambda rows: QueryValues(rows.maximum, rows.queries),
    "diagonal": lambda rows: QueryValues(rows.diagonal, rows.queries),
}

#: One line on each cross-attention statistic, for the report.
CROSS_DESCRIPTIONS = {
    "sep": "attention to the source's end token (</s>)",
    "punct": 'attention to the source\'s "." and ","',
    "entropy": "entropy of a decoder token's attention over the source, nats",
    "entropy_uniform": "entropy of uniform attention over the source, nats (the baseline of entropy)",
    "confidence": "largest weight on a source token",
    "diagonal": "mean distance from the monotone alignment, |(s+½)/n_s - (t+½)/n_t| weighted by attention "
    "(0: on the diagonal, about 1/3: uniform)",
}


class _Stack:
    """The accumulators of one self-attention stack: surface statistics and pattern scores."""

    def __init__(self, special: SpecialTokens) -> None:
        self.special = special
        self.surface = SurfaceAccumulator(special)
        self.patterns = PatternAccumulator(special)


@dataclass(repr=False)
class Seq2SeqAnalysis(Summarised):
    """Per-head results of an encoder-decoder over a corpus (heads 0-based ``(layer, head)`` in each stack).

    surface / patterns: the ``encoder`` and ``decoder`` stacks' surface statistics and pattern scores (as an
    encoder's and a decoder's :class:`~bertology.analysis.analyze.CorpusAnalysis`); cross: the cross-attention
    statistics (:data:`CROSS_STATISTICS`), ``[decoder layers, heads]`` each.
    segments: sources analysed; greedy_segments: those whose decoder read the model's greedy output (at most
    ``max_new_tokens`` tokens) for want of a target; truncated_segments / tokens_cut: sources cut to
    ``max_length`` tokens. distances: each stack's mean Jensen-Shannon divergence between its heads
    (:class:`~bertology.analysis.distances.HeadDistances`, over :data:`JS_TOKENS_PER_SEGMENT` query tokens per
    source sampled with seed 0, as ``analyze`` samples them; cross-attention rows are over the source).
    """

    model_name: str
    corpus: str
    max_length: int
    max_new_tokens: int
    surface: dict[str, HeadTable]
    patterns: dict[str, HeadPatterns]
    cross: HeadTable
    distances: dict[str, HeadDistances]
    segments: int
    greedy_segments: int
    truncated_segments: int
    tokens_cut: int
    seconds: float

    def heads_frame(self) -> pd.DataFrame:
        """One row per stack, layer and head: ``stack`` (``encoder``, ``decoder``, ``cross``), ``layer``,
        ``head``, then the columns of an encoder's ``heads.csv`` and ``diagonal``; a statistic a stack does
        not define is empty (cross-attention has no pattern label)."""
        frames = [
            head_table_frame(self.surface[stack], self.patterns[stack]) for stack in ("encoder", "decoder")
        ]
        frames.append(self.cross.to_frame())
        for stack, frame in zip(ATTENTION_SETS, frames, strict=True):
            frame.insert(0, "stack", stack)
        return pd.concat(frames, ignore_index=True)

    def decoder_reads(self) -> str:
        """One sentence on what the decoder read."""
        given = self.segments - self.greedy_segments
        if not self.greedy_segments:
            return f"The decoder read each of the {given} targets (teacher forcing)."
        return (
            f"The decoder read the model's own greedy output (at most {self.max_new_tokens} new tokens) for "
            f"{self.greedy_segments} sources without a target"
            + (f" and the given target for the other {given}." if given else ".")
        )

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "kind": "encoder-decoder",
            "corpus": self.corpus,
            "max_length": self.max_length,
            "max_new_tokens": self.max_new_tokens,
            "segments": self.segments,
            "greedy_segments": self.greedy_segments,
            "decoder_reads": self.decoder_reads(),
            "truncated_segments": self.truncated_segments,
            "tokens_cut": self.tokens_cut,
            "seconds": round(self.seconds, 2),
        }


class Seq2SeqAccumulators:
    """An encoder-decoder's streaming accumulators over a corpus, fed a batch of :class:`Source` at a time
    (:meth:`update`) and read with :meth:`result`.

    max_length: tokens per source and per target at most (and the model's own limit).
    max_new_tokens: the longest greedy output for a source without a target (at most the model's limit).

    Raises:
        BertologyError: a model that is not an encoder-decoder.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_length: int = 128,
        max_new_tokens: int = MAX_NEW_TOKENS,
        corpus: str | Path = "",
    ) -> None:
        if loaded.kind != "encoder-decoder":
            raise BertologyError(
                f"'{loaded.name}' is {KIND_PHRASES[loaded.kind]} model; an analysis of sources and targets "
                "needs an encoder-decoder model (BART, T5)."
            )
        self.loaded, self.corpus = loaded, str(corpus)
        self.max_length = min(max_length, loaded.max_length)
        self.max_new_tokens = min(max_new_tokens, loaded.max_length)  # the decoder reads no more
        self.started = time.perf_counter()
        self.stacks = {"encoder": _Stack(seq2seq_special(loaded)), "decoder": _Stack(DECODER_SPECIAL)}
        self.cross = SegmentMeans(tuple(CROSS_STATISTICS))
        self.distances = {
            stack: DistanceAccumulator(max_tokens_per_segment=JS_TOKENS_PER_SEGMENT)
            for stack in ATTENTION_SETS
        }
        self.segments = self.greedy_segments = self.truncated_segments = self.tokens_cut = 0

    def update(self, batch: list[Source]) -> tuple[EncodedBatch, EncodedBatch]:
        """Run one batch and fold its three kinds of attention into the accumulators while the model runs;
        returns the encoded sources and decoder inputs."""
        loaded = self.loaded
        sources = encode(
            loaded.tokenizer,
            [item.source for item in batch],
            max_length=self.max_length,
            pad_to_multiple_of=PAD_MULTIPLE,
            warn=False,
        )
        decoded = decoder_inputs(loaded, batch, self.max_length, sources, self.max_new_tokens)
        encoder_layers, decoder_layers = encoder_decoder_layers(loaded.model.config)
        device = loaded.device
        encoder_rows = RowSummarizer(sources, self.stacks["encoder"].special)
        decoder_rows = RowSummarizer(decoded, DECODER_SPECIAL)
        cross_rows = CrossSummarizer(
            self.stacks["encoder"].special.roles(sources, sources.model_inputs["input_ids"].shape[1], device),
            decoded.lengths,
        )
        samplers = {
            "encoder": self.distances["encoder"].sampler(sources.lengths),
            "decoder": self.distances["decoder"].sampler(decoded.lengths),
            "cross": self.distances["cross"].sampler(decoded.lengths, sources.lengths),
        }
        summarizers = {"encoder": encoder_rows, "decoder": decoder_rows, "cross": cross_rows}
        calls = itertools.count()

        def consume(probs: torch.Tensor) -> None:
            call = next(calls)
            if call < encoder_layers:
                stack = "encoder"
            else:
                stack = "decoder" if (call - encoder_layers) % 2 == 0 else "cross"
            summarizers[stack].add_layer(probs)
            samplers[stack].add_layer(probs)

        with (
            torch.inference_mode(),
            recording(consume=consume, stop_after=encoder_layers + 2 * decoder_layers),
        ):
            loaded.model(
                input_ids=sources.model_inputs["input_ids"].to(device),
                attention_mask=sources.model_inputs["attention_mask"].to(device),
                decoder_input_ids=decoded.model_inputs["input_ids"].to(device),
                decoder_attention_mask=decoded.model_inputs["attention_mask"].to(device),
                use_cache=False,
            )
        for stack, rows in (("encoder", encoder_rows), ("decoder", decoder_rows)):
            summary = rows.result()
            self.stacks[stack].surface.update_rows(summary)
            self.stacks[stack].patterns.update_rows(summary)
        for stack, sampler in samplers.items():
            self.distances[stack].add(sampler)
        cross = cross_rows.result()
        self.cross.add(*stack_segment_means(statistic(cross) for statistic in CROSS_STATISTICS.values()))
        self.segments += len(batch)
        self.greedy_segments += sum(1 for item in batch if item.target is None)
        self.truncated_segments += sum(1 for cut in sources.truncated if cut > 0)
        self.tokens_cut += sum(sources.truncated)
        return sources, decoded

    def result(self) -> Seq2SeqAnalysis:
        """The :class:`Seq2SeqAnalysis` of everything added so far.

        Raises:
            BertologyError: no source was added.
        """
        if self.segments == 0:
            raise BertologyError(f"The corpus '{self.corpus}' gave no sources to analyse.")
        return Seq2SeqAnalysis(
            model_name=self.loaded.name,
            corpus=self.corpus,
            max_length=self.max_length,
            max_new_tokens=self.max_new_tokens,
            surface={name: stack.surface.result() for name, stack in self.stacks.items()},
            patterns={name: stack.patterns.result() for name, stack in self.stacks.items()},
            cross=self.cross.table("cross-attention accumulator"),
            distances={stack: distances.result() for stack, distances in self.distances.items()},
            segments=self.segments,
            greedy_segments=self.greedy_segments,
            truncated_segments=self.truncated_segments,
            tokens_cut=self.tokens_cut,
            seconds=time.perf_counter() - self.started,
        )


def analyze_seq2seq_corpus(
    corpus: str | Path,
    loaded: LoadedModel,
    *,
    max_length: int = 128,
    limit: int | None = None,
    batch_size: int = BATCH_SIZE,
    corpus_format: str | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    on_progress: Progress | None = None,
) -> Seq2SeqAnalysis:
    """Stream the first ``limit`` sources of ``corpus`` (:func:`read_sources`) through the encoder-decoder
    ``loaded``, ``batch_size`` at a time, and return every head's statistics in its three stacks.

    Raises:
        BertologyError: a model that is not an encoder-decoder, an unreadable or empty corpus.
    """
    accumulators = Seq2SeqAccumulators(
        loaded, max_length=max_length, max_new_tokens=max_new_tokens, corpus=corpus
    )
    sources = itertools.islice(read_sources(corpus, corpus_format), limit)
    while batch := list(itertools.islice(sources, batch_size)):
        accumulators.update(batch)
        if on_progress is not None:
            on_progress(accumulators.segments, limit)
    return accumulators.result()


@dataclass(repr=False)
class Seq2SeqComparison(Summarised):
    """Two encoder-decoders of one shape (layers and heads per stack) measured on the same sources.

    a, b: each model's :class:`Seq2SeqAnalysis`. A source without a target is decoded by each model itself,
    so their decoders may read different tokens there (the summary says how many such sources there were).
    """

    a: Seq2SeqAnalysis
    b: Seq2SeqAnalysis

    def to_frame(self) -> pd.DataFrame:
        """One row per stack, layer and head: every statistic of ``heads.csv`` for A and B (``<name>_a``,
        ``<name>_b``) and its change B - A (``<name>_change``), and both labels (``label_a``, ``label_b``)."""
        a, b = self.a.heads_frame(), self.b.heads_frame()
        keys = ["stack", "layer", "head"]
        numbers = [
            name
            for name in a.columns
            if name not in (*keys, "label_segment") and pd.api.types.is_float_dtype(a[name])
        ]
        frame = a[keys].copy()
        frame["label_a"], frame["label_b"] = a["label"], b["label"]
        for name in numbers:
            frame[f"{name}_a"], frame[f"{name}_b"] = a[name], b[name]
            frame[f"{name}_change"] = b[name] - a[name]
        return frame

    def changes(self, stack: str) -> HeadTable:
        """The change B - A of every statistic of ``stack``, ``[layers, heads]`` each."""
        if stack == "cross":
            before, after = self.a.cross, self.b.cross
        else:
            before, after = self.a.surface[stack], self.b.surface[stack]
        return HeadTable(
            columns={name: after[name] - before[name] for name in before.columns},
            defined_segments={
                name: min(before.defined_segments[name], after.defined_segments[name])
                for name in before.columns
            },
            segments=before.segments,
        )

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model_a": self.a.model_name,
            "model_b": self.b.model_name,
            "kind": "encoder-decoder",
            "corpus": self.a.corpus,
            "segments": self.a.segments,
            "greedy_segments": self.a.greedy_segments,
            "decoder_reads": self.a.decoder_reads().replace("the model's own", "each model's own"),
            "seconds": round(self.a.seconds + self.b.seconds, 2),
        }


def stack_shapes(loaded: LoadedModel) -> dict[str, tuple[int, int]]:
    """(layers, heads) of each stack of an encoder-decoder."""
    encoder, decoder = encoder_decoder_layers(loaded.model.config)
    heads = loaded.num_heads
    return {"encoder": (encoder, heads), "decoder": (decoder, heads), "cross": (decoder, heads)}


def compare_seq2seq_models(
    loaded_a: LoadedModel, loaded_b: LoadedModel, corpus: str | Path, **options: Any
) -> Seq2SeqComparison:
    """Analyse ``corpus`` with two encoder-decoders of one shape (e.g. a model and its fine-tune) and compare
    them head by head; ``options`` as :func:`analyze_seq2seq_corpus` takes them.

    Raises:
        BertologyError: a model that is not an encoder-decoder, or two of different shapes.
    """
    for loaded in (loaded_a, loaded_b):
        if loaded.kind != "encoder-decoder":
            raise BertologyError(
                f"'{loaded.name}' is {KIND_PHRASES[loaded.kind]} model; an encoder-decoder is compared with "
                "another encoder-decoder."
            )
    shapes = stack_shapes(loaded_a), stack_shapes(loaded_b)
    if shapes[0] != shapes[1]:
        described = [
            ", ".join(f"{stack} {layers} x {heads}" for stack, (layers, heads) in shape.items())
            for shape in shapes
        ]
        raise BertologyError(
            f"Encoder-decoders are compared head by head when their stacks have one shape; "
            f"'{loaded_a.name}' has {described[0]} and '{loaded_b.name}' {described[1]}."
        )
    return Seq2SeqComparison(
        analyze_seq2seq_corpus(corpus, loaded_a, **options),
        analyze_seq2seq_corpus(corpus, loaded_b, **options),
    )
