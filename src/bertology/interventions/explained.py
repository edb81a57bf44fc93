"""What every explanation of one input's prediction names: the input, its tokens and the target.

:class:`~bertology.interventions.saliency.Explanation`, :class:`~bertology.interventions.attacks.Attack`
and :class:`~bertology.interventions.attention_attribution.AttentionAttribution` extend it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertology.corpus.encoding import Text


def as_string(text: Text) -> str:
    """A text given as words, joined by spaces; a string as is."""
    return text if isinstance(text, str) else " ".join(text)


@dataclass
class ExplainedInput:
    """One input and the prediction explained.

    text, text_b: the input (``text_b`` ``None`` for a single text). tokens: the n token strings.
    special: [n] bool, True for special tokens. label: the target's name; probability: its probability.
    """

    text: str
    text_b: str | None
    tokens: list[str]
    special: np.ndarray
    label: str
    probability: float

    def input_dict(self) -> dict[str, Any]:
        """These fields as JSON-ready values (what each result's ``to_dict`` starts with)."""
        return {
            "text": self.text,
            "text_b": self.text_b,
            "tokens": self.tokens,
            "special": self.special.tolist(),
            "label": self.label,
            "probability": self.probability,
        }

    def to_dict(self) -> dict[str, Any]:
        return self.input_dict()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)
