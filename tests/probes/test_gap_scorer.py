"""GAP scored as GAP's own scorer does: hand-computed F1s and bias on a constructed set, the baselines on
constructed parses, and a real run on GAP development."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertology.corpus.readers.gap import GapExample, read_gap
from bertology.corpus.readers.spacy_parse import ParsedText
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel
from bertology.probes.gap import (
    BASELINES,
    GapAccumulator,
    GapWords,
    baseline_answers,
    gap_words,
    score_gap,
    syntactic_choices,
    token_distance,
    tree_distance,
)
from bertology.probes.gap_scorer import FEMININE, MASCULINE

# (gender, gold (A, B), the head's answer (A, B) or None for a text cut to fit the model)
CONSTRUCTED = [
    (MASCULINE, (True, False), (True, False)),  # tp, tn
    (MASCULINE, (False, True), (True, False)),  # fp, fn
    (MASCULINE, (False, False), (False, True)),  # "neither" counts: fp, tn
    (FEMININE, (True, False), (True, False)),  # tp, tn
    (FEMININE, (False, True), (False, True)),  # tp, tn
    (FEMININE, (False, True), None),  # no answer: fn, fn
]


def words_of(gender: int, gold: tuple[bool, bool]) -> GapWords:
    """Words "A B she": name A is word 0, name B word 1, the pronoun word 2."""
    return GapWords(["A", "B", "she"], 2, [0], [1], gold, gender)


def test_constructed_set_gives_hand_computed_f1_and_bias() -> None:
    """Masculine: tp 1, fp 2, fn 1, tn 2 -> P 1/3, R 1/2, F1 0.4. Feminine: tp 2, fp 0, fn 2, tn 2 -> P 1,
    R 1/2, F1 2/3. Overall: tp 3, fp 2, fn 3, tn 4 -> P 3/5, R 1/2, F1 6/11. Bias F/M = (2/3) / 0.4."""
    accumulator = GapAccumulator(["always_a", "neither"])
    for gender, gold, answer in CONSTRUCTED:
        row = None
        if answer is not None:  # one head [1, 1]: attention 0.6 to the name it picks, 0.1 to the other
            row = np.full((1, 1, 3), 0.1)
            row[0, 0, answer.index(True)] = 0.6
        accumulator.update(words_of(gender, gold), row, [(True, False), (False, False)])
    probe = accumulator.merge(GapAccumulator(["always_a", "neither"])).result()
    assert probe.heads.by_gender()[:, :, 0, 0].tolist() == [[3, 2, 3, 4], [1, 2, 1, 2], [2, 0, 2, 2]]
    np.testing.assert_allclose(probe.heads.precision()[:, 0, 0], [3 / 5, 1 / 3, 1.0])
    np.testing.assert_allclose(probe.heads.recall()[:, 0, 0], [1 / 2, 1 / 2, 1 / 2])
    np.testing.assert_allclose(probe.heads.f1()[:, 0, 0], [6 / 11, 0.4, 2 / 3])
    np.testing.assert_allclose(probe.heads.bias(), [[(2 / 3) / 0.4]])
    assert probe.examples == 6 and probe.skipped == 1 and probe.one_name == 5
    assert probe.accuracy()[0, 0] == pytest.approx(3 / 5)  # Clark et al.: 3 of the 5 one-name examples
    # always A: masculine tp 1 fp 2 fn 1 tn 2, feminine tp 1 fp 2 fn 2 tn 1 -> F1 0.4 and 1/3
    table = probe.table().set_index("system")
    assert table.index.tolist() == ["head 0-0", "always_a", "neither"]
    assert table.loc["always_a", "masculine_f1"] == pytest.approx(0.4)
    assert table.loc["always_a", "feminine_f1"] == pytest.approx(1 / 3)
    assert table.loc["always_a", "bias_f_m"] == pytest.approx((1 / 3) / 0.4)
    assert table.loc["neither", "overall_f1"] == 0 and np.isnan(table.loc["neither", "bias_f_m"])
    assert json.loads(probe.to_json())["head_counts"] == probe.heads.counts.tolist()


def gap_example(text: str, pronoun: str, a: str, b: str, gold: tuple[bool, bool]) -> GapExample:
    return GapExample(
        "t", text, pronoun, text.index(pronoun), a, text.index(a), gold[0], b, text.index(b), gold[1], ""
    )


def test_words_token_distance_and_a_pronoun_gap_does_not_have() -> None:
    example = gap_example(
        "Mary Ann met Bob Smith, and she smiled.", "she", "Mary Ann", "Bob Smith", (False, True)
    )
    words = gap_words(example)
    assert words.words[words.pronoun] == "she" and words.gender == FEMININE and words.gold == (False, True)
    assert [words.words[w] for w in words.a] == ["Mary", "Ann"]
    assert [words.words[w] for w in words.b] == ["Bob", "Smith,"]
    assert token_distance(words) == "B"
    answers = baseline_answers(words, None)
    assert answers == [(False, True), (True, False), (False, True), (True, True), (False, False)]
    with pytest.raises(BertologyError, match="'it' is not one of GAP's"):
        gap_words(gap_example("Mary met Bob and it rained.", "it", "Mary", "Bob", (False, False)))


def test_syntactic_distance_and_parallelism_on_a_constructed_parse() -> None:
    """ "Anna met Beth . She smiled ." The pronoun is 3 edges from both names (across one sentence break),
    so syntactic distance falls back to token distance (Beth); parallelism picks the other subject, Anna."""
    example = gap_example("Anna met Beth . She smiled .", "She", "Anna", "Beth", (True, False))
    starts = [0, 5, 9, 14, 16, 20, 27]
    tokens = ["Anna", "met", "Beth", ".", "She", "smiled", "."]
    parsed = ParsedText(
        starts=starts,
        ends=[start + len(token) for start, token in zip(starts, tokens, strict=True)],
        heads=[1, -1, 1, 1, 5, -1, 5],
        relations=["nsubj", "root", "dobj", "punct", "nsubj", "root", "punct"],
        sentences=[0, 0, 0, 0, 1, 1, 1],
    )
    assert (
        tree_distance(parsed, 0, 2) == 2 and tree_distance(parsed, 4, 0) == tree_distance(parsed, 4, 2) == 3
    )
    words = gap_words(example)
    assert syntactic_choices(example, words, parsed) == ("B", "A")
    answers = dict(zip(BASELINES, baseline_answers(words, ("B", "A")), strict=True))
    assert answers["syntactic_distance"] == (False, True) and answers["parallelism"] == (True, False)


def test_gap_development_with_heads_and_every_baseline(default_model: LoadedModel, shared_data: Path) -> None:
    probe = score_gap(read_gap(shared_data / "gap" / "gap-development.tsv"), default_model, limit=40)
    assert probe.examples == 40 and probe.skipped == 0 and probe.syntax_note is None
    assert probe.baseline_names == BASELINES
    assert probe.heads.counts.shape == (2, 4, default_model.num_layers, default_model.num_heads)
    # every example gives two decisions to every head and every baseline
    assert (probe.heads.counts.sum((0, 1)) == 80).all() and (probe.baselines.counts.sum((0, 1)) == 80).all()
    table = probe.table().set_index("system")
    assert table.loc["both", "overall_r"] == 1 and table.loc["neither", "overall_f1"] == 0
    assert table.loc["always_a", "overall_f1"] + table.loc["always_b", "overall_f1"] > 0
    assert table.iloc[0]["overall_f1"] == probe.heatmap().max()
    assert len(probe.to_frame()) == default_model.num_layers * default_model.num_heads
