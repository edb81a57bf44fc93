"""A coreference run: documents into windows, windows into batches, batches through the model into a
:class:`~bertology.probes.coreference.counts.CorefAccumulator`."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np
from transformers import PreTrainedTokenizerBase

from bertology.corpus.batching import length_sorted_batches, prefetched
from bertology.corpus.readers.coref_documents import CorefDocument
from bertology.errors import BertologyError
from bertology.probes.coreference.counts import CorefAccumulator, CorefProbe, DocumentsRead
from bertology.probes.coreference.windows import CorefWindow, coref_windows
from bertology.probes.rows import query_word_rows
from bertology.progress import Progress

if TYPE_CHECKING:
    from bertology.models.loading import LoadedModel


class NoMentionScored(BertologyError):
    """:func:`score_coreference` read its documents but could score no mention.

    documents: documents read; mentions: mentions in them; skipped: mentions in a sentence longer than
    the model takes; out_of_reach: mentions whose every antecedent lies before their window.
    """

    def __init__(self, documents: int, mentions: int, skipped: int, out_of_reach: int) -> None:
        self.documents, self.mentions = documents, mentions
        self.skipped, self.out_of_reach = skipped, out_of_reach
        if mentions == 0:
            message = f"The {documents} documents read have no coreference mentions."
        elif skipped + out_of_reach == 0:
            message = (
                f"None of the {mentions} mentions in {documents} documents has an antecedent (each entity is "
                "mentioned once), so there is nothing to score."
            )
        else:
            message = (
                f"No coreferent mention could be scored in {documents} documents: {skipped} mentions are in "
                f"sentences longer than the model takes and {out_of_reach} have every antecedent out of "
                "reach, and the others have no antecedent."
            )
        super().__init__(message)


def _token_counter(
    document: CorefDocument, tokenizer: PreTrainedTokenizerBase
) -> tuple[Callable[[int, int], int], Callable[[int, int], int]]:
    """``(count, estimate)`` for :func:`coref_windows`: the exact token count of a run of the document's
    sentences (its words joined by spaces, tokenized by the model's ``tokenizer``, cached), and the sum of
    its sentences' own counts plus the special tokens (exact for tokenizers that split at spaces, such as
    WordPiece)."""
    starts = [*document.sentence_starts, len(document.words)]
    cache: dict[tuple[int, int], int] = {}

    def text(first: int, last: int) -> str:
        return " ".join(document.words[starts[first] : starts[last + 1]])

    def count(first: int, last: int) -> int:
        if (first, last) not in cache:
            cache[first, last] = len(tokenizer(text(first, last), verbose=False)["input_ids"])
        return cache[first, last]

    sentences = [text(index, index) for index in range(len(starts) - 1)]
    encoded = tokenizer(sentences, add_special_tokens=False, verbose=False) if sentences else None
    lengths = [] if encoded is None else [len(ids) for ids in encoded["input_ids"]]
    before = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    special = tokenizer.num_special_tokens_to_add(pair=False)

    def estimate(first: int, last: int) -> int:
        return int(before[last + 1] - before[first]) + special

    return count, estimate


@dataclass(frozen=True)
class CorefItem:
    """One item of a coreference run's batches (:func:`coref_batches`).

    window: a window with scored mentions, or ``None`` for the run's last item when only counts remain.
    words: the window's words. read: the documents read since the previous item, counted with this one
    (so each is counted once, whichever batch or worker the item lands in).
    """

    window: CorefWindow | None
    words: list[str]
    read: DocumentsRead

    @property
    def tokens(self) -> int:
        """The window's token count (0 without one)."""
        return 0 if self.window is None else self.window.tokens


def _window_limit(model: LoadedModel, max_length: int | None) -> int:
    """Tokens per window: ``max_length``, at most the model's own (its own without one)."""
    return model.max_length if max_length is None else min(max_length, model.max_length)


def _coref_items(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    tokenizer: PreTrainedTokenizerBase,
    limit: int,
) -> Iterator[CorefItem]:
    read = DocumentsRead()
    for item in documents:
        document, heads = item if isinstance(item, tuple) else (item, None)
        count, estimate = _token_counter(document, tokenizer)
        built = coref_windows(document, heads, count, limit, estimate)
        read.documents += 1
        read.mentions += len(document.mentions)
        read.skipped += built.skipped
        for window in built.windows:
            if window.mentions:
                yield CorefItem(window, window.words(document), read)
                read = DocumentsRead()
            else:
                read.out_of_reach += window.out_of_reach
    if not read.empty:
        yield CorefItem(None, [], read)


def coref_batches(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    model: LoadedModel,
    *,
    limit_documents: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
) -> Iterator[list[CorefItem]]:
    """The batches of windows a coreference probe of ``documents`` captures, in order: the windows with
    scored mentions of consecutive documents, sorted by token count
    (:func:`~bertology.corpus.batching.length_sorted_batches`), each carrying the counts of the documents read
    before it. Arguments as in :func:`score_coreference`; only one sort window of documents is held. The
    windows are counted with a copy of the model's tokenizer, so the batches may be made in a thread while
    the model runs (:func:`~bertology.corpus.batching.prefetched`)."""
    reader = copy.deepcopy(model.tokenizer)  # a tokenizer serves one thread
    items = _coref_items(islice(documents, limit_documents), reader, _window_limit(model, max_length))
    return length_sorted_batches(items, lambda item: item.tokens, batch_size=batch_size)


def score_coref_batch(
    accumulator: CorefAccumulator,
    batch: list[CorefItem],
    model: LoadedModel,
    *,
    max_length: int | None = None,
) -> None:
    """Capture one batch of :func:`coref_batches` (one forward pass) and score its windows into
    ``accumulator``; only the scored mentions' rows are kept (:func:`~bertology.probes.rows.query_word_rows`).
    max_length: as given to :func:`coref_batches`."""
    for item in batch:
        accumulator.add_read(item.read)
    accumulator.items += len(batch)
    windows = [(item.window, item.words) for item in batch if item.window is not None]
    if not windows:
        return
    queries = [[mention.head for mention in window.mentions] for window, _ in windows]
    captured = query_word_rows(
        [words for _, words in windows], queries, model, max_length=_window_limit(model, max_length)
    )
    for (window, _), heads, rows in zip(windows, queries, captured, strict=True):
        accumulator.update(window, rows.rows, rows.tokens[heads] == 0)


def score_coref_batches(
    batches: Iterable[list[CorefItem]],
    model: LoadedModel,
    *,
    max_length: int | None = None,
    on_progress: Progress | None = None,
) -> CorefAccumulator:
    """A fresh accumulator with ``batches`` (of :func:`coref_batches`) scored into it, in this process, the
    next batches made in a thread meanwhile. on_progress: told the windows scored (the total unknown)."""
    accumulator = CorefAccumulator()
    for batch in prefetched(batches):
        score_coref_batch(accumulator, batch, model, max_length=max_length)
        if on_progress is not None:
            on_progress(accumulator.windows)
    return accumulator


def check_scored(accumulator: CorefAccumulator) -> CorefProbe:
    """The probe of a run's accumulator.

    Raises:
        NoMentionScored: no mention could be scored (with the counts of why).
    """
    if accumulator.counts.sum() == 0:
        skipped, out_of_reach = int(accumulator.skipped.sum()), int(accumulator.out_of_reach.sum())
        raise NoMentionScored(accumulator.documents, accumulator.mentions, skipped, out_of_reach)
    return accumulator.result()


def score_coreference(
    documents: Iterable[CorefDocument | tuple[CorefDocument, Sequence[int] | None]],
    model: LoadedModel,
    *,
    limit_documents: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
) -> CorefProbe:
    """Score every head of ``model`` on the coreferent mentions of ``documents``.

    documents: documents, or ``(document, heads)`` pairs with document-level dependency heads (see
        :func:`with_heads`); without heads a mention's head word is its last word.
    batch_size: windows per forward pass (:func:`coref_batches`); memory does not grow with the corpus.
    max_length: token limit per window (default and upper bound: the model's own).

    Raises:
        NoMentionScored: no mention could be scored (with the counts of why).
    """
    batches = coref_batches(
        documents, model, limit_documents=limit_documents, batch_size=batch_size, max_length=max_length
    )
    return check_scored(score_coref_batches(batches, model, max_length=max_length))
