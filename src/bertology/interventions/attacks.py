"""Explanations by changing the input: input reduction and HotFlip, in one of two conventions
(:data:`~bertology.interventions.saliency.CONVENTIONS`): bertology's own (the default, described here)
or AllenNLP Interpret's (``convention="allennlp"``: :mod:`~bertology.interventions.allennlp_attacks`).

In bertology's convention both start from the classifier's prediction ``y`` for the input and change
its tokens (word pieces), never a special token ([CLS], [SEP], <s>, ...). Both score by ``log p(y|x)``,
the log-softmax of the original prediction, and its gradient with respect to the word embeddings
``e_i`` (:mod:`~bertology.interventions.embeddings`). Each method of :data:`METHODS`:

- ``input-reduction`` (Feng et al. 2018, "Pathologies of Neural Models Make Interpretations
  Difficult"): remove the least important token again and again while the prediction stays ``y``.
  A token's importance is the paper's gradient estimate of what removing it costs,
  ``e_i · ∂log p(y|x)/∂e_i`` (input × gradient); the least important has the lowest. Beam search as in
  the paper: each of the ``beam`` inputs kept proposes removing each of its ``beam`` least important
  tokens; of the proposals the model still gives ``y``, the ``beam`` most confident go on. The search
  ends when no proposal keeps ``y`` (or each text is down to one token); the reduced input is the most
  confident of the last inputs that kept it, and its steps are the path that led there. (AllenNLP's
  ranks tokens by their gradient's norm instead, may remove special tokens, and keeps the first
  ``beam`` proposals, not the most confident.)
- ``hotflip`` (Ebrahimi et al. 2018, "HotFlip: White-Box Adversarial Examples for Text
  Classification"): the gradient of the loss ``L = −log p(y|x)`` with respect to the one-hot input,
  ``∂L/∂v[i, w] = E[w] · ∂L/∂e_i`` (``E``: the word-embedding matrix), estimates the loss's change when
  token ``i`` (entry ``a``) is swapped for entry ``b`` as ``(E[b] − E[a]) · ∂L/∂e_i``. Each step makes
  the swap of largest estimate over every position not yet swapped and every allowed entry, runs the
  model again, and the attack stops once the prediction changes (or after ``max_flips`` swaps, or with
  no position left). Allowed entries: whole words, the non-special vocabulary entries that decode alone
  to letters and digits only and that the tokenizer gives back for that word after a space (no word
  pieces such as ``##ing``, no punctuation, no [unused] slots); with ``subwords`` every non-special
  entry. (AllenNLP's picks the position first, by its gradient's norm, then the entry; it allows every
  entry whose vocabulary string is alphanumeric and skips its own list of tokens.)
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from bertology.corpus.encoding import Text
from bertology.errors import BertologyError
from bertology.interventions import allennlp_attacks
from bertology.interventions.attack_steps import Attack, AttackedInput, AttackStep, Candidate
from bertology.interventions.data import eval_mode
from bertology.interventions.explained import as_string
from bertology.interventions.saliency import check_convention
from bertology.models.loading import LoadedModel
from bertology.options import ATTACK_METHODS, AttackMethod, InterpretConvention

METHODS: tuple[AttackMethod, ...] = ATTACK_METHODS
#: Keys of the JSON object :meth:`Attack.to_json` writes that mark a file as its output.
JSON_MARKS = ("method", "text", "tokens", "steps")
#: Positions whose swap estimates are computed at once (a [positions, vocabulary] block).
_POSITION_CHUNK = 32


def input_reduction(original: AttackedInput, beam: int) -> list[AttackStep]:
    """Feng et al.'s input reduction by beam search (module docstring); the steps to the reduced input."""
    kept = [Candidate(tuple(range(len(original.ids))), original.ids)]
    while True:
        proposals: dict[tuple[int, ...], tuple[Candidate, int]] = {}  # positions -> (proposal, removed)
        for candidate in kept:
            removable = original.removable(candidate)
            if not removable:
                continue
            embeddings, gradient = original.log_probability_gradient([candidate])
            importance = (embeddings * gradient).sum(-1)[0].float().cpu().numpy()
            for index in sorted(removable, key=lambda i: importance[i])[:beam]:
                positions = candidate.positions[:index] + candidate.positions[index + 1 :]
                ids = candidate.ids[:index] + candidate.ids[index + 1 :]
                proposal = Candidate(positions, ids, candidate.steps)
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
            kept.append(Candidate(proposal.positions, proposal.ids, (*proposal.steps, step)))
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


def hotflip(original: AttackedInput, allowed: np.ndarray, max_flips: int | None) -> list[AttackStep]:
    """Ebrahimi et al.'s HotFlip, greedy (module docstring); the steps, each one more swap."""
    matrix = original.loaded.model.get_input_embeddings().weight.detach()  # [vocabulary, dim]
    barred = torch.as_tensor(~allowed, device=matrix.device)
    current = Candidate(tuple(range(len(original.ids))), original.ids)
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
        current = Candidate(current.positions, ids)
        probabilities = original.probabilities([current])[0]
        steps.append(original.step(current, probabilities, position, entry))
        open_positions.remove(position)
        if int(probabilities.argmax()) != original.target:
            break
    return steps


def check_attack_settings(
    method: str, beam: int, max_flips: int | None, subwords: bool, convention: str
) -> None:
    """Check :func:`attack`'s settings before any model runs.

    Raises:
        BertologyError: what :func:`attack` raises for its settings.
    """
    check_convention(convention)
    if subwords and convention == "allennlp":
        raise BertologyError(
            "AllenNLP's HotFlip swaps in alphanumeric vocabulary entries only; subwords is bertology's "
            "option."
        )
    if method not in METHODS:
        raise BertologyError(f"Unknown attack {method!r}; use {' or '.join(METHODS)}.")
    if beam < 1:
        raise BertologyError(f"Input reduction's beam must hold at least one input, not {beam}.")
    if max_flips is not None and max_flips < 1:
        raise BertologyError(f"HotFlip needs at least one swap, not {max_flips}.")


def attack(
    loaded: LoadedModel,
    text: Text,
    text_b: Text | None = None,
    *,
    method: AttackMethod,
    beam: int = 3,
    max_flips: int | None = None,
    subwords: bool = False,
    convention: InterpretConvention = "bertology",
) -> Attack:
    """Explain ``loaded``'s (a classifier) prediction for ``text`` (or the pair) by changing the input
    with ``method`` as ``convention`` defines it (module docstring). beam: input reduction's beam width
    (AllenNLP Interpret's 3). max_flips: most swaps of HotFlip (``None``: until the prediction changes or
    every token is swapped); subwords: let bertology's HotFlip swap in any non-special entry, not only
    whole words.

    Raises:
        BertologyError: an unknown method or convention, a beam below 1, ``max_flips`` below 1, or
            ``subwords`` in the allennlp convention.
    """
    check_attack_settings(method, beam, max_flips, subwords, convention)
    with eval_mode(loaded):
        original = AttackedInput(loaded, text, text_b)
        if convention == "allennlp":
            steps = (
                allennlp_attacks.input_reduction(original, beam)
                if method == "input-reduction"
                else allennlp_attacks.hotflip(original, max_flips)
            )
        elif method == "input-reduction":
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
        convention=convention,
    )
