"""The encoded-corpus cache: a second pass reads the entry, not the file, and gives the same segments and
encodings; any change of the key misses; damaged or half-written entries are not trusted; the size bound
removes the least recently used entry; the command line lists, clears and skips it."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from support.cli import run_command, run_in_process
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from typer.testing import CliRunner

import bertology.corpus.segments
from bertology.analysis.analyze import analyze_corpus
from bertology.analysis.settings import AnalysisSettings
from bertology.cli import app
from bertology.corpus.cache import CacheUse, CacheWarning, cache_entries, evict, read_segments
from bertology.corpus.encoding import encode
from bertology.corpus.readers import ByteSpan
from bertology.corpus.segments import Segment, iter_segments, sample_corpus
from bertology.models.loading import LoadedModel


@pytest.fixture(scope="module")
def tokenizer(default_model: LoadedModel) -> PreTrainedTokenizerFast:
    return default_model.tokenizer


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """The first 20 lines of the sample corpus (paragraphs of a few documents)."""
    path = tmp_path / "corpus.txt"
    lines = sample_corpus().read_text(encoding="utf-8").splitlines(keepends=True)[:20]
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def paragraphs_read(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files the plain-text reader opened (a counter on the corpus's one reading function)."""
    opened: list[Path] = []
    reader = bertology.corpus.segments.read_paragraphs

    def counting(path: Path, span: ByteSpan | None = None) -> Iterator[object]:
        opened.append(path)
        return reader(path, span)

    monkeypatch.setattr(bertology.corpus.segments, "read_paragraphs", counting)
    return opened


def _assert_same_segments(got: list[Segment], expected: list[Segment]) -> None:
    assert got == expected
    assert [segment.tokens for segment in got] == [segment.tokens for segment in expected]


def _assert_encoded_as_encode_does(
    segments: list[Segment], tokenizer: PreTrainedTokenizerFast, max_length: int
) -> None:
    """Each segment's stored encoding equals :func:`encode` of its texts, one at a time (unpadded)."""
    for segment in segments:
        expected = encode(tokenizer, [segment.text_a], [segment.text_b], max_length=max_length, warn=False)
        row = segment.encoded
        assert segment.encoded_length == max_length
        for name, values in expected.model_inputs.items():
            assert np.array_equal(row.features[name], values[0].numpy()), name
            assert row.features[name].dtype == np.int64
        assert row.tokens == expected.tokens[0] and row.words == expected.words[0]
        assert row.truncated == expected.truncated[0]
        for name in ("segment_ids", "special", "word_ids", "word_segments"):
            assert np.array_equal(getattr(row, name), getattr(expected, name)[0]), name
            assert getattr(row, name).dtype == getattr(expected, name)[0].dtype, name


def test_a_second_pass_reads_the_cache_not_the_file(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, paragraphs_read: list[Path], corpus_cache: Path
) -> None:
    plain = list(iter_segments(corpus, tokenizer, max_length=96))
    assert len(plain) > 5 and any(segment.is_pair for segment in plain)
    paragraphs_read.clear()

    first = list(read_segments(corpus, tokenizer, max_length=96, encoded_length=80))
    assert paragraphs_read == [corpus]
    assert len(cache_entries()) == 1 and cache_entries()[0].segments == len(plain)
    second = list(read_segments(corpus, tokenizer, max_length=96, encoded_length=80))

    assert paragraphs_read == [corpus]  # the second pass did not read the file
    _assert_same_segments(first, plain)
    _assert_same_segments(second, plain)
    assert any(segment.encoded.truncated > 0 for segment in second)  # 96-token segments cut to 80
    _assert_encoded_as_encode_does(first, tokenizer, 80)
    _assert_encoded_as_encode_does(second, tokenizer, 80)
    assert [path.name for path in corpus_cache.iterdir()] == [cache_entries()[0].key]


def test_a_pass_tells_how_it_uses_the_cache(corpus: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    """Issue 43, item 9: a hit was silent; each pass now says, before its first segment, whether an entry
    served it, it writes one, or the cache was off."""
    uses: list[CacheUse] = []
    first = read_segments(corpus, tokenizer, max_length=48, on_cache=uses.append, model="mini")
    assert [use.state for use in uses] == ["written"]  # told before the first segment
    list(first)
    list(read_segments(corpus, tokenizer, max_length=48, on_cache=uses.append))
    list(read_segments(corpus, tokenizer, max_length=48, cache=False, on_cache=uses.append))
    key = cache_entries()[0].key
    assert uses == [CacheUse("written", key), CacheUse("read", key), CacheUse("off")]
    assert uses[1].sentence() == (
        f"Segments read from the encoded-corpus cache (entry {key}; see `bertology cache list`)."
    )
    assert uses[2].sentence() == ""


def test_a_pass_left_early_or_with_no_cache_writes_nothing(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, corpus_cache: Path
) -> None:
    segments = read_segments(corpus, tokenizer, max_length=48)
    next(segments)
    segments.close()
    list(read_segments(corpus, tokenizer, max_length=48, cache=False))
    assert list(corpus_cache.iterdir()) == []


def _changed_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: Path) -> PreTrainedTokenizerFast:
    """The tokenizer saved and loaded again with one byte of its vocabulary changed."""
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer.json"
    text = path.read_text(encoding="utf-8")
    assert text.count('"[unused0]"') == 1
    path.write_text(text.replace('"[unused0]"', '"[unused!]"'), encoding="utf-8")
    return AutoTokenizer.from_pretrained(folder)


CHANGES: dict[str, Callable[[Path, PreTrainedTokenizerFast, Path], dict[str, object]]] = {
    "corpus byte": lambda corpus, tokenizer, scratch: {
        "path": corpus.write_bytes(corpus.read_bytes().replace(b"a", b"e", 1)) and corpus
    },
    "tokenizer byte": lambda corpus, tokenizer, scratch: {
        "tokenizer": _changed_tokenizer(tokenizer, scratch)
    },
    "max length": lambda corpus, tokenizer, scratch: {"max_length": 47},
    "format": lambda corpus, tokenizer, scratch: {"format": "jsonl"},
    "pairs (model kind)": lambda corpus, tokenizer, scratch: {"pairs": False},
    "encoding length": lambda corpus, tokenizer, scratch: {"encoded_length": 32},
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_of_the_key_misses(
    change: str,
    tmp_path: Path,
    tokenizer: PreTrainedTokenizerFast,
    paragraphs_read: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = tmp_path / "corpus.txt"
    records = [
        {"text": "The first paragraph is here."},
        {"text": "A second one follows it.", "text_b": "Yes."},
    ]
    corpus.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    records_read: list[Path] = []
    reader = bertology.corpus.segments.read_records
    monkeypatch.setattr(
        bertology.corpus.segments,
        "read_records",
        lambda path, span=None: records_read.append(path) or reader(path, span),
    )
    arguments: dict[str, object] = {
        "path": corpus,
        "tokenizer": tokenizer,
        "max_length": 48,
        "format": "text",
        "pairs": True,
        "encoded_length": 48,
    }
    list(read_segments(**arguments))  # type: ignore[arg-type]
    list(read_segments(**arguments))  # type: ignore[arg-type]
    assert len(paragraphs_read) == 1 and cache_entries()[0].segments == 1

    changed = {**arguments, **CHANGES[change](corpus, tokenizer, tmp_path / "tokenizer")}
    again = list(read_segments(**changed))  # type: ignore[arg-type]

    assert len(paragraphs_read) + len(records_read) == 2  # read from the file again
    assert len(cache_entries()) == 2
    expected = iter_segments(
        changed["path"],  # type: ignore[arg-type]
        changed["tokenizer"],  # type: ignore[arg-type]
        max_length=changed["max_length"],  # type: ignore[arg-type]
        format=changed["format"],  # type: ignore[arg-type]
        pairs=changed["pairs"],  # type: ignore[arg-type]
    )
    _assert_same_segments(again, list(expected))


def test_a_damaged_entry_is_ignored_with_a_warning(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, paragraphs_read: list[Path], corpus_cache: Path
) -> None:
    expected = list(read_segments(corpus, tokenizer, max_length=48, encoded_length=48))
    entry = corpus_cache / cache_entries()[0].key
    ids = entry / "input_ids"
    ids.write_bytes(ids.read_bytes()[:-4])  # cut short: the last token is missing

    with pytest.warns(CacheWarning, match=r"Ignoring the damaged corpus cache entry .*'input_ids' differs"):
        again = list(read_segments(corpus, tokenizer, max_length=48, encoded_length=48))

    assert len(paragraphs_read) == 2
    _assert_same_segments(again, expected)
    _assert_encoded_as_encode_does(again, tokenizer, 48)
    assert len(cache_entries()) == 1  # written whole again
    list(read_segments(corpus, tokenizer, max_length=48, encoded_length=48))
    assert len(paragraphs_read) == 2


def test_a_killed_runs_half_written_entry_is_not_used(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, paragraphs_read: list[Path], corpus_cache: Path
) -> None:
    list(read_segments(corpus, tokenizer, max_length=48))
    key = cache_entries()[0].key
    # seeded: what a run killed before its rename leaves (a temporary folder no live writer holds
    # locked), and an entry without its manifest (the last file written)
    leftover = corpus_cache / f".writing-{key}-0123456789ab"
    shutil.copytree(corpus_cache / key, leftover)
    (corpus_cache / key / "manifest.json").unlink()

    with pytest.warns(CacheWarning, match="its manifest is missing"):
        list(read_segments(corpus, tokenizer, max_length=48))

    assert len(paragraphs_read) == 2
    assert [entry.key for entry in cache_entries()] == [key]
    assert not leftover.exists()  # issue 43: removed by the next write, not an hour later


def test_a_live_writers_temporary_folder_stays_while_a_killed_ones_goes(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, corpus_cache: Path
) -> None:
    """A writer part-way through its pass (this generator, suspended) holds its folder locked: a sweep
    leaves it; a folder whose writer is gone (its lock gone with it) is removed however recent."""
    writing = read_segments(corpus, tokenizer, max_length=48)
    next(writing)
    (live,) = corpus_cache.glob(".writing-*")
    killed = corpus_cache / ".writing-0123-0123456789ab"
    killed.mkdir()
    evict(1 << 40)
    assert live.is_dir() and not killed.exists()
    list(writing)  # the pass ends: its entry is published
    assert not list(corpus_cache.glob(".writing-*")) and len(cache_entries()) == 1


def test_the_size_bound_removes_the_least_recently_used_entry(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, corpus_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpora = []
    for index, text in enumerate(["One paragraph.", "Another paragraph here.", "A third paragraph."]):
        corpora.append(tmp_path / f"corpus{index}.txt")
        corpora[-1].write_text(text + "\n", encoding="utf-8")
        list(read_segments(corpora[-1], tokenizer))
    entries = {entry.corpus: entry for entry in cache_entries()}
    for age, name in enumerate(["corpus1.txt", "corpus0.txt", "corpus2.txt"]):  # corpus1 the oldest
        os.utime(corpus_cache / entries[name].key / "manifest.json", (1000 + age, 1000 + age))
    sizes = {name: entry.bytes for name, entry in entries.items()}

    assert evict(sum(sizes.values())) == []
    assert evict(sum(sizes.values()) - 1) == [entries["corpus1.txt"].key]
    assert {entry.corpus for entry in cache_entries()} == {"corpus0.txt", "corpus2.txt"}

    list(read_segments(corpora[0], tokenizer))  # corpus0 used: now the most recent
    assert [entry.corpus for entry in cache_entries()] == ["corpus2.txt", "corpus0.txt"]

    monkeypatch.setenv("BERTOLOGY_CACHE_MB", "0")  # the configured bound, applied after each write
    list(read_segments(corpora[1], tokenizer))
    assert cache_entries() == []


def test_analyze_from_the_cache_equals_a_run_without_it(
    loaded_types: Callable[[str], LoadedModel],
    sample_corpus_head: Callable[[int], Path],
    paragraphs_read: list[Path],
) -> None:
    loaded = loaded_types("bert")
    corpus = sample_corpus_head(12)
    settings = AnalysisSettings(max_length=32, batch_size=4, js_tokens_per_segment=None)
    plain = analyze_corpus(corpus, loaded, AnalysisSettings(**{**settings.__dict__, "cache": False}))
    written = analyze_corpus(corpus, loaded, settings)
    assert len(paragraphs_read) == 2
    cached = analyze_corpus(corpus, loaded, settings)
    assert len(paragraphs_read) == 2  # the third run read the cache

    for result in (written, cached):
        assert result.segments == plain.segments > 4 and result.tokens_cut == plain.tokens_cut
        assert result.heads_frame().equals(plain.heads_frame())
        assert np.array_equal(result.distances.distance, plain.distances.distance)
    # what summary.json says of it (issue 43, item 9)
    key = cache_entries()[0].key
    assert plain.summary()["corpus_cache"] == "off" and "corpus_cache_key" not in plain.summary()
    assert {name: written.summary()[name] for name in ("corpus_cache", "corpus_cache_key")} == {
        "corpus_cache": "written",
        "corpus_cache_key": key,
    }
    assert {name: cached.summary()[name] for name in ("corpus_cache", "corpus_cache_key")} == {
        "corpus_cache": "read",
        "corpus_cache_key": key,
    }


def test_the_cache_command_lists_and_clears_entries(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, corpus_cache: Path
) -> None:
    """Two entries of one file (issue 43, item 9: they looked alike) differ in the model, ``--max-len``
    and pairs or single texts that ``cache list`` shows."""
    list(read_segments(corpus, tokenizer, max_length=48, model="mini"))
    list(read_segments(corpus, tokenizer, max_length=64, pairs=False, model="mini-decoder"))
    by_length = {entry.max_length: entry for entry in cache_entries()}

    listed = CliRunner().invoke(app, ["cache", "list"])
    assert listed.exit_code == 0, listed.output
    lines = {
        entry: next(line for line in listed.output.splitlines() if entry.key in line)
        for entry in by_length.values()
    }
    origin = str(tokenizer.name_or_path)
    assert lines[by_length[48]].startswith(
        f"{by_length[48].key}  corpus.txt  model mini (tokenizer {origin})  --max-len 48  text, pairs  "
    )
    assert lines[by_length[64]].startswith(
        f"{by_length[64].key}  corpus.txt  model mini-decoder (tokenizer {origin})  --max-len 64  "
        "text, single texts  "
    )
    assert "2 entries, " in listed.output and str(corpus_cache) in listed.output.replace("\n", "")

    cleared = CliRunner().invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0, cleared.output
    assert "Removed 2 entries" in cleared.output
    assert cache_entries() == []


def test_cache_clear_removes_the_entries_named_or_unused_for_days(
    corpus: Path, tokenizer: PreTrainedTokenizerFast, corpus_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43, item 9: ``cache clear`` removed every entry; ``KEY`` (or its start) and ``--older-than
    DAYS`` choose. Three entries: one last used 10 days ago, one 2 days ago, one now."""
    for length in (40, 48, 56):
        list(read_segments(corpus, tokenizer, max_length=length))
    keys = {entry.max_length: entry.key for entry in cache_entries()}
    now = time.time()
    for length, days in ((40, 10), (48, 2)):
        manifest = corpus_cache / keys[length] / "manifest.json"
        os.utime(manifest, (now - days * 86_400, now - days * 86_400))

    assert run_in_process(["cache", "clear", "--older-than", "5"], capsys) == (0, "")
    assert {entry.key for entry in cache_entries()} == {keys[48], keys[56]}

    assert run_in_process(["cache", "clear", keys[56][:10]], capsys) == (0, "")  # the start of a key
    assert [entry.key for entry in cache_entries()] == [keys[48]]

    code, stderr = run_in_process(["cache", "clear", "f" * 32], capsys)
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert f"has no entry whose key is or starts with '{'f' * 32}'" in stderr
    assert [entry.key for entry in cache_entries()] == [keys[48]]


@pytest.mark.slow
def test_analyze_and_index_write_the_cache_and_no_cache_does_not(
    sample_corpus_head: Callable[[int], Path],
    tiny_model_dirs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On the tiny BERT (the default model's tokenizer, 3 layers x 4 heads): the cache holds the tokenizer's
    segments whatever the model, and the small model's passes and report cost a small part of the default
    model's."""
    corpus = sample_corpus_head(6)
    model = ["-m", str(tiny_model_dirs["bert"]), "--max-len", "64"]  # the tiny model's limit
    quick = [*model, "--examples-per-head", "0", "--batch-size", "8"]
    plain = run_command(["analyze", str(corpus), "--no-cache", *quick, "-o", str(tmp_path / "plain")], capsys)
    assert plain.returncode == 0, plain.stderr
    assert cache_entries() == []
    for name, said in (("written", "written to"), ("cached", "read from")):
        run = run_command(["analyze", str(corpus), *quick, "-o", str(tmp_path / name)], capsys)
        assert run.returncode == 0, run.stderr
        assert len(cache_entries()) == 1
        assert (tmp_path / name / "heads.csv").read_bytes() == (tmp_path / "plain" / "heads.csv").read_bytes()
        key = cache_entries()[0].key
        assert f"Segments {said} the encoded-corpus cache (entry {key};" in run.stdout
        summary = json.loads((tmp_path / name / "summary.json").read_text(encoding="utf-8"))
        assert (summary["corpus_cache"], summary["corpus_cache_key"]) == (name.replace("cached", "read"), key)

    indexed = run_command(["index", str(corpus), *model, "--no-cache", "-o", str(tmp_path / "index")], capsys)
    assert indexed.returncode == 0, indexed.stderr
    assert len(cache_entries()) == 1
    indexed = run_command(["index", str(corpus), *model, "-o", str(tmp_path / "index")], capsys)
    assert indexed.returncode == 0, indexed.stderr
    assert len(cache_entries()) == 2  # the index's segments, without encodings: an entry of its own
