"""Self-attention attribution (Hao et al. 2021, "Self-Attention Attribution: Interpreting Information
Interactions Inside Transformer", AAAI): integrated gradients with respect to each head's attention map.

For one input, let ``A`` be the attention map of layer ``l`` (``[heads, query, key]``, the softmax output)
and ``F(X)`` the classifier's output probability (softmax, 0..1) of the target class when layer ``l``'s
attention is replaced by ``X`` (every other layer computed as usual from its own inputs). Then

    Attr(A) = A ⊙ ∫₀¹ ∂F(αA)/∂A dα                              [heads, query, key], probability units

and, by the completeness of integrated gradients, ``Σ Attr(A) = F(A) − F(0·A)`` for each layer, up to the
error of the integral. The integral is the paper's Riemann sum ``(1/m) Σ_{k=1..m} ∂F((k/m)A)/∂A`` with
``m = 20`` (``rule="riemann"``, the default), or a Gauss–Legendre quadrature with ``steps`` points
(``rule="gauss-legendre"``, exact for smaller ``steps``).

How it is computed: a head's output is ``A_h V_h``, so attention scaled by ``α`` is the head's output
scaled by ``α``: a head gate of ``α`` on every head of layer ``l`` (:func:`~bertology.interventions.gates.
head_gates`). The gradient that autograd gives for the recorded (unscaled) map ``A`` of a pass gated by ``α``
is ``α · ∂F(X)/∂X`` at ``X = αA``, so each step's gradient is divided by its ``α`` (never 0: neither rule
evaluates at ``α = 0``). One forward and backward pass runs many (layer, step) rows of the same input at
once, each row with its own gates (``[rows, layers, heads]``).

Per-head importance over a data set (the paper's section 4.1): ``I_h = E_x[max(Attr_h(A))]``, the
largest entry of the head's attribution matrix, averaged over the examples, with ``F`` the probability
of each example's gold label (as the authors' released code does); heads are pruned lowest first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from bertology.corpus.encoding import Text, encode
from bertology.errors import BertologyError
from bertology.interventions.attribution_tree import AttributionTree, attribution_tree
from bertology.interventions.curves import Head, lowest_first
from bertology.interventions.data import LabelledTexts, batches, eval_mode
from bertology.interventions.explained import ExplainedInput, as_string
from bertology.interventions.partial import logits_from_layer, record_layer_inputs
from bertology.models.hook import recording
from bertology.models.loading import LoadedModel, require_encoder
from bertology.models.surgery import pruned_heads
from bertology.options import INTEGRATION_RULES, MAX_IG_STEPS, IntegrationRule
from bertology.progress import Progress
from bertology.stats.base import head_index_frame

#: Integration rules: the paper's right Riemann sum, or Gauss–Legendre quadrature.
RULES = INTEGRATION_RULES
#: The paper's number of Riemann steps.
DEFAULT_STEPS = 20
#: (layer, step) rows per forward and backward pass.
DEFAULT_ROWS_PER_PASS = 20
#: Keys of the JSON object :meth:`AttentionAttribution.to_json` writes that mark a file as its output.
JSON_MARKS = ("text", "tokens", "label", "head_scores", "tree")


def require_every_head(loaded: LoadedModel) -> None:
    """Refuse a model that is no encoder, or whose heads were structurally pruned (its layers' attention
    maps no longer have one row per head of the model).

    Raises:
        BertologyError: either case, in one sentence.
    """
    require_encoder(loaded, "Self-attention attribution")
    if pruned_heads(loaded.model.config):
        raise BertologyError(
            f"'{loaded.name}' has structurally pruned heads; attribute the model it was pruned from (a head "
            "gate of 0 removes a head there)."
        )


def integration_points(steps: int, rule: IntegrationRule = "riemann") -> tuple[np.ndarray, np.ndarray]:
    """(alphas, weights), each ``[steps]``, with ``∫₀¹ g(α) dα ≈ Σ weights · g(alphas)``.

    riemann: ``alphas = k/steps`` for ``k = 1..steps``, weights ``1/steps`` (Hao et al.'s sum).
    gauss-legendre: the Gauss–Legendre nodes mapped to (0, 1); the weights sum to 1.

    Raises:
        BertologyError: an unknown rule, or ``steps`` outside 1 to :data:`~bertology.options.MAX_IG_STEPS`.
    """
    if rule not in RULES:
        raise BertologyError(f"Unknown integration rule '{rule}'; use {' or '.join(RULES)}.")
    if not 1 <= steps <= MAX_IG_STEPS:
        raise BertologyError(f"Attribution needs at least one step and at most {MAX_IG_STEPS}, not {steps}.")
    if rule == "riemann":
        return np.arange(1, steps + 1) / steps, np.full(steps, 1.0 / steps)
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    return (nodes + 1) / 2, weights / 2


@dataclass(frozen=True)
class InputAttribution:
    """The attribution of one encoded input (tensors on the CPU, float32).

    attention: [layers, heads, n, n] the attention maps ``A``. attribution: [layers, heads, n, n]
    ``Attr(A)`` in probability units. output: ``F(A)``, the target's probability. zeroed: [layers]
    ``F(0·A)``, the target's probability with that layer's attention set to 0 (every head's output 0).
    """

    attention: torch.Tensor
    attribution: torch.Tensor
    output: float
    zeroed: torch.Tensor


def _rows_of(inputs: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """``rows`` copies of the one-input batch ``inputs`` ([1, n] each)."""
    return {name: tensor.expand(rows, *tensor.shape[1:]) for name, tensor in inputs.items()}


def attribute_input(
    loaded: LoadedModel,
    inputs: dict[str, torch.Tensor],
    target: int,
    *,
    steps: int = DEFAULT_STEPS,
    rule: IntegrationRule = "riemann",
    rows_per_pass: int = DEFAULT_ROWS_PER_PASS,
) -> InputAttribution:
    """Self-attention attribution of every layer and head for one input (see the module docstring).

    inputs: the model's tensors for one unpadded input ([1, n] each). target: the class whose probability
    is ``F``. rows_per_pass: integration steps of one layer in one forward and backward pass (memory grows
    with it). Scaling layer ``l`` leaves layers ``0..l-1`` as they were, so they run once, in a clean pass
    whose hidden states the passes of layer ``l`` start from (:mod:`~bertology.interventions.partial`).
    """
    alphas, weights = integration_points(steps, rule)
    layers, heads = loaded.num_layers, loaded.num_heads
    device = loaded.device
    with eval_mode(loaded):
        with torch.no_grad():
            with recording() as recorder:
                recorded = record_layer_inputs(loaded, inputs)
            output = float(torch.softmax(recorded.logits[0].float(), dim=-1)[target])
            attention = torch.stack([call.probs[0].float() for call in recorder.calls]).cpu()
            zeroed = torch.empty(layers)
            for layer in range(layers):
                gates = torch.ones(layers, heads, device=device)
                gates[layer] = 0.0
                logits = logits_from_layer(loaded, inputs, recorded, layer, gates)
                zeroed[layer] = torch.softmax(logits[0].float(), dim=-1)[target].cpu()
        integral = torch.zeros_like(attention)
        for layer in range(layers):
            for start in range(0, steps, rows_per_pass):
                alpha = torch.as_tensor(alphas[start : start + rows_per_pass], dtype=torch.float32)
                scale = torch.as_tensor(weights[start : start + rows_per_pass], dtype=torch.float32) / alpha
                rows = len(alpha)
                gates = torch.ones(rows, layers, heads)
                gates[:, layer] = alpha[:, None]
                hidden = [state.expand(rows, *state.shape[1:]) for state in recorded.hidden]
                with torch.enable_grad(), recording(keep_graph=True) as recorder:
                    logits = logits_from_layer(
                        loaded,
                        _rows_of(inputs, rows),
                        replace(recorded, hidden=hidden),
                        layer,
                        gates.to(device),
                    )
                probability = torch.softmax(logits.float(), dim=-1)[:, target]
                (gradient,) = torch.autograd.grad(
                    (probability * scale.to(device)).sum(), recorder.calls[0].probs
                )
                integral[layer] += gradient.float().sum(0).cpu()
    return InputAttribution(attention, attention * integral, output, zeroed)


def _label_index(loaded: LoadedModel, label: str | int | None, logits: torch.Tensor) -> int:
    """The class of ``label`` (a name of ``config.id2label`` or an index), or the predicted class."""
    if label is None:
        return int(logits.argmax())
    names = {str(name): int(index) for index, name in loaded.model.config.id2label.items()}
    if isinstance(label, str) and label in names:
        return names[label]
    if isinstance(label, int) and 0 <= label < len(names):
        return label
    raise BertologyError(f"'{loaded.name}' has no label {label!r}; its labels are {', '.join(names)}.")


@dataclass
class AttentionAttribution(ExplainedInput):
    """Self-attention attribution of one input's prediction (:func:`attribute`).

    text, text_b: the input (``text_b`` ``None`` for a single text). tokens: the n token strings.
    special: [n] bool, True for special tokens. label: the target class's name (predicted unless given);
    predicted: the predicted class's name. probability: ``F(A)``, the target's probability.
    attention, attribution: [layers, heads, n, n] (rows: query tokens, columns: key tokens); attribution
    in probability units. zeroed: [layers] ``F(0·A)`` per layer. steps, rule: the integral's.
    seconds: wall time of the attribution.
    """

    predicted: str
    attention: np.ndarray
    attribution: np.ndarray
    zeroed: np.ndarray
    steps: int
    rule: str
    seconds: float

    @property
    def completeness_gap(self) -> np.ndarray:
        """[layers] ``Σ Attr(A) − (F(A) − F(0·A))``: 0 for an exact integral."""
        return self.attribution.sum(axis=(1, 2, 3)) - (self.probability - self.zeroed)

    @property
    def head_scores(self) -> np.ndarray:
        """[layers, heads] the largest entry of each head's attribution matrix (the paper's head score)."""
        return self.attribution.max(axis=(2, 3))

    def top_interactions(self, count: int = 20) -> pd.DataFrame:
        """The ``count`` largest attributions: ``layer``, ``head``, ``query``, ``key`` (token positions),
        ``query_token``, ``key_token``, ``attention``, ``attribution``."""
        flat = np.argsort(self.attribution.ravel(), kind="stable")[::-1][:count]
        layer, head, query, key = np.unravel_index(flat, self.attribution.shape)
        return pd.DataFrame(
            {
                "layer": layer,
                "head": head,
                "query": query,
                "key": key,
                "query_token": [self.tokens[index] for index in query],
                "key_token": [self.tokens[index] for index in key],
                "attention": self.attention[layer, head, query, key],
                "attribution": self.attribution[layer, head, query, key],
            }
        )

    def tree(self, threshold: float = 0.4) -> AttributionTree:
        """The paper's attribution tree of this input (:func:`attribution_tree`)."""
        return attribution_tree(self.attribution, threshold)

    def to_dict(self, threshold: float = 0.4) -> dict[str, object]:
        """Everything but the [layers, heads, n, n] arrays (see :meth:`save_arrays`)."""
        tree = self.tree(threshold)
        return {
            **self.input_dict(),
            "predicted": self.predicted,
            "zeroed": self.zeroed.tolist(),
            "completeness_gap": self.completeness_gap.tolist(),
            "steps": self.steps,
            "rule": self.rule,
            "seconds": self.seconds,
            "head_scores": self.head_scores.tolist(),
            "tree": tree.to_dict(),
        }

    def to_json(self, threshold: float = 0.4) -> str:
        return json.dumps(self.to_dict(threshold), indent=2, ensure_ascii=False)


def attribute(
    loaded: LoadedModel,
    text: Text,
    text_b: Text | None = None,
    *,
    label: str | int | None = None,
    steps: int = DEFAULT_STEPS,
    rule: IntegrationRule = "riemann",
    rows_per_pass: int = DEFAULT_ROWS_PER_PASS,
) -> AttentionAttribution:
    """Self-attention attribution of the classifier ``loaded``'s output for ``text`` (or the pair), every
    layer and head (see the module docstring).

    label: the class whose probability is attributed (a label name or index); default: the predicted one.

    Raises:
        BertologyError: a model that is no encoder classifier, an unknown label, rule or number of steps.
    """
    require_every_head(loaded)
    integration_points(steps, rule)  # a clear error before any pass
    started = time.perf_counter()
    encoded = encode(
        loaded.tokenizer, [text], None if text_b is None else [text_b], max_length=loaded.max_length
    )
    inputs = loaded.model_inputs(encoded)
    with torch.no_grad(), eval_mode(loaded):
        logits = loaded.model(**inputs).logits[0]
    target = _label_index(loaded, label, logits)
    result = attribute_input(loaded, inputs, target, steps=steps, rule=rule, rows_per_pass=rows_per_pass)
    id2label = loaded.model.config.id2label
    return AttentionAttribution(
        text=as_string(text),
        text_b=None if text_b is None else as_string(text_b),
        tokens=encoded.tokens[0],
        special=np.asarray(encoded.special[0], dtype=bool),
        label=str(id2label[target]),
        predicted=str(id2label[int(logits.argmax())]),
        probability=result.output,
        attention=result.attention.numpy(),
        attribution=result.attribution.numpy(),
        zeroed=result.zeroed.numpy(),
        steps=steps,
        rule=rule,
        seconds=time.perf_counter() - started,
    )


@dataclass
class AttributionImportance:
    """Hao et al.'s head importance over a data set.

    scores: [layers, heads] mean over examples of the largest entry of the head's attribution matrix
        (probability units), ``F`` the probability of the example's gold label.
    examples: how many examples; seconds: wall time; steps, rule: the integral's.
    """

    scores: np.ndarray
    examples: int
    steps: int
    rule: str
    seconds: float

    def removal_order(self) -> list[Head]:
        """Every head, lowest attribution score first."""
        return lowest_first(self.scores)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``layer``, ``head`` (0-based), ``attribution``."""
        return pd.DataFrame({**head_index_frame(*self.scores.shape), "attribution": self.scores.ravel()})


def attribution_importance(
    loaded: LoadedModel,
    data: LabelledTexts,
    *,
    steps: int = DEFAULT_STEPS,
    rule: IntegrationRule = "riemann",
    rows_per_pass: int = DEFAULT_ROWS_PER_PASS,
    on_progress: Progress | None = None,
) -> AttributionImportance:
    """Hao et al.'s importance of every head of the classifier ``loaded`` over ``data`` (module
    docstring), one example at a time. on_progress: told the examples done, out of ``len(data)``.

    Raises:
        BertologyError: a model that is no encoder, an unknown rule or number of steps.
    """
    require_every_head(loaded)
    integration_points(steps, rule)
    started = time.perf_counter()
    total = np.zeros((loaded.num_layers, loaded.num_heads))
    for done, batch in enumerate(batches(loaded, data, batch_size=1), start=1):
        result = attribute_input(
            loaded, batch.inputs, int(batch.labels[0]), steps=steps, rule=rule, rows_per_pass=rows_per_pass
        )
        total += result.attribution.amax(dim=(2, 3)).double().numpy()
        if on_progress is not None:
            on_progress(done, len(data))
    count = len(data)
    return AttributionImportance(total / max(count, 1), count, steps, rule, time.perf_counter() - started)
