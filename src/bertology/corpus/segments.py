"""Stream a corpus file as model-ready segments, the way Clark et al. (2019) fed text to BERT.

Clark et al., "What Does BERT Look At?", extract attention from segments of at most 128 tokens made of
consecutive paragraphs of a document, set up like BERT's pre-training inputs ``[CLS] A [SEP] B [SEP]``
(no masking, no random second text). :func:`iter_segments` does the same, deterministically:

* plain text (one paragraph per line, blank lines between documents) and CoNLL-U (sentences, documents
  split at ``# newdoc``) are read as *passages*: paragraphs, or the words of one sentence;
* within a document, consecutive passages are packed greedily, in order, while the pair still fits
  ``max_length`` tokens (special tokens included, counted with the model's tokenizer); the packed run is
  split into text A and text B at the passage boundary that makes the two token counts closest (the
  earliest such boundary on a tie);
* a run of one passage has no text B: the last passage of a document when nothing is left to pair
  it with, a passage whose neighbour does not fit beside it, or a passage longer than ``max_length`` on
  its own (which the encoder then truncates);
* JSON Lines inputs are taken as given, one segment per line (``text`` and optional ``text_b``);
* for a decoder (``pairs=False``), which reads one running text with no [SEP] between two, the packed
  run is one text A and never split.

The file is read line by line and only the passages of the segment being built, and those being counted
ahead of it (at most :data:`COUNT_BATCH` passages of :data:`COUNT_CHARACTERS` characters), are kept, so a
corpus of any size streams in flat memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from itertools import accumulate, groupby
from operator import attrgetter
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import BertPreTokenizer
from transformers import PreTrainedTokenizerFast

from bertology.corpus.readers import ByteSpan, Passage, file_problem
from bertology.corpus.readers.jsonl import read_records
from bertology.corpus.readers.text import read_paragraphs
from bertology.corpus.readers.treebank import TREEBANK_EXTENSIONS, read_passages
from bertology.errors import BertologyError
from bertology.options import FORMATS

#: The corpus format of each file extension: JSON Lines, and the treebanks (CoNLL-U, CoNLL-X), read as
#: running text after the checks every treebank reader makes (anything else: plain text).
_EXTENSIONS = {".jsonl": "jsonl"} | dict.fromkeys(TREEBANK_EXTENSIONS, "conllu")
#: Extensions of tables, which plain text would misread (a header and a label column read as text).
_TABLES = {".tsv": "a tab-separated table", ".csv": "a comma-separated table"}

#: Passages whose tokens are counted by one call of the tokenizer, at most (and at most this many
#: characters; see :meth:`_Packer.counted`).
COUNT_BATCH = 256
COUNT_CHARACTERS = 32_768


@dataclass(frozen=True)
class Segment:
    """One model input: text A and optionally text B, encoded as ``[CLS] A [SEP] B [SEP]``.

    text_a, text_b: a string (paragraphs joined by single spaces) or, for CoNLL-U, a list of words.
    origin: where it came from: ``"<file name>:<first line>-<last line>"`` (just one line number when
        the segment comes from a single line).
    tokens: its length as the model's tokenizer builds it, special tokens included, before truncation
        (:func:`iter_segments` counts it; 0 for a segment made by hand). Not part of equality.
    encoded, encoded_length: the segment as the model reads it, cut to ``encoded_length`` tokens (an
        unpadded :class:`~bertology.corpus.encoding.EncodedRow`), where the encoded-corpus cache or its
        reader made it (:func:`bertology.corpus.cache.read_segments`), else ``None``. Not part of equality.
    """

    text_a: str | list[str]
    text_b: str | list[str] | None
    origin: str
    tokens: int = field(default=0, compare=False)
    encoded: Any = field(default=None, compare=False, repr=False)
    encoded_length: int | None = field(default=None, compare=False, repr=False)

    @property
    def is_pair(self) -> bool:
        return self.text_b is not None


def sample_corpus() -> Path:
    """The small sample corpus shipped with bertology: 85 paragraphs of encyclopedic English in 12
    documents, plain text (61 segments of at most 128 tokens with the default model); see
    ``bertology/data/README.md``."""
    return Path(str(files("bertology").joinpath("data", "sample_corpus.txt")))


def detect_format(path: str | Path, format: str | None = None) -> str:
    """``format`` if given (checked), else the format implied by the file extension: ``.jsonl``, a
    treebank's (``.conllu``, ``.conll``, ...: ``"conllu"``), anything else plain text; the one format
    detection of every corpus command.

    Raises:
        BertologyError: an unknown format name, or a table (``.tsv``, ``.csv``, such as a GLUE task's file)
            without a format: read as plain text, its header and label column would become text.
    """
    if format is None:
        suffix = Path(path).suffix.lower()
        if suffix in _TABLES:
            raise BertologyError(
                f"{path} is {_TABLES[suffix]}, not a corpus; give plain text (a paragraph per line), "
                ".jsonl or .conllu, or --format text to read each of its lines as a paragraph."
            )
        return _EXTENSIONS.get(suffix, "text")
    if format not in FORMATS:
        raise BertologyError(f"Unknown corpus format '{format}'; use one of: {', '.join(FORMATS)}.")
    return format


def iter_segments(
    path: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    *,
    max_length: int = 128,
    format: str | None = None,
    pairs: bool = True,
) -> Iterator[Segment]:
    """Stream the segments of the corpus at ``path`` (see the module docstring for how they are built).

    tokenizer: the model's fast tokenizer, used to count tokens the way the encoder will.
    max_length: token limit of one segment, special tokens included.
    format: ``"text"``, ``"jsonl"`` or ``"conllu"``; by default from the extension (``.jsonl``,
        ``.conllu``, anything else is text).
    pairs: split packed runs into text A and text B (encoders); ``False`` keeps each run one text (a
        decoder's input; a JSONL ``text_b`` is then refused).

    The path and format are checked at once; problems inside the file surface while iterating, after
    the segments before them have been produced.

    Raises:
        BertologyError: no such file or not a regular file, an unknown format, a ``max_length`` too small
            for any text, and while iterating: a line that is not UTF-8, malformed JSON or CoNLL-U (naming
            the line), or a corpus without any text.
    """
    path = Path(path)
    chosen = check_corpus(path, tokenizer, max_length=max_length, format=format)
    return require_text(span_segments(path, chosen, tokenizer, max_length, pairs), path)


def check_corpus(
    path: Path, tokenizer: PreTrainedTokenizerFast, *, max_length: int, format: str | None = None
) -> str:
    """Check what :func:`iter_segments` checks before reading (the path, the format, room for text in
    ``max_length`` tokens) and return the format chosen.

    Raises:
        BertologyError: no such file or not a regular file, an unknown format, a ``max_length`` too small
            for any text.
    """
    chosen = detect_format(path, format)
    if problem := file_problem(path):
        raise BertologyError(f"The corpus file '{path}' {problem}.")
    special = tokenizer.num_special_tokens_to_add(pair=False)
    if max_length <= special:
        raise BertologyError(
            f"max_length {max_length} leaves no room for text besides the {special} special tokens."
        )
    return chosen


def span_segments(
    path: Path,
    format: str,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    pairs: bool,
    span: ByteSpan | None = None,
    counter: Tokenizer | None = None,
) -> Iterator[Segment]:
    """The segments of the corpus file ``path`` in ``format``, of its ``span`` only if given (a run of whole
    documents, :func:`~bertology.corpus.readers.spans.document_spans`: the same segments as the whole file
    gives there); unchecked (:func:`iter_segments` checks the file and settings first).

    counter: :func:`counting_tokenizer` of ``tokenizer``, made once by a caller that reads many spans in one
    thread (``None``: made here)."""
    packer = _Packer(tokenizer, max_length, path, pairs=pairs, counter=counter)
    if format == "jsonl":
        for record in read_records(path, span):
            if record.text_b is not None and not pairs:
                raise BertologyError(
                    f"{_origin(path, record.line, record.line)} has a text_b, but this model reads one text."
                )
            tokens = packer.tokens(record.text, record.text_b, special=True)
            yield Segment(record.text, record.text_b, _origin(path, record.line, record.line), tokens)
        return
    passages = read_paragraphs(path, span) if format == "text" else read_passages(path, span)
    for _, document in groupby(passages, key=attrgetter("document")):
        yield from packer.pack(document)


def require_text(segments: Iterator[Segment], path: Path) -> Iterator[Segment]:
    """Pass ``segments`` (of the corpus file ``path``) through; raise at the end if there were none.

    Raises:
        BertologyError: the corpus gave no segment.
    """
    empty = True
    for segment in segments:
        empty = False
        yield segment
    if empty:
        raise BertologyError(f"The corpus {path.name} contains no text.")


def _origin(path: Path, first_line: int, last_line: int) -> str:
    lines = str(first_line) if first_line == last_line else f"{first_line}-{last_line}"
    return f"{path.name}:{lines}"


def _as_string(text: str | Sequence[str] | None) -> str | None:
    """The text the encoder tokenizes: a word list is joined with single spaces."""
    return text if text is None or isinstance(text, str) else " ".join(text)


def _join(passages: Sequence[Passage]) -> str | list[str]:
    """Consecutive passages as one text: paragraphs joined by a space, or word lists concatenated."""
    if isinstance(passages[0].text, str):
        return " ".join(passage.text for passage in passages)
    return [word for passage in passages for word in passage.text]


def counting_tokenizer(tokenizer: PreTrainedTokenizerFast) -> Tokenizer:
    """A copy of ``tokenizer``'s Rust tokenizer that never truncates or pads, for counting tokens: called
    directly it takes half the time of the Python wrapper, counting never changes the wrapper's settings,
    and a reader thread may count with it while the model's own tokenizer encodes."""
    counter = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    counter.no_truncation()
    counter.no_padding()
    return counter


def _balanced_split(counts: Sequence[int]) -> int:
    """Number of leading passages in text A: the boundary whose two token totals are closest
    (the earliest on a tie); 1 for a single passage."""
    total, before = sum(counts), list(accumulate(counts))
    return min(range(1, len(counts)), key=lambda boundary: abs(total - 2 * before[boundary - 1]), default=1)


class _Packer:
    """Greedy packing of one document's passages into segments that fit ``max_length`` tokens.

    Tokens are counted with a copy of the model's Rust tokenizer (the same normalisation, splitting and
    special tokens) that never truncates or pads, called directly: half the time of the Python wrapper,
    and counting never changes the wrapper's own settings. With WordPiece's pre-tokenizer, which splits
    at every space and whose normaliser works character by character, no token spans two space-joined
    passages, so a candidate segment's count is the sum of its passages' counts plus the special tokens;
    other tokenizers (byte-level BPE, SentencePiece) tokenize each candidate whole. Either way each
    segment comes out with its exact count (:attr:`Segment.tokens`).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        max_length: int,
        path: Path,
        *,
        pairs: bool = True,
        counter: Tokenizer | None = None,
    ) -> None:
        self.counter = counter or counting_tokenizer(tokenizer)
        processor = self.counter.post_processor
        self.additive = isinstance(self.counter.pre_tokenizer, BertPreTokenizer) and processor is not None
        self.special = {
            pair: processor.num_special_tokens_to_add(pair) if processor else 0 for pair in (False, True)
        }
        self.max_length = max_length
        self.path = path
        self.pairs = pairs

    def tokens(self, text: str | list[str], text_b: str | list[str] | None = None, *, special: bool) -> int:
        """Token count of a text or pair as the encoder tokenizes it, without truncation."""
        return len(self.counter.encode(_as_string(text), _as_string(text_b), add_special_tokens=special).ids)

    def _segment(self, run: Sequence[Passage], counts: Sequence[int], tokens: int) -> Segment:
        """The run of passages as a segment of ``tokens`` tokens, split into A and B by
        :func:`_balanced_split` (kept whole without :attr:`pairs`)."""
        split = _balanced_split(counts) if self.pairs else len(run)
        text_b = _join(run[split:]) if split < len(run) else None
        origin = _origin(self.path, run[0].first_line, run[-1].last_line)
        return Segment(_join(run[:split]), text_b, origin, tokens)

    def _run_tokens(self, run: Sequence[Passage], counts: Sequence[int]) -> int:
        """Tokens of the run of passages as one segment, special tokens included."""
        if self.additive or len(run) == 1:
            return sum(counts) + self.special[self.pairs and len(run) > 1]
        segment = self._segment(run, counts, 0)
        return self.tokens(segment.text_a, segment.text_b, special=True)

    def counted(self, passages: Iterable[Passage]) -> Iterator[tuple[Passage, int]]:
        """Each passage with its token count (no special tokens), counted by one call of the Rust tokenizer
        (which spreads a batch over the cores) per :data:`COUNT_BATCH` passages or :data:`COUNT_CHARACTERS`
        characters, whichever comes first (a huge passage is counted alone, not read ahead of)."""
        chunk: list[str] = []
        held: list[Passage] = []
        characters = 0
        for passage in passages:
            held.append(passage)
            chunk.append(_as_string(passage.text) or "")
            characters += len(chunk[-1])
            if len(held) == COUNT_BATCH or characters >= COUNT_CHARACTERS:
                yield from self._count(held, chunk)
                chunk, held, characters = [], [], 0
        yield from self._count(held, chunk)

    def _count(self, passages: list[Passage], texts: list[str]) -> Iterator[tuple[Passage, int]]:
        # the "fast" batch skips the character offsets, which a count does not need (a quarter less time)
        encodings = self.counter.encode_batch_fast(texts, add_special_tokens=False) if texts else []
        return zip(passages, (len(encoding.ids) for encoding in encodings), strict=True)

    def pack(self, document: Iterable[Passage]) -> Iterator[Segment]:
        """Segments of one document, in order; every passage lands in exactly one segment."""
        run: list[Passage] = []
        counts: list[int] = []
        run_tokens = 0
        for passage, count in self.counted(document):
            tokens = self._run_tokens([*run, passage], [*counts, count])
            if run and tokens > self.max_length:
                yield self._segment(run, counts, run_tokens)
                run, counts = [], []
                tokens = self._run_tokens([passage], [count])
            run.append(passage)
            counts.append(count)
            run_tokens = tokens
        if run:
            yield self._segment(run, counts, run_tokens)
