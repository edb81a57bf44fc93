"""Run the probes over treebank files: stream sentences through the model into the accumulators."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bertology.errors import BertologyError
from bertology.models import LoadedModel, require_encoder
from bertology.probes.coreference import CorefProbe, NoMentionScored, probe_coreference, with_heads
from bertology.probes.data import iter_word_attention
from bertology.probes.dependency import DependencyAccumulator, DependencyProbe
from bertology.probes.gap import GapProbe, probe_gap
from bertology.probes.parser import AttentionParser, Decode, ParserReport, check_decode, evaluate_parser
from bertology.readers.coref import read_coref
from bertology.readers.gap import read_gap
from bertology.readers.treebank import Sentence, read_treebank
from bertology.words import WordAttention, WordMode


@dataclass
class DependencyRun:
    """A dependency probe over one treebank, with a few example sentences kept for the report.

    examples: the first ``keep_examples`` sentences with their word attention
        (``probs: [layers, heads, m, m]`` each), for arc diagrams.
    """

    probe: DependencyProbe
    treebank: str
    model_name: str
    mode: str
    sentences: int
    skipped: int
    seconds: float
    examples: list[tuple[Sentence, WordAttention]] = field(default_factory=list)

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "treebank": self.treebank,
            "sentences": self.sentences,
            "skipped (too long, or a word with no token)": self.skipped,
            "word mode": self.mode,
            "seconds": round(self.seconds, 1),
        }


def probe_dependencies(
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank_format: str | None = None,
    mode: WordMode = "mean",
    limit: int | None = None,
    batch_size: int = 16,
    keep_examples: int = 25,
    on_progress: Callable[[int], None] | None = None,
) -> DependencyRun:
    """Clark et al.'s per-relation head accuracies (and fixed-offset baselines) over a treebank.

    limit: at most this many sentences (the first ones). on_progress: called with sentences done.

    Raises:
        BertologyError: unreadable treebank, or no sentence fits the model.
    """
    require_encoder(loaded, "Dependency probing")
    start = time.perf_counter()
    sentences = itertools.islice(read_treebank(path, treebank_format), limit)
    accumulator = DependencyAccumulator()
    examples: list[tuple[Sentence, WordAttention]] = []
    done = 0
    stream = iter_word_attention(sentences, loaded, mode=mode, batch_size=batch_size)
    for sentence, words in stream:
        accumulator.update(sentence, words)
        if len(examples) < keep_examples:
            examples.append((sentence, words))
        done += 1
        if on_progress is not None and done % batch_size == 0:
            on_progress(done)
    if done == 0:
        skipped = stream.skipped
        raise BertologyError(
            f"None of the {stream.seen} sentences read from {path} could be probed: {skipped.truncated} are "
            f"longer than the model takes and {skipped.untokenized} have a word that gives no token."
        )
    return DependencyRun(
        probe=accumulator.result(),
        treebank=str(path),
        model_name=loaded.name,
        mode=mode,
        sentences=done,
        skipped=stream.skipped.total,
        seconds=time.perf_counter() - start,
        examples=examples,
    )


@dataclass
class ParserRun:
    """Clark et al.'s attention-only parser trained on one treebank and scored on another."""

    parser: AttentionParser
    report: ParserReport
    train: str
    evaluation: str
    model_name: str
    mode: str
    seconds: float

    def summary(self) -> dict[str, str | int | float]:
        return {
            "model": self.model_name,
            "trained on": f"{self.train} ({self.parser.train_sentences} sentences)",
            "evaluated on": (
                f"{self.evaluation} ({self.report.sentences} sentences, {self.report.words} scored words)"
            ),
            "word mode": self.mode,
            "decoding": self.report.decode,
            "seconds": round(self.seconds, 1),
        }


def train_and_evaluate_parser(
    train: str | Path,
    evaluation: str | Path,
    loaded: LoadedModel,
    *,
    treebank_format: str | None = None,
    mode: WordMode = "mean",
    limit_train: int | None = None,
    limit_eval: int | None = None,
    decode: Decode = "argmax",
    batch_size: int = 16,
) -> ParserRun:
    """Train the attention-only parser on ``train`` and report UAS (no punctuation) on ``evaluation``
    beside the right-branching and best-single-head baselines."""
    check_decode(decode)  # before the training, not after it
    require_encoder(loaded, "The attention parser")
    start = time.perf_counter()

    def examples(path: str | Path, limit: int | None) -> Iterator[tuple[Sentence, WordAttention]]:
        sentences = itertools.islice(read_treebank(path, treebank_format), limit)
        return iter_word_attention(sentences, loaded, mode=mode, batch_size=batch_size)

    parser = AttentionParser.fit(examples(train, limit_train))
    report = evaluate_parser(parser, examples(evaluation, limit_eval), decode=decode)
    return ParserRun(
        parser=parser,
        report=report,
        train=str(train),
        evaluation=str(evaluation),
        model_name=loaded.name,
        mode=mode,
        seconds=time.perf_counter() - start,
    )


def run_coreference(
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank: str | Path | None = None,
    coref_format: str | None = None,
    limit: int | None = None,
) -> tuple[CorefProbe, dict[str, str | int | float]]:
    """Antecedent selection per head over a coreference corpus, with its summary for a report.

    treebank: the same documents' dependency trees (e.g. GUM's dep_stanford folder), giving sentence
        breaks and mention head words; without it each document is one sentence and a mention's head
        word is its last word.

    Raises:
        BertologyError: an unreadable corpus or treebank, or no mention that could be scored (saying why,
            and that the treebank gives the sentence breaks when their lack is the reason).
    """
    require_encoder(loaded, "Coreference probing")
    start = time.perf_counter()
    documents = read_coref(path, coref_format)
    pairs = with_heads(documents, read_treebank(treebank)) if treebank is not None else documents
    try:
        probe = probe_coreference(pairs, loaded, limit_documents=limit)
    except NoMentionScored as error:
        if treebank is None and error.skipped:
            raise BertologyError(
                f"No mention of {path} could be scored: without sentence breaks (GUM's files have none) "
                f"each document reads as one sentence, and {error.skipped} mentions lie in ones longer than "
                "the model takes; give the same documents' trees as the treebank (--treebank, for GUM its "
                "dep_stanford folder), which supplies the sentence breaks."
            ) from error
        raise BertologyError(f"{path}: {error}") from error
    summary: dict[str, str | int | float] = {
        "model": loaded.name,
        "coreference corpus": str(path),
        "head words from": str(treebank) if treebank is not None else "last word of each mention",
        "mentions out of reach (every antecedent before the window)": probe.out_of_reach,
        "mentions skipped (sentence longer than the model takes)": probe.skipped,
        "seconds": round(time.perf_counter() - start, 1),
    }
    return probe, summary


def run_gap(
    path: str | Path, loaded: LoadedModel, *, limit: int | None = None
) -> tuple[GapProbe, dict[str, str | int | float]]:
    """Per head, how often a GAP pronoun attends more to the right name than to the other one."""
    require_encoder(loaded, "The GAP probe")
    start = time.perf_counter()
    probe = probe_gap(read_gap(path), loaded, limit=limit)
    summary: dict[str, str | int | float] = {
        "model": loaded.name,
        "GAP file": str(path),
        "examples scored (exactly one name coreferent)": probe.count,
        "examples not scored (neither or both names)": probe.not_scored,
        "examples skipped (too long)": probe.skipped,
        "seconds": round(time.perf_counter() - start, 1),
    }
    return probe, summary
