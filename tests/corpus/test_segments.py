"""Corpus segments: Clark-style pairing and packing, the three formats, errors, streaming."""

from __future__ import annotations

import io
import itertools
import json
import re
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conllu
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import bertology.corpus.readers.text
import bertology.corpus.segments
from bertology.corpus.batching import prefetched
from bertology.corpus.readers.treebank import read_passages, read_treebank
from bertology.corpus.segments import Segment, detect_format, iter_segments, sample_corpus
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel

EXAMPLE_CORPUS = sample_corpus()


@pytest.fixture(scope="module")
def tokenizer(default_model: LoadedModel) -> PreTrainedTokenizerFast:
    return default_model.tokenizer


def _write(directory: Path, name: str, content: str | bytes) -> Path:
    path = directory / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    return path


def _paragraph(word: str, count: int) -> str:
    """``count`` copies of a word the uncased WordPiece vocabulary holds whole: exactly ``count`` tokens."""
    return " ".join([word] * count)


def _length(tokenizer: PreTrainedTokenizerFast, segment: Segment) -> int:
    """Tokens of the segment as the encoder builds it (special tokens included, no truncation)."""

    def as_string(text: str | list[str] | None) -> str | None:
        return text if text is None or isinstance(text, str) else " ".join(text)

    encoded = tokenizer(as_string(segment.text_a), as_string(segment.text_b), verbose=False)
    return len(encoded["input_ids"])


def _lines(origin: str) -> tuple[int, int]:
    first, _, last = origin.rpartition(":")[2].partition("-")
    return int(first), int(last or first)


def test_the_test_paragraphs_have_exactly_the_intended_token_counts(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    for word in ("cat", "dog", "bird", "fish", "cow", "hen"):
        assert len(tokenizer(_paragraph(word, 7), add_special_tokens=False)["input_ids"]) == 7
    assert tokenizer.num_special_tokens_to_add(pair=True) == 3


# --- Plain text: pairing, documents, packing, over-long paragraphs, origins ---------------------


def test_consecutive_paragraphs_pair_up_and_documents_are_never_crossed(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    cat, dog, bird = _paragraph("cat", 4), _paragraph("dog", 4), _paragraph("bird", 4)
    # lines: 1 blank, 2 cat, 3 dog, 4 blank, 5 whitespace only, 6 bird, 7 blank
    path = _write(tmp_path, "c.txt", f"\n{cat}\n  {dog}  \n\n \t \n{bird}\n\n")
    assert list(iter_segments(path, tokenizer)) == [
        Segment(cat, dog, "c.txt:2-3"),
        Segment(bird, None, "c.txt:6"),
    ]


@pytest.mark.parametrize(
    ("max_length", "expected_runs"),
    [
        (18, [(1, 3), (4, 5)]),  # 5 + 5 + 5 tokens + 3 special = 18 fits exactly
        (17, [(1, 2), (3, 4), (5, 5)]),  # three paragraphs need 18 > 17
        (128, [(1, 5)]),
    ],
)
def test_consecutive_paragraphs_are_packed_up_to_the_limit(
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int,
    expected_runs: list[tuple[int, int]],
) -> None:
    paragraphs = [_paragraph(word, 5) for word in ("cat", "dog", "bird", "fish", "cow")]
    path = _write(tmp_path, "p.txt", "\n".join(paragraphs) + "\n")
    segments = list(iter_segments(path, tokenizer, max_length=max_length))
    assert [_lines(segment.origin) for segment in segments] == expected_runs
    for segment, (first, last) in zip(segments, expected_runs, strict=True):
        run = paragraphs[first - 1 : last]
        joined = segment.text_a if segment.text_b is None else f"{segment.text_a} {segment.text_b}"
        assert joined == " ".join(run)
        assert _length(tokenizer, segment) <= max_length
        if last < len(paragraphs):  # greedy: the next paragraph would not have fitted
            assert 5 * (last - first + 2) + 3 > max_length


@pytest.mark.parametrize(
    ("counts", "in_a"),
    [((3, 3, 10), 2), ((10, 3, 3), 1), ((4, 4, 4, 4), 2), ((5, 5, 5), 1), ((2, 9), 1)],
)
def test_a_packed_run_splits_where_a_and_b_are_closest_in_length(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, counts: tuple[int, ...], in_a: int
) -> None:
    words = ("cat", "dog", "bird", "fish")
    paragraphs = [_paragraph(word, count) for word, count in zip(words, counts, strict=False)]
    path = _write(tmp_path, "s.txt", "\n".join(paragraphs))
    (segment,) = iter_segments(path, tokenizer)
    assert segment == Segment(
        " ".join(paragraphs[:in_a]), " ".join(paragraphs[in_a:]), f"s.txt:1-{len(paragraphs)}"
    )


def test_an_over_long_paragraph_is_text_a_alone(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    short, long = _paragraph("cat", 5), _paragraph("dog", 200)
    after_a, after_b = _paragraph("bird", 5), _paragraph("fish", 5)
    path = _write(tmp_path, "long.txt", f"{short}\n{long}\n{after_a}\n{after_b}\n")
    segments = list(iter_segments(path, tokenizer, max_length=32))
    assert segments == [
        Segment(short, None, "long.txt:1"),
        Segment(long, None, "long.txt:2"),
        Segment(after_a, after_b, "long.txt:3-4"),
    ]
    assert _length(tokenizer, segments[1]) == 202


def test_crlf_line_endings_and_a_byte_order_mark(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = _write(tmp_path, "win.txt", "\ufeffFirst paragraph.\r\nSecond one.\r\n\r\nThird.\r\n")
    assert list(iter_segments(path, tokenizer)) == [
        Segment("First paragraph.", "Second one.", "win.txt:1-2"),
        Segment("Third.", None, "win.txt:4"),
    ]


@pytest.mark.parametrize("max_length", [128, 48])
def test_the_demo_corpus_fits_is_fully_covered_and_packed(
    tokenizer: PreTrainedTokenizerFast, max_length: int
) -> None:
    lines = EXAMPLE_CORPUS.read_text(encoding="utf-8").split("\n")
    counts = {
        number: len(tokenizer(line, add_special_tokens=False)["input_ids"])
        for number, line in enumerate(lines, start=1)
        if line.strip()
    }
    segments = list(iter_segments(EXAMPLE_CORPUS, tokenizer, max_length=max_length))
    covered = [" ".join(filter(None, (s.text_a, s.text_b))) for s in segments]
    assert " ".join(covered) == " ".join(line.strip() for line in lines if line.strip())
    for segment, following in itertools.zip_longest(segments, segments[1:]):
        first, last = _lines(segment.origin)
        assert all(lines[n - 1].strip() for n in range(first, last + 1)), "crossed a document"
        if _length(tokenizer, segment) > max_length:
            assert segment.text_b is None and first == last, segment.origin
        if following is not None and _lines(following.origin)[0] == last + 1:
            packed = sum(counts[n] for n in range(first, last + 2))
            assert packed + 3 > max_length, f"{segment.origin} could have taken line {last + 1}"
    if max_length == 128:
        assert len(segments) >= 60, "the demo corpus should give 60+ segments at 128 tokens"


@pytest.mark.parametrize("architecture", ["default", "roberta", "albert"])
def test_every_segment_carries_its_exact_token_count(
    architecture: str,
    tokenizer: PreTrainedTokenizerFast,
    tiny_model_dirs: dict[str, Path],
    tmp_path: Path,
    ewt_dev: Path,
) -> None:
    """Segment.tokens (which orders the analysis batches) equals the encoder's own count, special
    tokens included and before truncation: summed passage counts for WordPiece, whole candidates for
    byte-level BPE and SentencePiece; for plain text, CoNLL-U and JSONL."""
    if architecture != "default":
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs[architecture])
    records = [{"text": "A single text."}, {"text": "Premise here.", "text_b": "And a hypothesis."}]
    jsonl = _write(tmp_path, "in.jsonl", "\n".join(json.dumps(record) for record in records) + "\n")
    pairs = cut = 0
    for corpus, max_length in ((EXAMPLE_CORPUS, 128), (EXAMPLE_CORPUS, 40), (ewt_dev, 64), (jsonl, 128)):
        segments = list(itertools.islice(iter_segments(corpus, tokenizer, max_length=max_length), 300))
        assert [segment.tokens for segment in segments] == [_length(tokenizer, s) for s in segments]
        pairs += sum(segment.is_pair for segment in segments)
        cut += sum(segment.tokens > max_length for segment in segments)
    assert pairs > 20 and cut > 0  # pairs and over-long single passages are both counted


# --- JSONL ----------------------------------------------------------------------------------


def test_jsonl_lines_are_segments_as_given(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    long = _paragraph("dog", 300)
    rows = [{"text": "A single text."}, None, {"text": "Premise.", "text_b": "Hypothesis."}]
    rows += [{"text": "No pair.", "text_b": None, "label": 1}, {"text": long}, {"text": "Next."}]
    content = "\n".join("" if row is None else json.dumps(row) for row in rows)
    path = _write(tmp_path, "in.jsonl", content)
    assert list(iter_segments(path, tokenizer, max_length=16)) == [
        Segment("A single text.", None, "in.jsonl:1"),
        Segment("Premise.", "Hypothesis.", "in.jsonl:3"),
        Segment("No pair.", None, "in.jsonl:4"),
        Segment(long, None, "in.jsonl:5"),
        Segment("Next.", None, "in.jsonl:6"),
    ]


# --- Format selection -------------------------------------------------------------------------


def test_format_comes_from_the_extension_unless_given(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    assert detect_format("a.JSONL") == "jsonl"
    assert detect_format("b.conllu") == "conllu"
    assert detect_format("c.txt") == detect_format("README") == "text"
    assert detect_format("e.conll") == detect_format("f.CONLLX") == "conllu"  # treebanks, as index reads them
    assert detect_format("a.jsonl", "text") == detect_format("d.tsv", "text") == "text"
    with pytest.raises(BertologyError) as raised:
        detect_format("glue/SST-2/dev.tsv")
    assert str(raised.value) == (
        "glue/SST-2/dev.tsv is a tab-separated table, not a corpus; give plain text (a paragraph per line), "
        ".jsonl or .conllu, or --format text to read each of its lines as a paragraph."
    )
    path = _write(tmp_path, "records.txt", '{"text": "Hello there."}\n')
    assert list(iter_segments(path, tokenizer, format="jsonl")) == [
        Segment("Hello there.", None, "records.txt:1")
    ]
    assert list(iter_segments(path, tokenizer)) == [
        Segment('{"text": "Hello there."}', None, "records.txt:1")
    ]


# --- CoNLL-U ----------------------------------------------------------------------------------

SMALL_CONLLU = """\
# newdoc id = one
# sent_id = 1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = 2
1\tSleep\tsleep\tVERB\tVB\t_\t0\troot\t_\t_
1.1\tyou\tyou\tPRON\tPRP\t_\t_\t_\t1:nsubj\t_
2\twell\twell\tADV\tRB\t_\t1\tadvmod\t_\t_

# newdoc
# sent_id = 3
1\tBye\tbye\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_conllu_words_skip_ranges_and_empty_nodes_and_newdoc_splits(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    path = _write(tmp_path, "small.conllu", SMALL_CONLLU)
    assert list(iter_segments(path, tokenizer)) == [
        Segment(["I", "do", "n't", "know", "."], ["Sleep", "well"], "small.conllu:1-14"),
        Segment(["Bye"], None, "small.conllu:16-18"),
    ]


@dataclass
class _Sentence:
    first_line: int
    last_line: int
    words: list[str]
    new_document: bool


def _count_sentences(path: Path) -> Iterator[_Sentence]:
    """An independent reading of a CoNLL-U file: blocks, integer-ID word lines, ``# newdoc``."""
    sentence: _Sentence | None = None
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                if sentence is not None:
                    yield sentence
                sentence = None
                continue
            if sentence is None:
                sentence = _Sentence(number, number, [], False)
            sentence.last_line = number
            sentence.new_document |= line.startswith("# newdoc")
            columns = line.split("\t")
            if re.fullmatch(r"\d+", columns[0]):
                sentence.words.append(columns[1])
    if sentence is not None:
        yield sentence


@pytest.mark.parametrize("max_length", [128, 40])
def test_conllu_real_treebank_consumes_every_sentence_once(
    tokenizer: PreTrainedTokenizerFast, max_length: int, ewt_dev: Path
) -> None:
    sentences = list(_count_sentences(ewt_dev))
    assert len(sentences) == 2001  # the count the data README gives for dev
    starts = {sentence.first_line: index for index, sentence in enumerate(sentences)}
    ends = {sentence.last_line: index for index, sentence in enumerate(sentences)}
    segments = list(iter_segments(ewt_dev, tokenizer, max_length=max_length))
    consumed = 0
    for segment in segments:
        first, last = _lines(segment.origin)
        assert first in starts and last in ends and starts[first] == consumed
        run = sentences[starts[first] : ends[last] + 1]
        consumed += len(run)
        assert not any(sentence.new_document for sentence in run[1:]), f"{segment.origin} crosses a newdoc"
        boundaries = list(itertools.accumulate(len(sentence.words) for sentence in run))
        assert len(segment.text_a) in boundaries  # A and B split between sentences
        assert segment.text_a + (segment.text_b or []) == [word for s in run for word in s.words]
        if _length(tokenizer, segment) > max_length:
            assert segment.text_b is None and len(run) == 1, segment.origin
    assert consumed == len(sentences)
    words = sum(len(s.text_a) + len(s.text_b or []) for s in segments)
    assert words == sum(len(sentence.words) for sentence in sentences)


@pytest.mark.parametrize("corpus_name", ["sample", "ewt-dev"])
def test_wordpiece_packing_by_summed_counts_equals_tokenizing_each_candidate(
    corpus_name: str, tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch, shared_data: Path
) -> None:
    """For WordPiece the packer adds passage counts; tokenizing every candidate whole (what it does for
    other tokenizers) must give the same segments."""
    corpus = EXAMPLE_CORPUS if corpus_name == "sample" else shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"
    summed = list(iter_segments(corpus, tokenizer, max_length=128))
    monkeypatch.setattr(bertology.corpus.segments, "BertPreTokenizer", type("NotThisPreTokenizer", (), {}))
    whole = list(iter_segments(corpus, tokenizer, max_length=128))
    assert len(summed) > 50 and sum(segment.is_pair for segment in summed) > 20
    assert summed == whole


def test_conllu_first_segments_of_the_training_treebank(
    tokenizer: PreTrainedTokenizerFast, shared_data: Path
) -> None:
    train = shared_data / "ud_ewt" / "en_ewt-ud-train.conllu"
    first_ten = list(itertools.islice(iter_segments(train, tokenizer), 10))
    last_line = _lines(first_ten[-1].origin)[1]
    sentences = list(itertools.takewhile(lambda s: s.last_line <= last_line, _count_sentences(train)))
    assert [w for s in first_ten for w in s.text_a + (s.text_b or [])] == [
        word for sentence in sentences for word in sentence.words
    ]


# --- Errors -----------------------------------------------------------------------------------


def _error(path: Path, tokenizer: PreTrainedTokenizerFast, **options: object) -> str:
    with pytest.raises(BertologyError) as caught:
        list(iter_segments(path, tokenizer, **options))
    message = str(caught.value)
    assert "\n" not in message and message.endswith(".")
    return message


def test_a_missing_file_a_directory_and_an_unknown_format_fail_at_once(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(BertologyError, match=r"The corpus file '.*nowhere\.txt' is missing\."):
        iter_segments(tmp_path / "nowhere.txt", tokenizer)
    with pytest.raises(BertologyError, match="is a directory, not a file"):
        iter_segments(tmp_path, tokenizer)
    path = _write(tmp_path, "ok.txt", "Some text.\n")
    with pytest.raises(BertologyError, match="Unknown corpus format 'xml'; use one of: text, jsonl, conllu"):
        iter_segments(path, tokenizer, format="xml")
    with pytest.raises(BertologyError, match="max_length 2 leaves no room for text"):
        iter_segments(path, tokenizer, max_length=2)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("blank.txt", "\n  \n\n"),
        ("nothing.txt", ""),
        ("empty.jsonl", "\n\n"),
        ("comments.conllu", "# a\n# b\n"),
    ],
)
def test_a_corpus_without_text(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, name: str, content: str
) -> None:
    assert _error(_write(tmp_path, name, content), tokenizer) == f"The corpus {name} contains no text."


@pytest.mark.parametrize(
    ("name", "good_line"),
    [
        ("corpus.txt", b"A fine paragraph.\n"),
        ("corpus.jsonl", b'{"text": "A fine paragraph."}\n'),
        ("corpus.conllu", b"1\tFine\tfine\tADJ\tJJ\t_\t0\troot\t_\t_\n"),
    ],
)
def test_undecodable_bytes_name_the_line(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, name: str, good_line: bytes
) -> None:
    content = good_line * 6 + b"caf\xe9 au lait\n" + good_line
    message = _error(_write(tmp_path, name, content), tokenizer)
    assert message.startswith(f"{name} line 7 is not valid UTF-8 (byte 4 of the line)")


@pytest.mark.parametrize(
    ("limit", "lines_before"),
    # 100: the lines before and the long one all in one 8 KiB read of the buffer; 20,000: a long line
    # over several reads, its length carried from one read to the next
    [(100, 60), (20_000, 2)],
)
def test_a_line_over_the_limit_is_refused_naming_it(tmp_path: Path, limit: int, lines_before: int) -> None:
    from bertology.corpus.readers import read_lines

    path = tmp_path / "lines.txt"
    path.write_bytes((b"x" * limit + b"\n") * lines_before + b"y" * (limit + 1) + b"\nlast\n")
    with pytest.raises(BertologyError) as caught:
        list(read_lines(path, max_line_bytes=limit))
    assert str(caught.value) == (
        f"lines.txt line {lines_before + 1} is longer than {limit:,} bytes, the longest line this file may "
        "have; shorten it."
    )
    path.write_bytes((b"x" * limit + b"\n") * lines_before + b"last")  # lines of the limit itself: read
    assert list(read_lines(path, max_line_bytes=limit))[-2:] == [
        (lines_before, "x" * limit),
        (lines_before + 1, "last"),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"text": "unterminated}', r"bad\.jsonl line 3 is not valid JSON \(Unterminated string"),
        ("[1, 2]", r"bad\.jsonl line 3 is an array, not a JSON object with a 'text' field\."),
        ('{"txt": "typo"}', r"bad\.jsonl line 3 needs a string 'text' field \(it is missing\)\."),
        ('{"text": 5}', r"bad\.jsonl line 3 needs a string 'text' field \(got a number\)\."),
        ('{"text": null}', r"bad\.jsonl line 3 needs a string 'text' field \(got null\)\."),
        (
            '{"text": "a", "text_b": ["b"]}',
            r"bad\.jsonl line 3 needs a string 'text_b' field \(got an array\)\.",
        ),
        ('{"text": "   "}', r"bad\.jsonl line 3 has an empty 'text' field\."),
        ('{"text": "a", "text_b": ""}', r"bad\.jsonl line 3 has an empty 'text_b' field\."),
    ],
)
def test_malformed_jsonl_names_the_line(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, line: str, expected: str
) -> None:
    path = _write(tmp_path, "bad.jsonl", '{"text": "fine"}\n\n' + line + "\n")
    assert re.match(expected, _error(path, tokenizer))


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ("3\tOk\tok\tINTJ\tUH\t_\tabc\troot\t_\t_", "the head 'abc' is not an integer)."),
        ("x\tOk\tok\tINTJ\tUH\t_\t0\troot\t_\t_", "word ID 'x' where 3 was expected)."),
        ("_\tOk\tok\tINTJ\tUH\t_\t0\troot\t_\t_", "word ID '_' where 3 was expected)."),
        ("just some words", "1 tab-separated columns where 10 were expected)."),
        # well formed lines, but not a tree: index and the probes refused these, analyze read them (issue 34)
        ("3\tOk\tok\tINTJ\tUH\t_\t7\tdep\t_\t_", "the head 7 is outside the sentence of 3 words)."),
    ],
)
def test_malformed_conllu_names_the_line(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, bad_line: str, problem: str
) -> None:
    # SMALL_CONLLU's sentence 2 holds lines 11-14; the bad line becomes line 15 of that sentence.
    lines = SMALL_CONLLU.split("\n")
    lines.insert(14, bad_line)
    path = _write(tmp_path, "bad.conllu", "\n".join(lines))
    message = _error(path, tokenizer)
    assert message == f"bad.conllu line 15 is not valid CoNLL-U ({problem}"


# --- Streaming --------------------------------------------------------------------------------


def test_the_first_segments_come_out_before_a_bad_tail_is_read(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    good = "".join(f"Paragraph number {index} of the corpus.\n" for index in range(400))
    path = _write(tmp_path, "tail.txt", good.encode() + b"\xff broken\n")
    first = [_lines(segment.origin) for segment in itertools.islice(iter_segments(path, tokenizer), 3)]
    assert first[0][0] == 1 and first[1][0] == first[0][1] + 1 and first[2][0] == first[1][1] + 1
    assert _error(path, tokenizer).startswith("tail.txt line 401 is not valid UTF-8")


def test_an_endless_corpus_streams(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text reader's line source is swapped for an endless generator: only a lazy pipeline returns."""
    pulled = 0

    def endless_lines(
        path: Path, *, piece_bytes: int | None = None, span: object = None
    ) -> Iterator[tuple[int, str]]:
        nonlocal pulled
        for number in itertools.count(1):
            pulled = number
            yield number, "" if number % 4 == 0 else f"Sentence {number} goes on."

    monkeypatch.setattr(bertology.corpus.readers.text, "read_lines", endless_lines)
    path = _write(tmp_path, "endless.txt", "placeholder\n")
    segments = list(itertools.islice(iter_segments(path, tokenizer), 50))
    assert segments[0] == Segment(
        "Sentence 1 goes on.", "Sentence 2 goes on. Sentence 3 goes on.", "endless.txt:1-3"
    )
    assert segments[-1].origin == "endless.txt:197-199"
    assert pulled == 201  # one line into document 51, which ends document 50


class _CountingFile(io.FileIO):
    """A file that counts the bytes read from it (under the buffer, however the reader asks for them)."""

    bytes_read = 0

    def readinto(self, buffer: Any) -> int | None:
        count = super().readinto(buffer)
        _CountingFile.bytes_read += count or 0
        return count


def test_a_one_line_corpus_streams_in_pieces_and_stops_at_the_limit(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10 MB of words on one line: with a limit of 3 segments only the first few pieces are read, and the
    segments equal those of the same text cut into lines by hand (textwrap: the longest run of whole
    words of at most PIECE_BYTES, as the reader promises)."""
    from bertology.analysis.analyze import corpus_batches
    from bertology.corpus.readers.text import PIECE_BYTES

    words = [f"word{number % 997} is here." for number in range(600_000)]
    text = " ".join(words)
    assert len(text) > 10_000_000
    one_line = tmp_path / "one_line.txt"
    one_line.write_text(text + "\n", encoding="utf-8")
    by_hand = tmp_path / "by_hand.txt"
    by_hand.write_text("\n".join(textwrap.wrap(text[: 8 * PIECE_BYTES], width=PIECE_BYTES)), encoding="utf-8")

    def counting_open(path: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
        assert mode == "rb"
        return io.BufferedReader(_CountingFile(path, "r"))

    monkeypatch.setattr(Path, "open", counting_open)
    batches = corpus_batches(one_line, tokenizer, max_length=128, limit=3, batch_size=8)
    segments = [segment for batch in batches for segment in batch]
    # the 3 pieces, the one looked ahead and the buffer's read-ahead: not the 10 MB
    assert 0 < _CountingFile.bytes_read <= 5 * PIECE_BYTES + io.DEFAULT_BUFFER_SIZE
    monkeypatch.undo()
    expected = list(itertools.islice(iter_segments(by_hand, tokenizer, max_length=128), 3))
    key = sorted((segment.text_a, segment.text_b, segment.tokens) for segment in segments)
    assert key == sorted((segment.text_a, segment.text_b, segment.tokens) for segment in expected)
    assert all(segment.origin == "one_line.txt:1" for segment in segments)
    assert all(len(str(segment.text_a).encode()) <= PIECE_BYTES for segment in segments)


@pytest.mark.parametrize("name", ["en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"])
def test_conllu_sentences_equal_the_conllu_packages_parse_of_ud_ewt(shared_data: Path, name: str) -> None:
    """The sentences read by splitting lines (and by the ``conllu`` package only where a line is not
    plain) equal the ``conllu`` package's own parse of the whole file: the words (ranges and empty nodes
    left out) and the documents (``# newdoc``)."""
    path = shared_data / "ud_ewt" / name
    read = list(read_passages(path))
    expected, document = [], 0
    with path.open(encoding="utf-8") as handle:
        for sentence in conllu.parse_incr(handle):
            document += any(key.split(" ")[0] == "newdoc" for key in sentence.metadata)
            words = [token["form"] for token in sentence if isinstance(token["id"], int)]
            if words:
                expected.append((words, document))
    assert [(passage.text, passage.document) for passage in read] == expected
    assert len(expected) > 2000 and expected[-1][1] > 100  # many sentences in many documents


def test_a_line_with_spaces_for_tabs_is_refused_as_index_and_the_probes_refuse_it(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast
) -> None:
    """Runs of spaces between a line's columns, which the ``conllu`` package would split at: the corpus
    reader refuses the line as the treebank reader does (one check for every corpus command)."""
    spaced = SMALL_CONLLU.replace("1\tSleep\tsleep\t", "1  Sleep  sleep  ", 1)
    assert spaced != SMALL_CONLLU
    path = _write(tmp_path, "spaced.conllu", spaced)
    expected = "spaced.conllu line 12 is not valid CoNLL-U (7 tab-separated columns where 10 were expected)."
    assert _error(path, tokenizer) == expected
    with pytest.raises(BertologyError) as raised:
        list(read_treebank(path))
    assert str(raised.value) == expected


def test_prefetched_keeps_the_order_raises_in_place_and_stops_when_closed() -> None:
    assert list(prefetched(iter(range(100)), depth=3)) == list(range(100))

    def failing() -> Iterator[int]:
        yield from range(5)
        raise BertologyError("line 6 is bad")

    seen: list[int] = []
    with pytest.raises(BertologyError, match="line 6 is bad"):
        seen.extend(prefetched(failing(), depth=2))
    assert seen == [0, 1, 2, 3, 4]

    made: list[int] = []
    closed = threading.Event()

    def endless() -> Iterator[int]:
        try:
            for number in itertools.count():
                made.append(number)
                yield number
        finally:
            closed.set()

    stream = prefetched(endless(), depth=2)
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert closed.wait(5)  # the producer stopped and closed its generator
    assert len(made) <= 3 + 2 + 2  # what was taken, the queue and the item in hand: not an endless read
