"""CorefUD reader: Entity brackets (nested, discontinuous, singletons, empty nodes), left-out links, heads
from the file's own trees; GUM converted to CorefUD gives the same coreference probe as its brackets."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd
import pytest

from bertology.corpus.readers.coref import read_coref, with_sentences
from bertology.corpus.readers.coref_documents import CorefDocument, Mention
from bertology.corpus.readers.corefud import read_corefud
from bertology.corpus.readers.treebank import Sentence, read_treebank
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.probes.coreference import score_coreference, with_heads
from bertology.probes.run import probe_coreference

# Two documents. Sentence 1: "Mary 's dog barked ." with a multiword token "Mary's" (1-2), Mary (e2)
# nested in "Mary 's dog" (e1), an empty node 4.1 holding a zero mention (e4) and opening e5 on "." .
# Sentence 2: "She saw it and the cat": a discontinuous e3 over "She" and "cat" (dropped), "it" and "it"
# again as e1, "the cat" (e6) with a split antecedent (two links) and a bridging link.
CONSTRUCTED = """\
# newdoc id = first
# global.Entity = eid-etype-head-other
# sent_id = 1
1-2\tMary's\t_\t_\t_\t_\t_\t_\t_\t_
1\tMary\tMary\tPROPN\tNNP\t_\t3\tnmod:poss\t_\tEntity=(e1-animal-3(e2-person-1)
2\t's\t's\tPART\tPOS\t_\t1\tcase\t_\t_
3\tdog\tdog\tNOUN\tNN\t_\t4\tnsubj\t_\tEntity=e1)
4\tbarked\tbark\tVERB\tVBD\t_\t0\troot\t_\t_
4.1\t_\t_\tPRON\t_\t_\t_\t_\t4:nsubj\tEntity=(e4-person-1)(e5-thing-1
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\tEntity=e5)

# sent_id = 2
1\tShe\tshe\tPRON\tPRP\t_\t2\tnsubj\t_\tEntity=(e3[1/2]-person-1)
2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_
3\tit\tit\tPRON\tPRP\t_\t2\tobj\t_\tEntity=(e1-animal-1)
4\tand\tand\tCCONJ\tCC\t_\t6\tcc\t_\t_
5\tthe\tthe\tDET\tDT\t_\t6\tdet\t_\tEntity=(e6-animal-2|SplitAnte=e1<e6,e2<e6|Bridge=e1<e6
6\tcat\tcat\tNOUN\tNN\t_\t3\tconj\t_\tEntity=e6)(e3[2/2]-person-1)

# newdoc id = second
# sent_id = 3
1\tIt\tit\tPRON\tPRP\t_\t2\tnsubj\t_\tEntity=(e9-thing-1)
2\tended\tend\tVERB\tVBD\t_\t0\troot\t_\t_
"""


def test_constructed_document_gives_nested_mentions_chains_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "constructed.conllu"
    path.write_text(CONSTRUCTED, encoding="utf-8")
    reader = read_corefud(path)
    (first, heads), (second, second_heads) = list(reader)
    assert first.name == "first" and second.name == "second"
    assert first.words == ["Mary", "'s", "dog", "barked", ".", "She", "saw", "it", "and", "the", "cat"]
    assert first.sentence_starts == [0, 5]
    assert heads == [2, 0, 3, -1, 3, 6, -1, 6, 10, 10, 7]
    assert first.mentions == [
        Mention(0, 3, "e1", 0),
        Mention(0, 1, "e2", 0),
        Mention(4, 5, "e5", 0),  # opened on the empty node: starts at the next word
        Mention(7, 8, "e1", 1),
        Mention(9, 11, "e6", 1),
    ]
    chains: dict[str, list[tuple[int, int]]] = {}
    for mention in first.mentions:
        chains.setdefault(mention.entity, []).append((mention.start, mention.end))
    assert chains == {"e1": [(0, 3), (7, 8)], "e2": [(0, 1)], "e5": [(4, 5)], "e6": [(9, 11)]}
    assert second.words == ["It", "ended"] and second.mentions == [Mention(0, 1, "e9", 0)]
    assert second_heads == [1, -1]
    assert reader.skipped.items() == {
        "discontinuous mentions": 1,
        "mentions on empty nodes only": 1,
        "split-antecedent links": 2,
        "bridging links": 1,
    }
    # the same file through read_coref and the treebank reader's corefud format
    assert [d.mentions for d in read_coref(path)] == [first.mentions, second.mentions]
    assert [s.words for s in read_treebank(path, "corefud")] == [
        first.words[:5],
        first.words[5:],
        second.words,
    ]


# The official CorefUD scorer's own test files (forms are "_", every word a root), counted by hand from
# each key's Entity column and its test-case README: per entity, its mentions as 1-based (first, last)
# word numbers of the document (the sentences' words numbered on), and what is left out.
SCORER_KEYS = {
    # a: 2-13 (head 10) and c: 48 in one entity; b: 30-32, d: 63-64, e: 67 in the other
    "noncontig_mentions/TC-NCMA.key": (
        71,
        {"e10043": [(2, 13), (48, 48)], "e10054": [(30, 32), (63, 64), (67, 67)]},
        {},
    ),
    # a is discontinuous (parts 2-7, 10-11, 13: [1/3] .. [3/3]): dropped and counted once
    "noncontig_mentions/TC-NCMB.key": (
        71,
        {"e10043": [(48, 48)], "e10054": [(30, 32), (63, 64), (67, 67)]},
        {"discontinuous mentions": 1},
    ),
    # crossing mentions of two entities: e10043 opens at 2 and closes at 8 inside e10054 (4-13)
    "overlapping_mentions/TC-OLMD.key": (
        71,
        {"e10043": [(2, 8), (48, 48)], "e10054": [(4, 13), (30, 32), (63, 64), (67, 67)]},
        {},
    ),
    # two sentences (9 and 10 words): {a} {bc} {def}, e the zero on empty node 5.1 of sentence 2
    "zeros/TC-ZA.key": (
        19,
        {"e0": [(1, 2)], "e1": [(4, 7), (10, 10)], "e2": [(12, 13), (16, 18)]},
        {"mentions on empty nodes only": 1},
    ),
    # e and f both zeros, on empty nodes 5.1 and 5.2 of sentence 2 (9 and 8 words)
    "zeros/TC-ZB.key": (
        17,
        {"e0": [(1, 2)], "e1": [(4, 7), (10, 10)], "e2": [(12, 13)]},
        {"mentions on empty nodes only": 2},
    ),
}


@pytest.mark.parametrize("key", sorted(SCORER_KEYS))
def test_the_corefud_scorers_own_test_files(shared_data: Path, key: str) -> None:
    words, entities, skipped = SCORER_KEYS[key]
    reader = read_corefud(shared_data / "corefud_scorer_tests" / key)
    ((document, heads),) = list(reader)
    assert document.name == ("LuoTestCase" if key.startswith("zeros/") else "modified.nw.xinhua.00.chtb_0009")
    assert len(document.words) == len(heads) == words and set(heads) == {-1}  # a forest of roots
    found: dict[str, list[tuple[int, int]]] = {}
    for mention in document.mentions:
        found.setdefault(mention.entity, []).append((mention.start + 1, mention.end))
    assert {entity: sorted(spans) for entity, spans in found.items()} == entities
    assert {what: count for what, count in reader.skipped.items().items() if count} == skipped


@pytest.mark.parametrize(
    ("entity", "message"),
    [("e1)", "ends but none is open"), ("(e1-x", "starts but never ends"), ("((", "not a run of")],
)
def test_broken_entity_brackets_are_named(tmp_path: Path, entity: str, message: str) -> None:
    path = tmp_path / "broken.conllu"
    path.write_text(f"1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\tEntity={entity}\n", encoding="utf-8")
    with pytest.raises(BertologyError, match=message):
        list(read_corefud(path))


def test_a_file_without_mentions_is_named(tmp_path: Path, default_model: LoadedModel) -> None:
    path = tmp_path / "plain.conllu"
    path.write_text("1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n", encoding="utf-8")
    with pytest.raises(BertologyError, match=r"plain.conllu has no coreference mentions\.$"):
        probe_coreference(path, default_model)
    with pytest.raises(BertologyError, match="carries its own dependency trees"):
        probe_coreference(path, default_model, treebank=path)


def _entity_column(mentions: Iterable[Mention], word: int) -> str:
    """CorefUD brackets of one word: closings (inner first), then openings (outer first), then one-word
    mentions. A closing written first never runs into an opening's attributes ("e7)(e88-x", not
    "(e88-xe7)"); brackets pair up by entity id, so GUM's crossing mentions read back as they were."""
    closes = sorted((m for m in mentions if m.end == word + 1 and m.start < word), key=lambda m: -m.start)
    opens = sorted((m for m in mentions if m.start == word and m.end > word + 1), key=lambda m: -m.end)
    singles = [m for m in mentions if m.start == word and m.end == word + 1]
    brackets = [f"e{m.entity})" for m in closes] + [f"(e{m.entity}-x" for m in opens]
    text = "".join(brackets + [f"(e{m.entity}-x)" for m in singles])
    return f"Entity={text}" if text else "_"


def to_corefud(documents: Iterable[tuple[CorefDocument, list[Sentence]]]) -> str:
    """GUM documents (brackets and their Stanford Dependencies trees) written as CorefUD."""
    lines = []
    for document, sentences in documents:
        lines.append(f"# newdoc id = {document.name}")
        for start, sentence in zip(document.sentence_starts, sentences, strict=True):
            for index, (word, head, relation) in enumerate(
                zip(sentence.words, sentence.heads, sentence.relations, strict=True)
            ):
                misc = _entity_column(document.mentions, start + index)
                lines.append(f"{index + 1}\t{word}\t_\tX\tX\t_\t{head + 1}\t{relation}\t_\t{misc}")
            lines.append("")
    return "\n".join(lines)


def test_gum_as_corefud_gives_the_bracket_format_probe_table(
    tmp_path: Path, shared_data: Path, default_model: LoadedModel
) -> None:
    gum = shared_data / "gum_v5.1_sd"
    names = ["GUM_academic_art", "GUM_bio_byron"]
    pairs = []
    for name in names:
        sentences = list(read_treebank(gum / "dep_stanford" / f"{name}.conll10"))
        (document,) = with_sentences(read_coref(gum / "coref_conll" / f"{name}.conll"), sentences)
        assert all(sentence.heads.count(-1) == 1 for sentence in sentences)  # CoNLL-U: one root each
        pairs.append((document, sentences))
    path = tmp_path / "gum.conllu"
    path.write_text(to_corefud(pairs), encoding="utf-8")

    converted = list(read_corefud(path))
    assert [document.mentions for document, _ in converted] == [
        [Mention(m.start, m.end, f"e{m.entity}", m.sentence) for m in document.mentions]
        for document, _ in pairs
    ]
    brackets = with_heads(
        (document for document, _ in pairs), (sentence for _, sentences in pairs for sentence in sentences)
    )
    expected = score_coreference(brackets, default_model)
    result = probe_coreference(path, default_model)
    probe, summary = result.probe, result.summary()
    pd.testing.assert_frame_equal(probe.table(), expected.table())
    assert (probe.correct == expected.correct).all() and probe.count() == expected.count() > 100
    assert summary["head words from"] == "the file's own dependency trees (CorefUD)"
