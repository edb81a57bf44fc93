"""Which input tokens a classifier's prediction rests on: signed per-token attributions.

``f`` is the logit of the predicted class; ``x`` the input's word (token) embeddings ``[tokens, dim]``,
to which the model adds its own position and segment embeddings before a LayerNorm. Each method gives
one signed number per token ``i``:

- ``gradient``: ``‖∂f/∂x[i]‖₂ · sign(x[i] · ∂f/∂x[i])``, the size of the plain gradient (Simonyan et al.
  2014), signed by whether growing the token's own embedding raises ``f``. (Summing the gradient's
  components instead would give about 0: the LayerNorm ignores a shift of all components alike.)
- ``gradient_x_input``: ``Σ_d x[i, d] · ∂f/∂x[i, d]`` (Shrikumar et al. 2016), the slope of ``f`` as the
  token's embedding is scaled up.
- ``integrated_gradients``: ``Σ_d (x − x')[i, d] · ∫₀¹ ∂f/∂x[i, d](x' + α (x − x')) dα``
  (Sundararajan et al. 2017). The baseline ``x'`` is the input with every non-special token replaced by
  the [PAD] token's embedding, special tokens ([CLS], [SEP]) kept, the attention mask unchanged; so the
  special tokens get 0 and the attributions sum to ``f(x) − f(x')`` (completeness), up to the error of
  the integral. The integral is a Gauss–Legendre quadrature with ``steps`` points.

Positive values push towards the predicted class, negative values away from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.inputs import Text, encode
from bertology.interventions.data import eval_mode
from bertology.models import LoadedModel
from bertology.options import MAX_IG_STEPS

METHODS = ("gradient", "gradient_x_input", "integrated_gradients")
#: Keys of the JSON object :meth:`Explanation.to_json` writes that mark a file as its output (so a later
#: run may replace it).
JSON_MARKS = ("text", "tokens", "label", "attributions")


@dataclass
class Explanation:
    """Attributions of one input's prediction.

    text, text_b: the input (``text_b`` ``None`` for a single text).
    tokens: the n token strings. special: [n] bool, True for special tokens.
    label: the predicted label's name; probability: its softmax probability.
    attributions: method name (:data:`METHODS`) -> [n] float, signed, in logit units.
    logit, baseline_logit: ``f(x)`` and ``f(x')``, the predicted class's logit for the input and the
        baseline. steps: quadrature points of integrated gradients.
    """

    text: str
    text_b: str | None
    tokens: list[str]
    special: np.ndarray
    label: str
    probability: float
    attributions: dict[str, np.ndarray]
    logit: float
    baseline_logit: float
    steps: int

    @property
    def completeness_gap(self) -> float:
        """``Σ integrated gradients − (f(x) − f(x'))``: 0 for an exact integral."""
        total = float(self.attributions["integrated_gradients"].sum())
        return total - (self.logit - self.baseline_logit)

    def to_dict(self) -> dict[str, object]:
        return {
            "text": self.text,
            "text_b": self.text_b,
            "tokens": self.tokens,
            "special": self.special.tolist(),
            "label": self.label,
            "probability": self.probability,
            "logit": self.logit,
            "baseline_logit": self.baseline_logit,
            "completeness_gap": self.completeness_gap,
            "steps": self.steps,
            "attributions": {name: values.tolist() for name, values in self.attributions.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


def _as_string(text: Text) -> str:
    return text if isinstance(text, str) else " ".join(text)


def _logits(loaded: LoadedModel, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[k, labels] logits for ``k`` embedded copies ``[k, n, dim]`` of the one input ``inputs``."""
    others = {
        name: tensor.expand(len(embeddings), -1) for name, tensor in inputs.items() if name != "input_ids"
    }
    return loaded.model(inputs_embeds=embeddings, **others).logits


def explain(
    loaded: LoadedModel,
    text: Text,
    text_b: Text | None = None,
    *,
    steps: int = 50,
    batch_size: int = 16,
) -> Explanation:
    """Attributions of ``loaded``'s (a classifier) prediction for ``text`` (or the pair) by every method of
    :data:`METHODS` (see the module docstring). batch_size: interpolated inputs per forward pass.

    Raises:
        BertologyError: ``steps`` outside 1 to :data:`~bertology.options.MAX_IG_STEPS`, or a model without
            a [PAD] token.
    """
    if not 1 <= steps <= MAX_IG_STEPS:
        raise BertologyError(
            f"Integrated gradients needs at least one step and at most {MAX_IG_STEPS}, not {steps}."
        )
    pad_id = loaded.tokenizer.pad_token_id
    if pad_id is None:
        raise BertologyError(f"The tokenizer of '{loaded.name}' has no [PAD] token for the baseline.")
    encoded = encode(
        loaded.tokenizer, [text], None if text_b is None else [text_b], max_length=loaded.max_length
    )
    inputs = loaded.model_inputs(encoded)
    special = np.asarray(encoded.special[0], dtype=bool)
    embed = loaded.model.get_input_embeddings()
    with eval_mode(loaded), torch.enable_grad():
        with torch.no_grad():
            x = embed(inputs["input_ids"])  # [1, n, dim]
            baseline_ids = torch.where(
                torch.as_tensor(special, device=x.device)[None], inputs["input_ids"], pad_id
            )
            baseline = embed(baseline_ids)
            logits = _logits(loaded, x, inputs)
        target = int(logits[0].argmax())
        point = x.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(_logits(loaded, point, inputs)[:, target].sum(), point)
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        alphas, weights = (nodes + 1) / 2, weights / 2  # on [0, 1]; the weights sum to 1
        integral = torch.zeros_like(x)
        for start in range(0, steps, batch_size):
            alpha = torch.as_tensor(alphas[start : start + batch_size], dtype=x.dtype, device=x.device)
            path = (baseline + alpha[:, None, None] * (x - baseline)).requires_grad_(True)
            target_logits = _logits(loaded, path, inputs)[:, target]
            weight = torch.as_tensor(weights[start : start + batch_size], dtype=x.dtype, device=x.device)
            (path_gradient,) = torch.autograd.grad((target_logits * weight).sum(), path)
            integral += path_gradient.sum(0, keepdim=True)
        with torch.no_grad():
            baseline_logit = float(_logits(loaded, baseline, inputs)[0, target])
    attributions = {
        "gradient": gradient.norm(dim=-1)[0] * torch.sign((gradient * x).sum(-1)[0]),
        "gradient_x_input": (gradient * x).sum(-1)[0],
        "integrated_gradients": ((x - baseline) * integral).sum(-1)[0],
    }
    probabilities = torch.softmax(logits[0].float(), dim=-1)
    return Explanation(
        text=_as_string(text),
        text_b=None if text_b is None else _as_string(text_b),
        tokens=encoded.tokens[0],
        special=special,
        label=str(loaded.model.config.id2label[target]),
        probability=float(probabilities[target]),
        attributions={name: values.detach().float().cpu().numpy() for name, values in attributions.items()},
        logit=float(logits[0, target]),
        baseline_logit=baseline_logit,
        steps=steps,
    )
