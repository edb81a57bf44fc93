"""Explanations by changing the input: input reduction and HotFlip (as AllenNLP Interpret has them).

Both start from the classifier's prediction ``y`` for the input and change its tokens (word pieces),
never a special token ([CLS], [SEP], <s>, ...). Both score by ``log p(y|x)``, the log-softmax of the
original prediction, and its gradient with respect to the word embeddings ``e_i``
(:mod:`~bertology.interventions.embeddings`). Each method of :data:`METHODS`:

- ``input-reduction`` (Feng et al. 2018, "Pathologies of Neural Models Make Interpretations
  Difficult"): remove the least important token again and again while the prediction stays ``y``.
  A token's importance is the paper's gradient estimate of what removing it costs,
  ``e_i · ∂log p(y|x)/∂e_i`` (input × gradient); the least important has the lowest. Beam search as in
  the paper: each of the ``beam`` inputs kept proposes removing each of its ``beam`` least important
  tokens; of the proposals the model still gives ``y``, the ``beam`` most confident go on. The search
  ends when no proposal keeps ``y`` (or each text is down to one token); the reduced input is the most
  confident of the last inputs that kept it, and its steps are the path that led there.
- ``hotflip`` (Ebrahimi et al. 2018, "HotFlip: White-Box Adversarial Examples for Text
  Classification"): the gradient of the loss ``L = −log p(y|x)`` with respect to the one-hot input,
  ``∂L/∂v[i, w] = E[w] · ∂L/∂e_i`` (``E``: the word-embedding matrix), estimates the loss's change when
  token ``i`` (entry ``a``) is swapped for entry ``b`` as ``(E[b] − E[a]) · ∂L/∂e_i``. Each step makes
  the swap of largest estimate over every position not yet swapped and every allowed entry, runs the
  model again, and the attack stops once the prediction changes (or after ``max_flips`` swaps, or with
  no position left). Allowed entries: whole words, the non-special vocabulary entries that decode alone
  to letters and digits only and that the tokenizer gives back for that word after a space (no word
  pieces such as ``##ing``, no punctuation, no [unused] slots, as AllenNLP's HotFlip keeps to
  alphanumeric entries); with ``subwords`` every non-special entry.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.inputs import Text
from bertology.interventions.data import eval_mode
from bertology.interventions.embeddings import score_gradient, target_log_probability, word_embeddings
from bertology.interventions.explained import ExplainedInput, as_string
from bertology.interventions.saliency import encode_one
from bertology.models import LoadedModel
from bertology.options import ATTACK_METHODS, AttackMethod

METHODS: tuple[AttackMethod, ...] = ATTACK_METHODS
#: Keys of the JSON object :meth:`Attack.to_json` writes that mark a file as its output.
JSON_MARKS = ("method", "text", "tokens", "steps")
#: Positions whose swap estimates are computed at once (a [positions, vocabulary] block).
_POSITION_CHUNK = 32


@dataclass(frozen=True)
class AttackStep:
    """One input an attack reached, after one more change.

    positions: [m] the position in the original input each of its tokens comes from (a removed token's
        position is missing). ids, tokens: its m token ids and strings.
    text, text_b: each text's non-special tokens joined back into text by the tokenizer.
    label, probability: the prediction for this input and its probability; original_probability: the
        probability of the original prediction.
    position: the original position of the token this step removed or swapped; token: that token;
        replacement: the token swapped in (``None`` for a removal).
    """

    positions: list[int]
    ids: list[int]
    tokens: list[str]
    text: str
    text_b: str | None
    label: str
    probability: float
    original_probability: float
    position: int
    token: str
    replacement: str | None = None


@dataclass
class Attack(ExplainedInput):
    """What an attack did to one input.

    method: of :data:`METHODS`. text, text_b: the input. tokens: its n tokens; special: [n] bool.
    label, probability: the original prediction and its probability.
    steps: the inputs reached, one change each, in order (the reduced input, or the flipped one, last).
    """

    method: AttackMethod
    steps: list[AttackStep] = field(default_factory=list)

    @property
    def result(self) -> AttackStep | None:
        """The last input reached (``None``: the attack changed nothing)."""
        return self.steps[-1] if self.steps else None

    @property
    def flipped(self) -> bool:
        """Whether the last input reached has another prediction than the original."""
        return self.result is not None and self.result.label != self.label

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            **self.input_dict(),
            "flipped": self.flipped,
            "steps": [step.__dict__ for step in self.steps],
        }


@dataclass(frozen=True)
class _Candidate:
    """An input an attack may reach: the original positions it keeps, its ids, and the steps to it."""

    positions: tuple[int, ...]
    ids: tuple[int, ...]
    steps: tuple[AttackStep, ...] = ()


class _Original:
    """The attacked input: its encoding, model inputs ([1, n] each) and prediction."""

    def __init__(self, loaded: LoadedModel, text: Text, text_b: Text | None) -> None:
        self.loaded = loaded
        encoded = encode_one(loaded, text, text_b)
        self.tokens = encoded.tokens[0]
        self.special = np.asarray(encoded.special[0], dtype=bool)
        self.segments = np.asarray(encoded.segment_ids[0])
        self.inputs = loaded.model_inputs(encoded)
        self.ids = tuple(int(i) for i in self.inputs["input_ids"][0].tolist())
        probabilities = self.probabilities([_Candidate(tuple(range(len(self.ids))), self.ids)])[0]
        self.target = int(probabilities.argmax())
        self.probability = float(probabilities[self.target])

    def label(self, label_id: int) -> str:
        return str(self.loaded.model.config.id2label[label_id])

    def batch(self, candidates: list[_Candidate]) -> dict[str, torch.Tensor]:
        """Model inputs [k, m] of candidates of equal length m."""
        index = torch.as_tensor([c.positions for c in candidates], device=self.inputs["input_ids"].device)
        batch = {name: tensor[0][index] for name, tensor in self.inputs.items()}
        batch["input_ids"] = torch.as_tensor([c.ids for c in candidates], device=index.device)
        return batch

    def probabilities(self, candidates: list[_Candidate]) -> np.ndarray:
        """[k, labels] softmax probabilities for candidates of equal length."""
        with torch.no_grad():
            logits = self.loaded.model(**self.batch(candidates)).logits
        return torch.softmax(logits.float(), dim=-1).cpu().numpy()

    def log_probability_gradient(self, candidates: list[_Candidate]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(e [k, m, dim], ∂log p(y|x)/∂e [k, m, dim])`` of candidates of equal length."""
        batch = self.batch(candidates)
        embeddings = word_embeddings(self.loaded, batch)
        _, gradient = score_gradient(self.loaded, embeddings, batch, target_log_probability(self.target))
        return embeddings, gradient

    def step(
        self, candidate: _Candidate, probabilities: np.ndarray, position: int, replacement: int | None
    ) -> AttackStep:
        """The step that reached ``candidate`` (with its probabilities [labels]) by removing or swapping
        the token at original ``position``."""
        tokenizer = self.loaded.tokenizer
        tokens = tokenizer.convert_ids_to_tokens(list(candidate.ids))
        texts = [
            tokenizer.convert_tokens_to_string(
                [
                    token
                    for token, at in zip(tokens, candidate.positions, strict=True)
                    if self.segments[at] == segment and not self.special[at]
                ]
            )
            for segment in sorted(set(self.segments[~self.special].tolist()) or {0})
        ]
        label_id = int(probabilities.argmax())
        return AttackStep(
            positions=list(candidate.positions),
            ids=list(candidate.ids),
            tokens=tokens,
            text=texts[0],
            text_b=texts[1] if len(texts) > 1 else None,
            label=self.label(label_id),
            probability=float(probabilities[label_id]),
            original_probability=float(probabilities[self.target]),
            position=position,
            token=self.tokens[position],
            replacement=None if replacement is None else tokenizer.convert_ids_to_tokens(replacement),
        )

    def removable(self, candidate: _Candidate) -> list[int]:
        """Indices into ``candidate`` of the tokens input reduction may remove: not special, and not the
        last token left of its text."""
        positions = np.asarray(candidate.positions)
        ordinary = ~self.special[positions]
        left = {
            s: int(np.sum(ordinary & (self.segments[positions] == s))) for s in set(self.segments.tolist())
        }
        return [i for i, at in enumerate(positions) if ordinary[i] and left[int(self.segments[at])] > 1]


def input_reduction(original: _Original, beam: int) -> list[AttackStep]:
    """Feng et al.'s input reduction by beam search (module docstring); the steps to the reduced input."""
    kept = [_Candidate(tuple(range(len(original.ids))), original.ids)]
    while True:
        proposals: dict[tuple[int, ...], tuple[_Candidate, int]] = {}  # positions -> (proposal, removed)
        for candidate in kept:
            removable = original.removable(candidate)
            if not removable:
                continue
            embeddings, gradient = original.log_probability_gradient([candidate])
            importance = (embeddings * gradient).sum(-1)[0].float().cpu().numpy()
            for index in sorted(removable, key=lambda i: importance[i])[:beam]:
                positions = candidate.positions[:index] + candidate.positions[index + 1 :]
                ids = candidate.ids[:index] + candidate.ids[index + 1 :]
                proposal = _Candidate(positions, ids, candidate.steps)
                proposals.setdefault(positions, (proposal, candidate.positions[index]))
        if not proposals:
            break
        entries = list(proposals.values())
        probabilities = original.probabilities([proposal for proposal, _ in entries])
        holding = [number for number, p in enumerate(probabilities) if int(p.argmax()) == original.target]
        if not holding:
            break
        holding.sort(key=lambda number: -probabilities[number, original.target])  # stable: ties in order
        kept = []
        for number in holding[:beam]:
            proposal, removed = entries[number]
            step = original.step(proposal, probabilities[number], removed, None)
            kept.append(_Candidate(proposal.positions, proposal.ids, (*proposal.steps, step)))
    return list(kept[0].steps)


_WHOLE_WORDS: weakref.WeakKeyDictionary[Any, np.ndarray] = weakref.WeakKeyDictionary()


def replacement_entries(loaded: LoadedModel, *, subwords: bool = False) -> np.ndarray:
    """[vocabulary] bool: the entries HotFlip may swap in (module docstring): the whole words, or with
    ``subwords`` every entry that is not a special token. Rows of the embedding matrix beyond the
    tokenizer's vocabulary are never allowed. (The whole words of a tokenizer are worked out once.)"""
    tokenizer = loaded.tokenizer
    rows = loaded.model.get_input_embeddings().weight.shape[0]
    count = min(rows, len(tokenizer))
    allowed = np.zeros(rows, dtype=bool)
    allowed[:count] = True
    allowed[[i for i in loaded.special_ids if i < rows]] = False
    if subwords:
        return allowed
    if tokenizer not in _WHOLE_WORDS:
        words = [
            tokenizer.convert_tokens_to_string([token]).strip()
            for token in tokenizer.convert_ids_to_tokens(list(range(count)))
        ]
        candidates = [i for i, word in enumerate(words) if word.isalnum()]
        again = tokenizer([" " + words[i] for i in candidates], add_special_tokens=False)["input_ids"]
        whole = np.zeros(count, dtype=bool)
        whole[[i for i, ids in zip(candidates, again, strict=True) if ids == [i]]] = True
        _WHOLE_WORDS[tokenizer] = whole
    allowed[:count] &= _WHOLE_WORDS[tokenizer]
    return allowed


def hotflip(original: _Original, allowed: np.ndarray, max_flips: int | None) -> list[AttackStep]:
    """Ebrahimi et al.'s HotFlip, greedy (module docstring); the steps, each one more swap."""
    matrix = original.loaded.model.get_input_embeddings().weight.detach()  # [vocabulary, dim]
    barred = torch.as_tensor(~allowed, device=matrix.device)
    current = _Candidate(tuple(range(len(original.ids))), original.ids)
    open_positions = [i for i in range(len(original.ids)) if not original.special[i]]
    steps: list[AttackStep] = []
    while open_positions and (max_flips is None or len(steps) < max_flips):
        embeddings, gradient = original.log_probability_gradient([current])
        loss_gradient = -gradient[0]  # [m, dim] of L = -log p(y|x)
        best = (-float("inf"), -1, -1)
        for start in range(0, len(open_positions), _POSITION_CHUNK):
            chunk = open_positions[start : start + _POSITION_CHUNK]
            rows = loss_gradient[chunk].to(matrix.dtype)
            rise = rows @ matrix.T - (rows * embeddings[0, chunk].to(matrix.dtype)).sum(-1, keepdim=True)
            rise[:, barred] = -torch.inf
            rise[torch.arange(len(chunk)), torch.as_tensor([current.ids[i] for i in chunk])] = -torch.inf
            value, flat = rise.flatten().max(0)
            if float(value) > best[0]:
                best = (float(value), chunk[int(flat) // rise.shape[1]], int(flat) % rise.shape[1])
        _, position, entry = best
        if position < 0:
            break
        ids = (*current.ids[:position], entry, *current.ids[position + 1 :])
        current = _Candidate(current.positions, ids)
        probabilities = original.probabilities([current])[0]
        steps.append(original.step(current, probabilities, position, entry))
        open_positions.remove(position)
        if int(probabilities.argmax()) != original.target:
            break
    return steps


def attack(
    loaded: LoadedModel,
    text: Text,
    text_b: Text | None = None,
    *,
    method: AttackMethod,
    beam: int = 3,
    max_flips: int | None = None,
    subwords: bool = False,
) -> Attack:
    """Explain ``loaded``'s (a classifier) prediction for ``text`` (or the pair) by changing the input
    with ``method`` (module docstring). beam: input reduction's beam width (AllenNLP Interpret's 3).
    max_flips: most swaps of HotFlip (``None``: until the prediction changes or every token is swapped);
    subwords: let HotFlip swap in any non-special entry, not only whole words.

    Raises:
        BertologyError: an unknown method, a beam below 1, or ``max_flips`` below 1.
    """
    if method not in METHODS:
        raise BertologyError(f"Unknown attack {method!r}; use {' or '.join(METHODS)}.")
    if beam < 1:
        raise BertologyError(f"Input reduction's beam must hold at least one input, not {beam}.")
    if max_flips is not None and max_flips < 1:
        raise BertologyError(f"HotFlip needs at least one swap, not {max_flips}.")
    with eval_mode(loaded):
        original = _Original(loaded, text, text_b)
        if method == "input-reduction":
            steps = input_reduction(original, beam)
        else:
            steps = hotflip(original, replacement_entries(loaded, subwords=subwords), max_flips)
    return Attack(
        method=method,
        text=as_string(text),
        text_b=None if text_b is None else as_string(text_b),
        tokens=original.tokens,
        special=original.special,
        label=original.label(original.target),
        probability=original.probability,
        steps=steps,
    )
