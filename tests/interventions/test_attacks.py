"""Attacks: HotFlip's best swap flips a classifier whose answer is known; input reduction keeps the
prediction at every step; neither touches a special token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.known_classifier import known_sentiment_classifier
from support.tiny_models import tiny_classifier

from bertology.corpus.encoding import encode
from bertology.errors import BertologyError
from bertology.interventions.attacks import Attack, attack, replacement_entries
from bertology.models.loading import LoadedModel

POSITIVE = "the film was good and long"
PAIR = ("Researchers measured how much each head attends to punctuation.", "The quick brown fox jumps.")


@pytest.fixture(scope="module")
def known() -> LoadedModel:
    return known_sentiment_classifier()


@pytest.fixture(scope="module")
def tiny_bert(tiny_model_dirs: dict[str, Path]) -> LoadedModel:
    return tiny_classifier(tiny_model_dirs["bert"])


def predicted_labels(loaded: LoadedModel, result: Attack, text: str, text_b: str | None) -> list[str]:
    """The label the model gives each step's input, run here from its ids and the original input's token
    types at its positions."""
    encoded = encode(loaded.tokenizer, [text], None if text_b is None else [text_b], max_length=64)
    types = encoded.model_inputs.get("token_type_ids")
    labels = []
    with torch.no_grad():
        for step in result.steps:
            ids = torch.tensor([step.ids])
            extra = {} if types is None else {"token_type_ids": types[:, step.positions]}
            logits = loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits
            labels.append(loaded.model.config.id2label[int(logits[0].argmax())])
    return labels


def assert_specials_kept(result: Attack) -> None:
    special_positions = np.flatnonzero(result.special).tolist()
    for step in result.steps:
        assert set(special_positions) <= set(step.positions)
        assert all(step.tokens[step.positions.index(p)] == result.tokens[p] for p in special_positions)
        assert not result.special[step.position]


def test_hotflip_makes_the_known_best_swap(known: LoadedModel) -> None:
    result = attack(known, POSITIVE, method="hotflip")
    assert (result.label, result.flipped, len(result.steps)) == ("pos", True, 1)
    (step,) = result.steps
    # the most positive word, for the most negative whole word: "awful", not the word piece "##y"
    assert (step.token, step.replacement, step.label) == ("good", "awful", "neg")
    assert step.text == "the film was awful and long" and step.probability > 0.99
    assert predicted_labels(known, result, POSITIVE, None) == ["neg"]
    negative = attack(known, "the film was bad", method="hotflip")
    assert negative.flipped and negative.steps[0].token == "bad"
    assert negative.steps[0].replacement in ("good", "great") and negative.steps[0].label == "pos"


def test_hotflip_swaps_in_word_pieces_only_when_asked(known: LoadedModel) -> None:
    (step,) = attack(known, POSITIVE, method="hotflip", subwords=True).steps
    assert (step.token, step.replacement, step.label) == ("good", "##y", "neg")
    entries = replacement_entries(known)
    ids = known.tokenizer.convert_tokens_to_ids(["good", "awful", "##y", ".", "[CLS]", "[PAD]", "[unused0]"])
    assert entries[ids].tolist() == [True, True, False, False, False, False, False]
    assert replacement_entries(known, subwords=True)[ids].tolist() == [
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]


def test_hotflip_on_a_pair_changes_one_ordinary_token_per_step(tiny_bert: LoadedModel) -> None:
    result = attack(tiny_bert, *PAIR, method="hotflip", max_flips=3)
    assert 1 <= len(result.steps) <= 3
    allowed = replacement_entries(tiny_bert)
    previous = tiny_bert.tokenizer(*PAIR)["input_ids"]
    for step in result.steps:
        assert step.positions == list(range(len(result.tokens)))
        changed = [i for i, (a, b) in enumerate(zip(previous, step.ids, strict=True)) if a != b]
        assert changed == [step.position] and allowed[step.ids[step.position]]
        previous = step.ids
    assert len({step.position for step in result.steps}) == len(result.steps)  # a position swapped once
    assert_specials_kept(result)
    labels = predicted_labels(tiny_bert, result, *PAIR)
    assert labels == [step.label for step in result.steps]
    assert all(label == result.label for label in labels[:-1])  # it stops at the first change
    assert result.flipped == (labels[-1] != result.label)


def test_input_reduction_keeps_the_known_word(known: LoadedModel) -> None:
    result = attack(known, POSITIVE, method="input-reduction")
    assert [step.label for step in result.steps] == ["pos"] * 5
    assert result.result is not None and result.result.text == "good"
    assert result.result.tokens == ["[CLS]", "good", "[SEP]"]
    assert predicted_labels(known, result, POSITIVE, None) == ["pos"] * 5
    assert_specials_kept(result)


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 3])
def test_input_reduction_keeps_the_prediction_at_every_step(tiny_bert: LoadedModel, beam: int) -> None:
    result = attack(tiny_bert, *PAIR, method="input-reduction", beam=beam)
    assert result.steps and not result.flipped
    assert predicted_labels(tiny_bert, result, *PAIR) == [result.label] * len(result.steps)
    assert_specials_kept(result)
    segments = encode(tiny_bert.tokenizer, [PAIR[0]], [PAIR[1]], max_length=64).segment_ids[0]
    previous = list(range(len(result.tokens)))
    for step in result.steps:
        assert [p for p in previous if p not in step.positions] == [step.position]  # one token at a time
        previous = step.positions
        ordinary = [p for p in step.positions if not result.special[p]]
        assert {int(segments[p]) for p in ordinary} == {0, 1}  # each text keeps a token
    assert result.result is not None and result.result.text_b is not None


def test_attack_settings_are_checked(known: LoadedModel) -> None:
    with pytest.raises(BertologyError, match="Unknown attack 'lime'"):
        attack(known, POSITIVE, method="lime")  # type: ignore[arg-type]
    with pytest.raises(BertologyError, match="at least one input"):
        attack(known, POSITIVE, method="input-reduction", beam=0)
    with pytest.raises(BertologyError, match="at least one swap"):
        attack(known, POSITIVE, method="hotflip", max_flips=0)
