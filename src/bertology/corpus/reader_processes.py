"""Reading, segmenting and encoding a corpus file in this process or spread over reader processes.

With ``readers`` of 2 or more, the file is cut into spans of whole documents
(:func:`~bertology.corpus.readers.spans.document_spans`), handed out in order to a pool of that many
processes, each of which reads, segments and encodes its span with its own copy of the tokenizer (one
tokenizer thread each: a process is a core's worth of work); the spans' segments are put back in the
file's order. At most :data:`SPANS_AHEAD` spans per reader are in flight, so memory stays bounded
however far the readers run ahead of the model. The segments, their order and so every result are those
of one reader, whatever the number of readers.

The pool's processes are forked on Linux: they start in milliseconds with the modules and the tokenizer
already loaded, where a fresh interpreter (elsewhere) spends seconds importing torch and transformers
before its first span (longer than all of UD English EWT's reading). A reader ignores Ctrl-C; the process
that started it stops the pool (the readers finish the span in hand, about
:data:`~bertology.corpus.readers.spans.SPAN_BYTES` of the file, and exit). A reader dies with that process,
even when it is killed (``kill -9``). An error in a reader (a
malformed line) is raised here at its place in the stream, as the one sentence the reader gave, naming
the file and line.
"""

from __future__ import annotations

import collections
import copy
import itertools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from bertology.corpus.encoding import encode
from bertology.corpus.readers import ByteSpan
from bertology.corpus.readers.spans import document_spans
from bertology.corpus.segments import Segment, counting_tokenizer, span_segments
from bertology.errors import BertologyError

#: Segments encoded together (one call of the tokenizer).
ENCODE_CHUNK = 256
#: Spans per reader process handed out ahead of the one the caller waits for.
SPANS_AHEAD = 2


def default_readers(device: str) -> int:
    """Reader processes for a run on ``device`` (a torch device string): on a CPU, 1 (the model's
    forward pass uses the cores, and the reading thread beside it already overlaps it); on an accelerator,
    every core this process may use but one, which drives the model."""
    if device.split(":")[0] == "cpu":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def encoded_segments(
    segments: Iterator[Segment], encoder: PreTrainedTokenizerFast, encoded_length: int | None
) -> Iterator[Segment]:
    """``segments``, each with its encoding cut to ``encoded_length`` tokens
    (:attr:`~bertology.corpus.segments.Segment.encoded`), encoded :data:`ENCODE_CHUNK` at a time with
    ``encoder`` (a copy of the model's tokenizer that serves this thread alone); ``None``: as they come."""
    if encoded_length is None:
        yield from segments
        return
    while chunk := list(itertools.islice(segments, ENCODE_CHUNK)):
        texts = [segment.text_a for segment in chunk], [segment.text_b for segment in chunk]
        rows = encode(encoder, *texts, max_length=encoded_length, warn=False).rows()
        for segment, row in zip(chunk, rows, strict=True):
            yield replace(segment, encoded=row, encoded_length=encoded_length)


@dataclass(frozen=True)
class SpanReading:
    """What every span of one file is read with: the file, its format (``"text"``, ``"jsonl"``,
    ``"conllu"``), the tokenizer, the segments' token limit, pairs or single texts, and the encoding's
    token limit (``None``: segments only). Its copies of the tokenizer are made on first use, once per
    reader (a thread or process reads with one object)."""

    path: Path
    format: str
    tokenizer: PreTrainedTokenizerFast
    max_length: int
    pairs: bool
    encoded_length: int | None

    @cached_property
    def _counter(self) -> Tokenizer:
        return counting_tokenizer(self.tokenizer)

    @cached_property
    def _encoder(self) -> PreTrainedTokenizerFast:
        return copy.deepcopy(self.tokenizer)

    def segments(self, span: ByteSpan | None = None) -> Iterator[Segment]:
        """The encoded segments of ``span`` (``None``: of the whole file)."""
        found = span_segments(
            self.path, self.format, self.tokenizer, self.max_length, self.pairs, span, self._counter
        )
        return encoded_segments(found, self._encoder, self.encoded_length)


#: The reading of the reader process this module runs in (set by :func:`_start_reader`).
_reading: SpanReading | None = None
#: Seconds between a reader's looks at whether the process that started it is still there.
PARENT_CHECK_SECONDS = 0.2


def _start_reader(reading: SpanReading, parent: int) -> None:
    """A reader process's start: it dies with its parent (:func:`_die_with`), Ctrl-C is its parent's to
    handle (ignored here, then unblocked: it was blocked from the fork on, :func:`_interrupts_held`),
    SIGTERM ends it at once (a forked reader would otherwise run the command line's handler, which raises
    instead of exiting, so a pool stopping its readers would wait forever), and its tokenizer and torch
    (the encodings' few tensor operations) run one thread each: a reader is one core's work, and a forked
    process must not use the OpenMP threads of its parent."""
    global _reading
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # this process's own environment
    torch.set_num_threads(1)
    _reading = reading


def _die_with(parent: int) -> None:
    """End this process as soon as the process ``parent`` that started it is gone, killed included: a daemon
    thread looks every :data:`PARENT_CHECK_SECONDS` at this process's parent, which becomes another process
    (init, or a subreaper) when ``parent`` ends. Not ``PR_SET_PDEATHSIG``: the kernel sends that when the
    *thread* that forked the process ends, and the pool's readers are forked by whichever thread first
    iterates :func:`read_encoded` (a prefetching thread that ends before the pool is shut down), so it
    killed readers in the middle of sending a result, and the pool then waited forever for the rest."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="bertology-parent-watch", daemon=True).start()


def _read_span(span: ByteSpan) -> tuple[list[Segment], BertologyError | None]:
    """The segments of ``span`` up to the first problem of the file in it, and that problem (``None``: the
    span read whole), so the segments before it reach the caller as they would from one reader."""
    assert _reading is not None, "a reader process starts with _start_reader"
    read: list[Segment] = []
    try:
        read.extend(_reading.segments(span))
    except BertologyError as problem:
        return read, problem
    return read, None


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT blocked in this thread inside the block, so that a process it starts (which inherits the
    mask) cannot be stopped by Ctrl-C before it ignores it; a Ctrl-C meanwhile reaches this process as the
    block ends (or at once, in another thread)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _start_method() -> str:
    """Fork on Linux (see the module docstring); elsewhere a fresh interpreter (macOS's system libraries
    are not safe to fork)."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


def read_encoded(reading: SpanReading, readers: int = 1) -> Iterator[Segment]:
    """The segments of ``reading``'s file in order, encoded (see :class:`SpanReading`), read in this
    process (``readers`` 1) or by ``readers`` processes (see the module docstring).

    Raises:
        BertologyError: as :func:`~bertology.corpus.segments.iter_segments` while iterating (a malformed
            line, naming the file and line), or a reader process that died (naming the file).
    """
    if readers <= 1:
        yield from reading.segments()
        return
    context = multiprocessing.get_context(_start_method())
    pool = ProcessPoolExecutor(
        readers, mp_context=context, initializer=_start_reader, initargs=(reading, os.getpid())
    )
    waiting: collections.deque[Future[tuple[list[Segment], BertologyError | None]]] = collections.deque()
    spans = document_spans(reading.path, reading.format)
    try:
        with _interrupts_held():  # the pool starts its processes at the first submission
            waiting.append(pool.submit(_read_span, next(spans)))
        for span in itertools.chain(spans, [None]):
            if span is not None:
                waiting.append(pool.submit(_read_span, span))
            while waiting and (span is None or len(waiting) > readers * SPANS_AHEAD):
                read, problem = waiting.popleft().result()
                yield from read
                if problem is not None:
                    raise problem
    except BrokenProcessPool as error:
        raise BertologyError(
            f"A reader process stopped while reading {reading.path.name} ({error}); run again with "
            "--readers 1."
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
