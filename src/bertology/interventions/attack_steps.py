"""What an attack that explains by changing the input works on and leaves: the attacked input
(:class:`AttackedInput`: its encoding, model inputs and prediction), the inputs it may reach
(:class:`Candidate`) and the steps it took (:class:`AttackStep`, :class:`Attack`), for the methods of
both conventions (:mod:`~bertology.interventions.attacks`, :mod:`~bertology.interventions.allennlp_attacks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bertology.corpus.encoding import Text
from bertology.interventions.embeddings import (
    cross_entropy,
    logits_gradient,
    score_gradient,
    target_log_probability,
    word_embeddings,
)
from bertology.interventions.explained import ExplainedInput
from bertology.interventions.saliency import encode_one
from bertology.models.loading import LoadedModel
from bertology.options import AttackMethod, InterpretConvention


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

    method: ``input-reduction`` or ``hotflip``. text, text_b: the input. tokens: its n tokens;
    special: [n] bool. label, probability: the original prediction and its probability.
    steps: the inputs reached, one change each, in order (the reduced input, or the flipped one, last).
    convention: whose definition of the method made them, ``bertology`` or ``allennlp``.
    """

    method: AttackMethod
    steps: list[AttackStep] = field(default_factory=list)
    convention: InterpretConvention = "bertology"

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
            "convention": self.convention,
            **self.input_dict(),
            "flipped": self.flipped,
            "steps": [step.__dict__ for step in self.steps],
        }


@dataclass(frozen=True)
class Candidate:
    """An input an attack may reach: the original positions it keeps, its ids, and the steps to it."""

    positions: tuple[int, ...]
    ids: tuple[int, ...]
    steps: tuple[AttackStep, ...] = ()


class AttackedInput:
    """The attacked input: its encoding, model inputs ([1, n] each) and prediction."""

    def __init__(self, loaded: LoadedModel, text: Text, text_b: Text | None) -> None:
        self.loaded = loaded
        encoded = encode_one(loaded, text, text_b)
        self.tokens = encoded.tokens[0]
        self.special = np.asarray(encoded.special[0], dtype=bool)
        self.segments = np.asarray(encoded.segment_ids[0])
        self.inputs = loaded.model_inputs(encoded)
        self.ids = tuple(int(i) for i in self.inputs["input_ids"][0].tolist())
        probabilities = self.probabilities([Candidate(tuple(range(len(self.ids))), self.ids)])[0]
        self.target = int(probabilities.argmax())
        self.probability = float(probabilities[self.target])

    def label(self, label_id: int) -> str:
        return str(self.loaded.model.config.id2label[label_id])

    def batch(self, candidates: list[Candidate]) -> dict[str, torch.Tensor]:
        """Model inputs [k, m] of candidates of equal length m."""
        index = torch.as_tensor([c.positions for c in candidates], device=self.inputs["input_ids"].device)
        batch = {name: tensor[0][index] for name, tensor in self.inputs.items()}
        batch["input_ids"] = torch.as_tensor([c.ids for c in candidates], device=index.device)
        return batch

    def probabilities(self, candidates: list[Candidate]) -> np.ndarray:
        """[k, labels] softmax probabilities for candidates of equal length."""
        with torch.no_grad():
            logits = self.loaded.model(**self.batch(candidates)).logits
        return torch.softmax(logits.float(), dim=-1).cpu().numpy()

    def log_probability_gradient(self, candidates: list[Candidate]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(e [k, m, dim], ∂log p(y|x)/∂e [k, m, dim])`` of candidates of equal length."""
        batch = self.batch(candidates)
        embeddings = word_embeddings(self.loaded, batch)
        _, gradient = score_gradient(self.loaded, embeddings, batch, target_log_probability(self.target))
        return embeddings, gradient

    def loss_gradient(self, candidate: Candidate) -> tuple[np.ndarray, torch.Tensor]:
        """``(probabilities [labels], ∂L/∂e [m, dim])`` of one candidate from one forward
        pass, ``L = −log p(y|x)`` the cross-entropy of the original prediction ``y`` (what AllenNLP's
        ``Predictor.get_gradients`` gives for an instance labelled ``y``)."""
        batch = self.batch([candidate])
        embeddings = word_embeddings(self.loaded, batch)
        logits, gradient = logits_gradient(self.loaded, embeddings, batch, cross_entropy(self.target))
        probabilities = torch.softmax(logits[0].float(), dim=-1).cpu().numpy()
        return probabilities, gradient[0]

    def step(
        self, candidate: Candidate, probabilities: np.ndarray, position: int, replacement: int | None
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

    def removable(self, candidate: Candidate) -> list[int]:
        """Indices into ``candidate`` of the tokens input reduction may remove: not special, and not the
        last token left of its text."""
        positions = np.asarray(candidate.positions)
        ordinary = ~self.special[positions]
        left = {
            s: int(np.sum(ordinary & (self.segments[positions] == s))) for s in set(self.segments.tolist())
        }
        return [i for i, at in enumerate(positions) if ordinary[i] and left[int(self.segments[at])] > 1]
