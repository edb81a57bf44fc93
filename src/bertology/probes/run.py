"""The four probes, one verb each: files in, a :class:`~bertology.probes.base.ProbeResult` out.

:func:`probe_dependencies` (which heads track which dependency relations), :func:`probe_parser` (the
attention-only parser), :func:`probe_coreference` (antecedent selection) and :func:`probe_gap` (GAP's
scorecard) stream their files through the model into the probes' accumulators and return a result of
:mod:`bertology.probes.results`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from bertology.attention.words import WordAttention, WordMode
from bertology.corpus.batching import length_sorted_batches, prefetched
from bertology.corpus.readers.coref import read_coref
from bertology.corpus.readers.coref_documents import CorefDocument
from bertology.corpus.readers.corefud import is_corefud, read_corefud
from bertology.corpus.readers.gap import read_gap
from bertology.corpus.readers.treebank import Sentence, check_treebank, read_treebank
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, require_encoder
from bertology.probes.coreference import (
    CorefAccumulator,
    CorefItem,
    NoMentionScored,
    check_scored,
    coref_batches,
    score_coref_batches,
    with_heads,
)
from bertology.probes.data import SkippedSentences, iter_word_attention, predict_heads, token_counter
from bertology.probes.dependency import DependencyAccumulator
from bertology.probes.gap import score_gap
from bertology.probes.parser import AttentionParser, Decode, check_decode, evaluate_parser
from bertology.probes.results import CoreferenceResult, DependencyResult, GapResult, ParserResult
from bertology.progress import Progress

#: A sentence with its place in the treebank (0-based, among the sentences read).
NumberedSentence = tuple[int, Sentence]


def dependency_batches(
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank_format: str | None = None,
    limit: int | None = None,
    batch_size: int = 16,
) -> Iterator[list[NumberedSentence]]:
    """The treebank's first ``limit`` sentences, numbered, in the batches a dependency probe of ``loaded``
    runs (:mod:`bertology.probes.data`: sorted by token count within windows)."""
    sentences = enumerate(itertools.islice(read_treebank(path, treebank_format), limit))
    count = token_counter(loaded)
    return length_sorted_batches(sentences, lambda item: count(item[1].words), batch_size=batch_size)


class DependencyTally:
    """A dependency probe's streaming state (an :class:`~bertology.accumulator.Accumulator`): the per-head
    counts, the sentences probed and skipped and the first ``keep_examples`` sentences (by number) with
    their word attention. Fed a batch at a time (:meth:`update`, run on ``loaded`` with word mode
    ``mode``); the tallies of consecutive shards of the batches, merged in order (:meth:`merge`), equal
    one pass over them (the counts are integers), so a run can be split across workers
    (:mod:`bertology.cluster.probes`). path: the treebank (named by the result and its errors); the
    result's seconds count from the tally's creation.
    """

    def __init__(
        self, loaded: LoadedModel, mode: WordMode = "mean", *, path: str | Path = "", keep_examples: int = 25
    ) -> None:
        self.loaded, self.mode, self.path, self.keep_examples = loaded, mode, str(path), keep_examples
        self.model_name = loaded.name
        self.started = time.perf_counter()
        self.accumulator = DependencyAccumulator()
        self.sentences = 0
        self.seen = 0
        self.skipped = SkippedSentences()
        self.examples: list[tuple[int, Sentence, WordAttention]] = []

    @property
    def items(self) -> int:
        """Sentences probed."""
        return self.sentences

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the model: a worker sends its counts, not its model."""
        return {**self.__dict__, "loaded": None}

    def update(self, batch: list[NumberedSentence]) -> None:
        """Run one batch (one forward pass, :func:`~bertology.probes.data.predict_heads`)."""
        number = {id(sentence): index for index, sentence in batch}
        keep = [index < self.keep_examples for index, _ in batch]
        sentences = [sentence for _, sentence in batch]
        scored, skipped = predict_heads(sentences, self.loaded, mode=self.mode, keep=keep)
        for each in scored:
            self.accumulator.add_predictions(each.sentence, each.predicted)
            if each.words is not None:
                self.examples.append((number[id(each.sentence)], each.sentence, each.words))
        self.sentences += len(scored)
        self.seen += len(batch)
        self.skipped.truncated += skipped.truncated
        self.skipped.untokenized += skipped.untokenized

    def merge(self, other: DependencyTally) -> DependencyTally:
        """Fold in ``other`` (a later shard of the same run) and return ``self``."""
        self.accumulator.merge(other.accumulator)
        self.sentences += other.sentences
        self.seen += other.seen
        self.skipped.truncated += other.skipped.truncated
        self.skipped.untokenized += other.skipped.untokenized
        self.examples.extend(other.examples)
        return self

    def result(self) -> DependencyResult:
        """The run over everything added.

        Raises:
            BertologyError: no sentence could be probed.
        """
        if self.sentences == 0:
            raise BertologyError(
                f"None of the {self.seen} sentences read from {self.path} could be probed: "
                f"{self.skipped.truncated} are longer than the model takes and {self.skipped.untokenized} "
                "have a word that gives no token."
            )
        return DependencyResult(
            probe=self.accumulator.result(),
            treebank=self.path,
            model_name=self.model_name,
            mode=self.mode,
            sentences=self.sentences,
            skipped=self.skipped.total,
            seconds=time.perf_counter() - self.started,
            examples=[
                (sentence, words) for _, sentence, words in sorted(self.examples, key=lambda item: item[0])
            ],
        )


def probe_dependencies(
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank_format: str | None = None,
    mode: WordMode = "mean",
    limit: int | None = None,
    batch_size: int = 16,
    keep_examples: int = 25,
    on_progress: Progress | None = None,
) -> DependencyResult:
    """Clark et al.'s per-relation head accuracies (and fixed-offset baselines) over a treebank.

    limit: at most this many sentences (the first ones). on_progress: told the sentences probed, and
    the limit as the total.

    Raises:
        BertologyError: unreadable treebank, or no sentence fits the model.
    """
    require_encoder(loaded, "Dependency probing")
    tally = DependencyTally(loaded, mode, path=path, keep_examples=keep_examples)
    batches = dependency_batches(
        path, loaded, treebank_format=treebank_format, limit=limit, batch_size=batch_size
    )
    for batch in prefetched(batches):  # the treebank is read and counted while the model runs
        tally.update(batch)
        if on_progress is not None:
            on_progress(tally.sentences, limit)
    return tally.result()


def probe_parser(
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
    on_progress: Progress | None = None,
) -> ParserResult:
    """Train the attention-only parser on ``train`` and report UAS (no punctuation) on ``evaluation``
    beside the right-branching and best-single-head baselines. on_progress: told the sentences read of
    each treebank (the limit as the total), in the stages "Reading the training treebank" and "Scoring
    the evaluation treebank"."""
    check_decode(decode)  # before the training, not after it
    require_encoder(loaded, "The attention parser")
    check_treebank(evaluation, treebank_format, limit_eval)  # likewise the file scored after it
    start = time.perf_counter()

    def examples(path: str | Path, limit: int | None, stage: str) -> Iterator[tuple[Sentence, WordAttention]]:
        sentences = itertools.islice(read_treebank(path, treebank_format), limit)
        stream = iter_word_attention(sentences, loaded, mode=mode, batch_size=batch_size)
        if on_progress is not None:
            on_progress(0, limit, stage=stage)
        for pair in stream:
            yield pair
            if on_progress is not None:
                on_progress(stream.seen, limit, stage=stage)

    parser = AttentionParser.fit(examples(train, limit_train, "Reading the training treebank"))
    scored = examples(evaluation, limit_eval, "Scoring the evaluation treebank")
    report = evaluate_parser(parser, scored, decode=decode)
    return ParserResult(
        parser=parser,
        report=report,
        train=str(train),
        evaluation=str(evaluation),
        model_name=loaded.name,
        mode=mode,
        seconds=time.perf_counter() - start,
    )


#: Scores the batches of a coreference run (:func:`~bertology.probes.coreference.coref_batches`) into one
#: accumulator: in this process by default, on a cluster's workers in :mod:`bertology.cluster.probes`.
CorefScorer = Callable[[Iterator[list[CorefItem]]], CorefAccumulator]


def probe_coreference(
    path: str | Path,
    loaded: LoadedModel,
    *,
    treebank: str | Path | None = None,
    coref_format: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    score: CorefScorer | None = None,
    on_progress: Progress | None = None,
) -> CoreferenceResult:
    """Antecedent selection per head over a coreference corpus.

    treebank: the same documents' dependency trees (e.g. GUM's dep_stanford folder), giving sentence
        breaks and mention head words; without it each document is one sentence and a mention's head
        word is its last word. CorefUD files (``coref_format="corefud"``, or ``.conllu`` files) carry
        their own trees, so they take none. limit: at most this many documents (the first ones).
        batch_size: windows per forward pass. score: where the batches are scored (default: here).
        on_progress: told the windows scored (here; a ``score`` elsewhere reports its own).

    Raises:
        BertologyError: an unreadable corpus or treebank, a treebank given with CorefUD, or no mention
            that could be scored (saying why, and that the treebank gives the sentence breaks when their
            lack is the reason).
    """
    require_encoder(loaded, "Coreference probing")
    start = time.perf_counter()
    corefud = coref_format == "corefud" or (coref_format is None and is_corefud(path))
    if corefud and treebank is not None:
        raise BertologyError(
            f"{path} is CorefUD, which carries its own dependency trees; leave out the treebank (--treebank)."
        )
    reader = read_corefud(path) if corefud else None
    pairs: Iterable[CorefDocument | tuple[CorefDocument, list[int]]]
    if reader is not None:
        pairs = reader
    else:
        documents = read_coref(path, coref_format)
        pairs = with_heads(documents, read_treebank(treebank)) if treebank is not None else documents
    batches = coref_batches(pairs, loaded, limit_documents=limit, batch_size=batch_size)
    try:
        scored = (
            score(batches)
            if score is not None
            else score_coref_batches(batches, loaded, on_progress=on_progress)
        )
        probe = check_scored(scored)
    except NoMentionScored as error:
        if not error.mentions:
            raise BertologyError(f"{path} has no coreference mentions.") from error
        if treebank is None and reader is None and error.skipped:
            raise BertologyError(
                f"No mention of {path} could be scored: without sentence breaks (GUM's files have none) "
                f"each document reads as one sentence, and {error.skipped} mentions lie in ones longer than "
                "the model takes; give the same documents' trees as the treebank (--treebank, for GUM its "
                "dep_stanford folder), which supplies the sentence breaks."
            ) from error
        raise BertologyError(f"{path}: {error}") from error
    return CoreferenceResult(
        probe=probe,
        corpus=str(path),
        model_name=loaded.name,
        head_words=(
            "the file's own dependency trees (CorefUD)"
            if reader is not None
            else str(treebank)
            if treebank is not None
            else "last word of each mention"
        ),
        left_out={} if reader is None else reader.skipped.items(),
        seconds=time.perf_counter() - start,
    )


def probe_gap(
    path: str | Path,
    loaded: LoadedModel,
    *,
    limit: int | None = None,
    syntax: bool = True,
    on_progress: Progress | None = None,
) -> GapResult:
    """Every head and GAP's baselines on a GAP file, scored with GAP's own scorer
    (:mod:`bertology.probes.gap`). limit: at most this many examples (the first ones). syntax: run the
    syntactic baselines when spaCy is installed. on_progress: told the examples scored (the limit as the
    total).

    Raises:
        BertologyError: an unreadable file, a pronoun GAP does not have, or no example fits the model.
    """
    require_encoder(loaded, "The GAP probe")
    start = time.perf_counter()
    probe = score_gap(read_gap(path), loaded, limit=limit, syntax=syntax, on_progress=on_progress)
    return GapResult(probe, str(path), loaded.name, time.perf_counter() - start)
