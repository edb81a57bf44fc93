"""Reading a corpus in reader processes: the file is cut into spans of whole documents, and any number of
readers gives the segments, encodings and output files of one; a reader's error reaches the user as one
sentence naming the file and line; a reader that dies, and Ctrl-C, stop the run and its readers."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_in_process
from transformers import PreTrainedTokenizerFast

import bertology.corpus.reader_processes
import bertology.corpus.readers.spans
from bertology.corpus.reader_processes import SpanReading, default_readers, read_encoded
from bertology.corpus.readers import ByteSpan, read_lines
from bertology.corpus.readers.spans import document_spans
from bertology.corpus.segments import Segment, sample_corpus
from bertology.errors import BertologyError
from bertology.index.token_index import TokenIndex
from bertology.models.loading import LoadedModel


@pytest.fixture(scope="module")
def tokenizer(default_model: LoadedModel) -> PreTrainedTokenizerFast:
    return default_model.tokenizer


@pytest.fixture
def small_spans(monkeypatch: pytest.MonkeyPatch) -> int:
    """Spans of about 2 KB, so a small corpus gives the readers several each."""
    monkeypatch.setattr(bertology.corpus.readers.spans, "SPAN_BYTES", 2048)
    return 2048


def _spans_read_whole(path: Path, format: str, span_bytes: int) -> list[ByteSpan]:
    spans = list(document_spans(path, format, span_bytes))
    data = path.read_bytes()
    assert spans[0].start == 0 and spans[-1].end is None
    for before, after in itertools.pairwise(spans):
        assert before.end == after.start  # every byte once, in order
        assert before.end is not None and before.end - before.start >= span_bytes
    for span in spans:  # the first line number: the file's newlines before the span, counted here
        assert span.first_line == data[: span.start].count(b"\n") + 1
    return spans


def test_text_spans_begin_after_a_blank_line(tmp_path: Path) -> None:
    """Known answer: documents of 3 lines of 10 bytes ('aaaaaaaaa\\n'), blank lines between (one holds
    spaces and a tab); spans of at least 25 bytes end after the first blank line that far in."""
    lines = ["aaaaaaaaa\n"] * 3 + ["\n"] + ["bbbbbbbbb\n"] * 3 + [" \t \n"] + ["ccccccccc\n"] * 3
    path = tmp_path / "docs.txt"
    path.write_text("".join(lines), encoding="utf-8")
    spans = _spans_read_whole(path, "text", 25)
    assert [(span.start, span.end, span.first_line) for span in spans] == [
        (0, 31, 1),
        (31, 65, 5),
        (65, None, 9),
    ]
    text = path.read_text(encoding="utf-8")
    assert text[31:].startswith("bbb") and text[65:].startswith("ccc")


def test_conllu_spans_begin_at_a_new_document(ewt_dev: Path) -> None:
    """EWT dev cut into spans of 64 KB: each span after the first opens with a '# newdoc' comment."""
    spans = _spans_read_whole(ewt_dev, "conllu", 65_536)
    assert len(spans) >= 20
    with ewt_dev.open("rb") as handle:
        for span in spans[1:]:
            handle.seek(span.start)
            assert handle.readline().startswith(b"# newdoc")


def test_jsonl_spans_cut_at_lines(tmp_path: Path) -> None:
    path = tmp_path / "inputs.jsonl"
    path.write_text("".join(json.dumps({"text": f"line {n}"}) + "\n" for n in range(100)), encoding="utf-8")
    spans = _spans_read_whole(path, "jsonl", 200)
    assert len(spans) > 5
    assert all(path.read_bytes()[span.start - 1 : span.start] == b"\n" for span in spans[1:])


def test_a_span_reads_the_lines_of_the_whole_file_there(tmp_path: Path) -> None:
    """A byte order mark, CRLF endings and a long line: the lines of each span, with their numbers, are
    the whole file's lines there."""
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"\xef\xbb\xbffirst\r\nsecond\r\n\r\n" + b"word " * 30_000 + b"\n\nlast one\n")
    whole = list(read_lines(path, piece_bytes=4096))
    pieces = [
        line
        for span in document_spans(path, "text", 8)
        for line in read_lines(path, piece_bytes=4096, span=span)
    ]
    assert pieces == whole and whole[0] == (1, "first")


def _assert_same(got: list[Segment], expected: list[Segment]) -> None:
    assert got == expected
    assert [(s.origin, s.tokens) for s in got] == [(s.origin, s.tokens) for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.encoded.tokens == b.encoded.tokens and a.encoded.words == b.encoded.words
        assert np.array_equal(a.encoded.word_ids, b.encoded.word_ids)
        for name, values in b.encoded.features.items():
            assert np.array_equal(a.encoded.features[name], values)


@pytest.mark.parametrize("kind", ["conllu", "text", "jsonl"])
def test_any_number_of_readers_gives_the_segments_of_one(
    kind: str, tokenizer: PreTrainedTokenizerFast, ewt_dev: Path, tmp_path: Path, small_spans: int
) -> None:
    """EWT dev (CoNLL-U, a third of it), the sample corpus (plain text) and a JSON Lines file, read by 1,
    2 and 3 processes in spans of 2 KB: the same segments, origins, counts and encodings."""
    if kind == "conllu":
        path = tmp_path / "ewt.conllu"
        path.write_bytes(ewt_dev.read_bytes()[:600_000].rsplit(b"\n\n", 1)[0] + b"\n\n")
    elif kind == "text":
        path = sample_corpus()
    else:
        path = tmp_path / "pairs.jsonl"
        lines = sample_corpus().read_text(encoding="utf-8").split("\n")
        records = [{"text": a, "text_b": b} for a, b in itertools.pairwise(lines) if a and b]
        path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    reading = SpanReading(path, kind, tokenizer, max_length=64, pairs=True, encoded_length=48)
    one = list(read_encoded(reading, 1))
    assert len(list(document_spans(path, kind))) >= 6 and len(one) >= 50
    for readers in (2, 3):
        _assert_same(list(read_encoded(reading, readers)), one)


def test_an_error_in_a_reader_is_one_sentence_naming_the_file_and_line(
    tokenizer: PreTrainedTokenizerFast, tmp_path: Path, small_spans: int
) -> None:
    """The 151st JSON line (past the first spans, inside one) is not JSON: the readers raise the message
    one reader gives, at its place in the stream (every segment before it comes first, those of its own
    span too)."""
    lines = [json.dumps({"text": f"Sentence number {n} of the corpus."}) for n in range(200)]
    lines[150] = '{"text": "unclosed'
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reading = SpanReading(path, "jsonl", tokenizer, max_length=64, pairs=True, encoded_length=None)
    messages, read = [], []
    for readers in (1, 2):
        segments: list[Segment] = []
        with pytest.raises(BertologyError) as raised:
            segments.extend(read_encoded(reading, readers))
        messages.append(str(raised.value))
        read.append(len(segments))
    assert messages[0] == messages[1]
    assert messages[0].startswith("broken.jsonl line 151 is not valid JSON")
    assert read == [150, 150]


def _die(span: ByteSpan) -> None:
    os._exit(3)


def test_a_reader_that_dies_is_reported_naming_the_file(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch, small_spans: int
) -> None:
    monkeypatch.setattr(bertology.corpus.reader_processes, "_read_span", _die)
    reading = SpanReading(sample_corpus(), "text", tokenizer, max_length=64, pairs=True, encoded_length=None)
    with pytest.raises(BertologyError, match=r"A reader process stopped while reading sample_corpus\.txt"):
        list(read_encoded(reading, 2))


def test_readers_by_default_one_on_a_cpu() -> None:
    assert default_readers("cpu") == 1
    assert default_readers("cuda:0") == max(1, len(os.sched_getaffinity(0)) - 1)


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.mark.slow
def test_analyze_with_1_2_or_3_readers_writes_the_same_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], small_spans: int, tiny_model_dirs: dict[str, Path]
) -> None:
    """`bertology analyze --readers N --no-cache` on 6 KB of the sample corpus (spans of 2 KB): every
    output file the same byte for byte, but for the run's seconds in the summary and the report. The tiny
    BERT (the default model's tokenizer, 3 layers x 4 heads) reads the segments: the readers cut and
    encode them whatever the model, at a small part of the default model's passes and report."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sample_corpus().read_text(encoding="utf-8")[:6000], encoding="utf-8")
    written = []
    model = ["-m", str(tiny_model_dirs["bert"]), "--max-len", "64"]  # the tiny model's limit
    for readers in (1, 2, 3):
        output = tmp_path / f"out{readers}"
        code, err = run_in_process(
            ["analyze", str(corpus), *model, "--readers", str(readers), "--no-cache", "-o", str(output)],
            capsys,
        )
        assert code == 0, err
        files = _files(output)
        files["summary.json"] = re.sub(rb'"seconds": [0-9.]+', b"", files["summary.json"])
        files["report.html"] = re.sub(rb"<dt>seconds</dt><dd>[0-9.]+</dd>", b"", files["report.html"])
        written.append(files)
    assert "heads.csv" in written[0] and "head_examples.npz" in written[0]
    assert written[1] == written[0] and written[2] == written[0]


@pytest.mark.slow
def test_index_with_1_2_or_3_readers_holds_the_same_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], small_spans: int
) -> None:
    """`bertology index --readers N --no-cache` on 6 KB of the sample corpus: the same segments, tables and
    tokenizer files byte for byte, and the same vector for every token at every layer (the HNSW graphs
    themselves differ from build to build whatever the readers: their threads add in any order)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sample_corpus().read_text(encoding="utf-8")[:6000], encoding="utf-8")
    builds = []
    for readers in (1, 2, 3):
        output = tmp_path / f"index{readers}"
        code, err = run_in_process(
            ["index", str(corpus), "--readers", str(readers), "--no-cache", "-o", str(output)], capsys
        )
        assert code == 0, err
        index = TokenIndex.open(output)
        (generation,) = [path for path in output.iterdir() if path.is_dir()]
        files = {name: data for name, data in _files(generation).items() if not name.endswith(".usearch")}
        rows = np.arange(len(index))
        builds.append((files, {layer: index.vectors(rows, layer) for layer in index.layers}))
    assert "segments.jsonl" in builds[0][0] and len(builds[0][1]) == 3
    for files, vectors in builds[1:]:
        assert files == builds[0][0]
        assert all(np.array_equal(vectors[layer], builds[0][1][layer]) for layer in vectors)


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started, from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")
def test_ctrl_c_stops_the_readers(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while `bertology analyze --readers 2`
    reads (8 MB of text: the readers wait for the model with spans in hand): exit code 130, and both reader
    processes are gone. The signal comes as soon as both readers exist, maybe before they ignore Ctrl-C (a
    reader stopped by it there broke the pool, whose stopping then waited forever on the other one)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sample_corpus().read_text(encoding="utf-8") * 320, encoding="utf-8")  # 8 spans
    command = [sys.executable, "-m", "bertology", "analyze", str(corpus), "--readers", "2", "--no-cache"]
    with subprocess.Popen(
        [*command, "-o", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as run:
        deadline = time.monotonic() + 240
        readers: set[int] = set()
        while len(readers) < 2 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            readers = _children(run.pid)
        if len(readers) < 2:
            run.kill()
            pytest.fail(f"no reader processes while the run went on: {run.communicate(timeout=60)[1]}")
        os.killpg(run.pid, signal.SIGINT)
        try:
            _, stderr = run.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            pytest.fail(f"the run did not stop within 120 s of Ctrl-C: {run.communicate(timeout=60)[1]}")
    assert run.returncode == 130, stderr
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in readers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in readers)


#: Reads argv[1] with 2 reader processes and the tokenizer of the model folder argv[2] in spans of 2 KB,
#: says so once the first segment has come, then waits to be killed (the readers go on with the spans
#: handed out).
_READING = """
import sys, time
from pathlib import Path
from transformers import PreTrainedTokenizerFast
import bertology.corpus.readers.spans
from bertology.corpus.reader_processes import SpanReading, read_encoded

bertology.corpus.readers.spans.SPAN_BYTES = 2048

tokenizer = PreTrainedTokenizerFast.from_pretrained(sys.argv[2])
segments = read_encoded(SpanReading(Path(sys.argv[1]), "text", tokenizer, 64, True, None), 2)
next(segments)
print("reading", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")
def test_readers_die_when_their_parent_is_killed(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> None:
    """Issue 43: `analyze --readers 2` killed (kill -9) left both readers running under PID 1. Here the
    process that starts them is a small script (the readers come from the same read_encoded as analyze's,
    with a tiny model's tokenizer: a few seconds, not a model load); it is killed while the readers still
    hold spans, and both must be gone within 5 s."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(sample_corpus().read_text(encoding="utf-8") * 4, encoding="utf-8")  # some 50 spans
    command = [sys.executable, "-c", _READING, str(corpus), str(tiny_model_dirs["bert"])]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None and parent.stdout.readline() == "reading\n"
        readers = _children(parent.pid)
        assert len(readers) == 2 and all(_alive(pid) for pid in readers)
        parent.kill()
        parent.wait(timeout=60)
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in readers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in readers if _alive(pid)]
    for pid in survivors:  # this test's own leftovers: not left running whatever the outcome
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "reader processes outlived their killed parent"
