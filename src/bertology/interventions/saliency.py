"""Which input tokens a prediction rests on: per-token attributions, for a classifier's label or a
decoder language model's next token, in one of two conventions (:data:`CONVENTIONS`): bertology's own
(the default) or AllenNLP Interpret's.

``x`` is the input's word (token) embeddings ``[tokens, dim]``, to which the model adds its own position
and segment embeddings (an encoder, before a LayerNorm) or which it rotates into its queries and keys (a
Llama-style decoder, after an RMSNorm).

**bertology** (ours). ``f`` is the logit of the target: a classifier's predicted class (or a given
label), or a decoder's next-token logit of its most likely token (or a given token) after the prompt's
last token. Each method of :data:`METHODS` gives one signed number per token ``i``:

- ``gradient``: ``‖∂f/∂x[i]‖₂ · sign(x[i] · ∂f/∂x[i])``, the size of the plain gradient (Simonyan et al.
  2014), signed by whether growing the token's own embedding raises ``f``. (Summing the gradient's
  components instead would give about 0: the LayerNorm ignores a shift of all components alike.)
- ``input-x-gradient``: ``Σ_d x[i, d] · ∂f/∂x[i, d]`` (Shrikumar et al. 2016), the slope of ``f`` as the
  token's embedding is scaled up.
- ``integrated-gradients``: ``Σ_d (x − x')[i, d] · ∫₀¹ ∂f/∂x[i, d](x' + α (x − x')) dα``
  (Sundararajan et al. 2017). The baseline ``x'`` is the input with every non-special token replaced by
  the padding token's embedding ([PAD]; a decoder without one pads with its end-of-text token, which
  bertology makes its padding token, e.g. SmolLM2's ``<|im_end|>``), special tokens ([CLS], [SEP], a
  decoder's BOS) kept, the attention mask and positions unchanged; so the special tokens get 0 and the
  attributions sum to ``f(x) − f(x')`` (completeness), up to the error of the integral. A decoder's
  first token is kept too (and gets 0): it is the attention sink, where most heads park their mass
  (Xiao et al. 2023), and moving it moves every head's resting place at once, so ``f`` jumps along the
  path (SmolLM2-135M: by up to 22 logits between neighbouring points 1/100 apart) where the integral
  cannot follow; with it kept the path is smooth enough for the quadrature. The integral is a
  Gauss–Legendre quadrature with ``steps`` points.
- ``smoothgrad``: the ``gradient`` formula applied to the mean gradient over ``samples`` noisy copies of
  the input, ``G = (1/N) Σ_k ∂f/∂x (x + ε_k)`` (Smilkov et al. 2017), ``ε_k`` Gaussian with standard
  deviation ``σ = noise · (max x − min x)`` in every component (the paper's noise level
  ``σ / (x_max − x_min)``; the range over all the input's embedding components, special tokens too).
  The noise is drawn on the CPU from a ``torch.Generator`` seeded with ``seed``, one
  ``randn([tokens, dim])`` per sample in order, so a seed gives the same result on every device and for
  every batch size; ``noise = 0`` gives ``gradient`` exactly (up to rounding).

Positive values push towards the target, negative values away from it. For a decoder, each head's direct
contribution to the target's logit comes with them
(:func:`~bertology.interventions.direct_logit.direct_logit_attribution`).

**allennlp**: AllenNLP Interpret's saliency interpreters as its code (allenai/allennlp 2.10,
``allennlp/interpret/saliency_interpreters/``) defines them, for a classifier. What is differentiated is
the loss of the prediction: ``Predictor.get_gradients`` "Gets the gradients of the loss with respect to
the model inputs" of the instance that ``predictions_to_labeled_instances`` labels with the prediction
(``label = numpy.argmax(outputs["probs"])``), so ``L = −log softmax(logits)[y]``, the cross-entropy of the
predicted label ``y`` (or of a given label). The gradients are those of the output of the layer
``find_embedding_layer`` picks, which for a transformers BERT model is the word embeddings alone
(``if isinstance(module, BertEmbeddings): return module.word_embeddings``; likewise RoBERTa's and
ALBERT's), before the position and segment embeddings and the LayerNorm: ``x`` above. Every token is
scored, the special ones included (AllenNLP's text field holds [CLS] and [SEP]), and every method
normalises alike: ``normalized_grad = [math.fabs(e) / norm for e in emb_grad]`` with ``norm =
numpy.linalg.norm(emb_grad, ord=1)``, so the scores are ``|s_i| / Σ_j |s_j|``, not negative and summing
to 1, for the per-token sums ``s_i``:

- ``input-x-gradient`` (AllenNLP's ``simple-gradient``): ``s_i = Σ_d ∂L/∂x[i, d] · x[0, d]``
  (``numpy.sum(grad[0] * embeddings_list[input_idx][0], axis=1)``, the gradient times the embedding
  output a forward hook saved). That hook's ``output.squeeze(0)`` has already dropped the batch axis
  when no token offsets are used (a wordpiece-indexed transformer), so the ``[0]`` meant to undo the
  batching picks the first token's embedding, and every token's gradient is multiplied by it: AllenNLP's
  code computes this, not the gradient times each token's own embedding that its comment describes, and
  this convention reproduces its numbers. (bertology's ``input-x-gradient`` multiplies by each token's
  own embedding. AllenNLP has no plain ``gradient``.)
- ``integrated-gradients`` (AllenNLP's ``integrated-gradient``): ``s_i = Σ_d x[i, d] · (1/m) Σ_k
  ∂L/∂x[i, d](α_k x)``, ``α_k = k/m`` for ``k = 0 … m−1`` (``for alpha in numpy.linspace(0, 1.0,
  num=steps, endpoint=False)``, ``steps = 10``: a left Riemann sum), the baseline the zero vector in
  every position, special tokens included (a forward hook scales the embedding output,
  ``output.mul_(alpha)``), the mean gradient times the input (``ig_grads[key] *= input_embedding``).
- ``smoothgrad`` (AllenNLP's ``smooth-gradient``): ``s_i = Σ_d (1/N) Σ_k ∂L/∂x[i, d](x + ε_k)``, the
  mean gradient over ``N = 10`` noisy copies (``self.num_samples = 10``), *not* times the input
  (``# TODO (@Eric-Wallace), SmoothGrad is not using times input normalization``), ``ε_k`` Gaussian of
  standard deviation ``0.01 · (max x − min x)`` (``self.stdev = 0.01``;
  ``scale = output.detach().max() - output.detach().min()``). AllenNLP draws from torch's global
  generator; here, as in bertology's SmoothGrad, the draw is one ``randn([tokens, dim])`` per copy, in
  order, from a CPU ``torch.Generator`` seeded with ``seed``, so the same seed gives the same noise.

The points and samples default to AllenNLP's 10 (``steps``, ``samples`` and ``noise`` may be changed, as
``SmoothGradient``'s ``stdev`` and ``num_samples`` may). For a model type whose embeddings
``find_embedding_layer`` does not know (AllenNLP then falls back to its text field embedder's output),
the word embeddings are used all the same. A decoder's next token has no AllenNLP counterpart here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from bertology.corpus.encoding import EncodedBatch, Text, encode
from bertology.errors import BertologyError
from bertology.interventions.data import eval_mode
from bertology.interventions.direct_logit import (
    DirectLogitAttribution,
    decoder_parts,
    direct_logit_attribution,
)
from bertology.interventions.embeddings import (
    Score,
    cross_entropy,
    is_language_model,
    logits_of,
    score_gradient,
    target_logit,
    word_embeddings,
)
from bertology.interventions.explained import ExplainedInput, as_string
from bertology.models.loading import LoadedModel, require_pair_template
from bertology.options import (
    IG_STEPS,
    INTERPRET_CONVENTIONS,
    MAX_IG_STEPS,
    MAX_SMOOTHGRAD_SAMPLES,
    SALIENCY_METHODS,
    SAMPLES,
    SMOOTHGRAD_NOISE,
    SMOOTHGRAD_SAMPLES,
    InterpretConvention,
    SaliencyMethod,
)

METHODS: tuple[SaliencyMethod, ...] = SALIENCY_METHODS
CONVENTIONS: tuple[InterpretConvention, ...] = INTERPRET_CONVENTIONS
#: The methods of each convention (AllenNLP has no plain gradient).
CONVENTION_METHODS: dict[InterpretConvention, tuple[SaliencyMethod, ...]] = {
    "bertology": METHODS,
    "allennlp": ("input-x-gradient", "integrated-gradients", "smoothgrad"),
}
#: Keys of the JSON object :meth:`Explanation.to_json` writes that mark a file as its output (so a later
#: run may replace it).
JSON_MARKS = ("text", "tokens", "label", "attributions")


@dataclass
class Explanation(ExplainedInput):
    """Attributions of one input's prediction.

    text, text_b: the input (``text_b`` ``None`` for a single text; a decoder's prompt is one text).
    tokens: the n token strings. special: [n] bool, True for special tokens.
    label: the target explained: a classifier's label name, or a decoder's next token as text (e.g.
        ``" Paris"``); probability: its softmax probability. predicted: the model's most likely label or
        next token (the target unless one was given).
    attributions: method name (of :data:`METHODS`, those asked for) -> [n] float: signed, in logit units
        (``bertology``), or not negative and summing to 1 (``allennlp``).
    logit, baseline_logit: ``f(x)`` and ``f(x')``, the target's logit for the input and the
        baseline of bertology's integrated gradients (``None`` without them, and in the allennlp
        convention). steps: points of integrated gradients. noise, samples, seed: SmoothGrad's noise
        level, noisy copies and seed. convention: of :data:`CONVENTIONS`, whose definitions made them.
    heads: a decoder's direct logit attribution of the target (each head's direct contribution to its
        logit), ``None`` for a classifier.
    """

    attributions: dict[SaliencyMethod, np.ndarray]
    logit: float
    baseline_logit: float | None
    steps: int
    noise: float = SMOOTHGRAD_NOISE
    samples: int = SMOOTHGRAD_SAMPLES
    seed: int = 0
    predicted: str | None = None
    heads: DirectLogitAttribution | None = None
    convention: InterpretConvention = "bertology"

    @property
    def completeness_gap(self) -> float | None:
        """``Σ integrated gradients − (f(x) − f(x'))``: 0 for an exact integral (``None`` without
        integrated gradients)."""
        if self.baseline_logit is None or "integrated-gradients" not in self.attributions:
            return None
        total = float(self.attributions["integrated-gradients"].sum())
        return total - (self.logit - self.baseline_logit)

    def to_dict(self) -> dict[str, object]:
        return {
            **self.input_dict(),
            "convention": self.convention,
            "predicted": self.predicted,
            "logit": self.logit,
            "baseline_logit": self.baseline_logit,
            "completeness_gap": self.completeness_gap,
            "steps": self.steps,
            "noise": self.noise,
            "samples": self.samples,
            "seed": self.seed,
            "attributions": {name: values.tolist() for name, values in self.attributions.items()},
            "direct_logit_attribution": None if self.heads is None else self.heads.to_dict(),
        }


#: Points ``[m, n, dim]`` at which to take the gradient, with their weights ``[m]``.
WeightedPoints = Iterator[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Attribution:
    """One input being explained, and the settings of the methods.

    inputs: its model inputs ([1, n] each); x: [1, n, dim] its word embeddings; special: [n] bool;
    target: the target's label or token id. kept: [n] bool, the tokens bertology's integrated gradients'
    baseline keeps (the special tokens, and a decoder's first token). score: what is differentiated (the
    target's logit, or the cross-entropy of the target in the allennlp convention).
    """

    loaded: LoadedModel
    inputs: dict[str, torch.Tensor]
    x: torch.Tensor
    special: np.ndarray
    target: int
    steps: int
    noise: float
    samples: int
    seed: int
    batch_size: int
    kept: np.ndarray
    score: Score
    baseline_logit: float | None = None

    def weighted_gradient(self, points: WeightedPoints) -> torch.Tensor:
        """[1, n, dim]: ``Σ_k w_k ∂f/∂x (p_k)`` over the weighted points."""
        total = torch.zeros_like(self.x)
        for batch, weights in points:
            _, gradient = score_gradient(self.loaded, batch, self.inputs, self.score)
            total += (gradient * weights[:, None, None]).sum(0, keepdim=True)
        return total

    def _weights(self, values: np.ndarray | Sequence[float]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values), dtype=self.x.dtype, device=self.x.device)

    @cached_property
    def gradient(self) -> torch.Tensor:
        """[1, n, dim] ``∂f/∂x`` at the input."""
        return self.weighted_gradient(iter([(self.x, self._weights([1.0]))]))

    def signed_norm(self, gradient: torch.Tensor) -> torch.Tensor:
        """[n] ``‖g[i]‖ · sign(x[i] · g[i])`` of a gradient ``g`` [1, n, dim]."""
        return gradient.norm(dim=-1)[0] * torch.sign((gradient * self.x).sum(-1)[0])

    def integrated_gradients(self) -> torch.Tensor:
        pad_id = self.loaded.tokenizer.pad_token_id  # a decoder's is its end-of-text token (wrap_model)
        if pad_id is None:
            raise BertologyError(
                f"The tokenizer of '{self.loaded.name}' has no [PAD] token for the baseline."
            )
        ids = self.inputs["input_ids"]
        keep = torch.as_tensor(self.kept, device=ids.device)[None]
        baseline = word_embeddings(self.loaded, {"input_ids": torch.where(keep, ids, pad_id)})
        nodes, weights = np.polynomial.legendre.leggauss(self.steps)
        alphas, weights = (nodes + 1) / 2, weights / 2  # on [0, 1]; the weights sum to 1

        def path() -> WeightedPoints:
            for start in range(0, self.steps, self.batch_size):
                alpha = self._weights(alphas[start : start + self.batch_size])
                points = baseline + alpha[:, None, None] * (self.x - baseline)
                yield points, self._weights(weights[start : start + self.batch_size])

        integral = self.weighted_gradient(path())
        with torch.no_grad():
            self.baseline_logit = float(logits_of(self.loaded, baseline, self.inputs)[0, self.target])
        return ((self.x - baseline) * integral).sum(-1)[0]

    def noisy_copies(self) -> WeightedPoints:
        """The ``samples`` noisy copies ``x + ε_k`` of SmoothGrad (module docstring), each weighted
        ``1 / samples``: ``ε_k = σ · randn([n, dim])`` drawn in order from a CPU generator seeded with
        ``seed``, ``σ = noise · (max x − min x)``."""
        generator = torch.Generator().manual_seed(self.seed)
        sigma = self.noise * float(self.x.max() - self.x.min())
        shape = tuple(self.x.shape[1:])
        weight = self._weights([1.0 / self.samples])
        for start in range(0, self.samples, self.batch_size):
            count = min(self.batch_size, self.samples - start)
            noise = torch.stack([torch.randn(shape, generator=generator) for _ in range(count)])
            points = self.x + sigma * noise.to(device=self.x.device, dtype=self.x.dtype)
            yield points, weight.expand(count)

    def smoothgrad(self) -> torch.Tensor:
        return self.signed_norm(self.weighted_gradient(self.noisy_copies()))

    def left_riemann_integral(self) -> torch.Tensor:
        """[1, n, dim] AllenNLP's ``(1/m) Σ_k ∂L/∂x (α_k x)``, ``α_k = k/m``, ``k = 0 … m−1``
        (``numpy.linspace(0, 1.0, num=steps, endpoint=False)``)."""
        alphas = np.linspace(0, 1.0, num=self.steps, endpoint=False)

        def path() -> WeightedPoints:
            for start in range(0, self.steps, self.batch_size):
                alpha = self._weights(alphas[start : start + self.batch_size])
                yield alpha[:, None, None] * self.x, self._weights([1.0 / self.steps]).expand(len(alpha))

        return self.weighted_gradient(path())


def l1_normalised(sums: torch.Tensor) -> torch.Tensor:
    """[n] AllenNLP Interpret's normalisation of per-token sums ``s`` [n]: ``|s_i| / Σ_j |s_j|``
    (``[math.fabs(e) / norm for e in emb_grad]``, ``norm = numpy.linalg.norm(emb_grad, ord=1)``)."""
    return sums.abs() / sums.abs().sum()


_METHODS: dict[InterpretConvention, dict[SaliencyMethod, Callable[[_Attribution], torch.Tensor]]] = {
    "bertology": {
        "gradient": lambda run: run.signed_norm(run.gradient),
        "input-x-gradient": lambda run: (run.gradient * run.x).sum(-1)[0],
        "integrated-gradients": _Attribution.integrated_gradients,
        "smoothgrad": _Attribution.smoothgrad,
    },
    "allennlp": {
        # every token's gradient times the FIRST token's embedding, as AllenNLP's code computes it (above)
        "input-x-gradient": lambda run: l1_normalised((run.gradient * run.x[:, :1]).sum(-1)[0]),
        "integrated-gradients": lambda run: l1_normalised((run.left_riemann_integral() * run.x).sum(-1)[0]),
        "smoothgrad": lambda run: l1_normalised(run.weighted_gradient(run.noisy_copies()).sum(-1)[0]),
    },
}


def check_convention(convention: str) -> None:
    """Raises a :class:`BertologyError` for a convention not of :data:`CONVENTIONS`."""
    if convention not in CONVENTIONS:
        raise BertologyError(f"Unknown convention {convention!r}; use {' or '.join(CONVENTIONS)}.")


def explanation_settings(
    methods: Sequence[SaliencyMethod] | None,
    steps: int | None,
    noise: float,
    samples: int | None,
    convention: InterpretConvention,
    *,
    decoder: bool = False,
) -> tuple[tuple[SaliencyMethod, ...], int, int]:
    """``(methods, steps, samples)`` of :func:`explain`, each ``None`` replaced by the convention's
    default, checked (for a decoder when ``decoder``) before any model runs.

    Raises:
        BertologyError: what :func:`explain` raises for its settings.
    """
    check_convention(convention)
    if decoder and convention == "allennlp":
        raise BertologyError(
            "The allennlp convention explains a classifier's label; explain a decoder's next token in the "
            "bertology convention."
        )
    known = CONVENTION_METHODS[convention]
    methods = known if methods is None else tuple(methods)
    steps = IG_STEPS[convention] if steps is None else steps
    samples = SAMPLES[convention] if samples is None else samples
    unknown = [method for method in methods if method not in known]
    if unknown or not methods:
        raise BertologyError(
            f"Unknown saliency method {', '.join(map(repr, unknown))} in the {convention} convention; use "
            f"{', '.join(known)}."
            if unknown
            else f"Give at least one saliency method of {', '.join(known)}."
        )
    if not 1 <= steps <= MAX_IG_STEPS:
        raise BertologyError(
            f"Integrated gradients needs at least one step and at most {MAX_IG_STEPS}, not {steps}."
        )
    if not 1 <= samples <= MAX_SMOOTHGRAD_SAMPLES:
        raise BertologyError(
            f"SmoothGrad needs at least one sample and at most {MAX_SMOOTHGRAD_SAMPLES}, not {samples}."
        )
    if not (np.isfinite(noise) and noise >= 0):
        raise BertologyError(f"SmoothGrad's noise level must be a finite number of at least 0, not {noise}.")
    return methods, steps, samples


def encode_one(loaded: LoadedModel, text: Text, text_b: Text | None) -> EncodedBatch:
    """``text`` (or the pair) encoded alone, cut to the model's limit."""
    return encode(
        loaded.tokenizer, [text], None if text_b is None else [text_b], max_length=loaded.max_length
    )


def _target_id(loaded: LoadedModel, target: str | int | None, scores: torch.Tensor) -> int:
    """The id of ``target``: ``None`` the most likely (``scores``: [classes] logits); an int that id; a
    string a classifier's label name or a decoder's single token (its text as the tokenizer splits it,
    e.g. ``" Paris"``, or a vocabulary entry as is, e.g. ``"ĠParis"``).

    Raises:
        BertologyError: an id out of range, an unknown label, or a text that is not one token.
    """
    if target is None:
        return int(scores.argmax())
    if isinstance(target, int):
        if not 0 <= target < len(scores):
            raise BertologyError(f"Target {target} is not an id below {len(scores)}.")
        return target
    if not is_language_model(loaded):
        label2id = loaded.model.config.label2id
        if target not in label2id:
            raise BertologyError(
                f"'{target}' is not a label of '{loaded.name}'; use one of {list(label2id)}."
            )
        return int(label2id[target])
    vocabulary = loaded.tokenizer.get_vocab()
    ids = loaded.tokenizer(target, add_special_tokens=False)["input_ids"]
    if len(ids) == 1:
        return int(ids[0])
    if target in vocabulary:
        return int(vocabulary[target])
    pieces = loaded.tokenizer.convert_ids_to_tokens(ids)
    raise BertologyError(
        f"The target {target!r} is {len(ids)} tokens ({' '.join(pieces)}), not one; give one token, e.g. "
        f"{loaded.tokenizer.decode(ids[:1])!r} (mind a leading space)."
    )


def _label_of(loaded: LoadedModel, target: int) -> str:
    """A classifier's label name or a decoder's token as text."""
    if is_language_model(loaded):
        return loaded.tokenizer.decode([target])
    return str(loaded.model.config.id2label[target])


def explain(
    loaded: LoadedModel,
    text: Text,
    text_b: Text | None = None,
    *,
    target: str | int | None = None,
    methods: Sequence[SaliencyMethod] | None = None,
    steps: int | None = None,
    noise: float = SMOOTHGRAD_NOISE,
    samples: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    convention: InterpretConvention = "bertology",
) -> Explanation:
    """Attributions of ``loaded``'s prediction for ``text`` (or the pair) by each of ``methods`` (see the
    module docstring; ``None``: all of the convention's): a classifier's label, or a decoder language
    model's next token after the prompt ``text`` (loaded with ``language_model=True``), with each head's
    direct contribution to its logit. target: the label name (classifier) or token (decoder: its text,
    one token, or its id) to explain; ``None``: the model's most likely one. steps: integrated
    gradients' points (``None``: the convention's, 50 or 10); noise, samples, seed: SmoothGrad's noise
    level ``σ / (max x − min x)``, noisy copies (``None``: 50 or 10) and seed. batch_size: interpolated
    or noisy copies per forward pass. convention: ``bertology`` (ours) or ``allennlp`` (AllenNLP
    Interpret's definitions, a classifier only).

    Raises:
        BertologyError: an unknown convention, the allennlp convention for a decoder, a decoder without
            its language-modelling head or given a pair, a target that is no label or no single token,
            an unknown method (``gradient`` in the allennlp convention), ``steps`` outside 1 to
            :data:`~bertology.options.MAX_IG_STEPS`, ``samples`` outside 1 to
            :data:`~bertology.options.MAX_SMOOTHGRAD_SAMPLES`, a negative noise level, or integrated
            gradients of a model without a [PAD] token.
    """
    decoder = loaded.kind == "decoder"
    methods, steps, samples = explanation_settings(
        methods, steps, noise, samples, convention, decoder=decoder
    )
    if decoder and not is_language_model(loaded):
        raise BertologyError(
            f"Explaining a decoder's next token needs its language-modelling head; load '{loaded.name}' "
            "with load_model(..., language_model=True)."
        )
    if decoder and text_b is not None:
        require_pair_template(loaded)
    if decoder:
        decoder_parts(loaded)  # a type whose heads' direct contributions are known, before any work
    encoded = encode_one(loaded, text, text_b)
    inputs = loaded.model_inputs(encoded)
    with eval_mode(loaded):
        x = word_embeddings(loaded, inputs)  # [1, n, dim]
        with torch.no_grad():
            logits = logits_of(loaded, x, inputs)
        target_id = _target_id(loaded, target, logits[0])
        special = np.asarray(encoded.special[0], dtype=bool)
        kept = special | (np.arange(len(special)) == 0) if decoder else special
        run = _Attribution(
            loaded,
            inputs,
            x,
            special,
            target_id,
            steps,
            noise,
            samples,
            seed,
            batch_size,
            kept,
            cross_entropy(target_id) if convention == "allennlp" else target_logit(target_id),
        )
        attributions = {method: _METHODS[convention][method](run) for method in dict.fromkeys(methods)}
        heads = direct_logit_attribution(loaded, inputs, target_id) if decoder else None
    probabilities = torch.softmax(logits[0].float(), dim=-1)
    return Explanation(
        text=as_string(text),
        text_b=None if text_b is None else as_string(text_b),
        tokens=encoded.tokens[0],
        special=run.special,
        label=_label_of(loaded, target_id),
        probability=float(probabilities[target_id]),
        attributions={name: values.detach().float().cpu().numpy() for name, values in attributions.items()},
        logit=float(logits[0, target_id]),
        baseline_logit=run.baseline_logit,
        steps=steps,
        noise=noise,
        samples=samples,
        seed=seed,
        predicted=_label_of(loaded, int(logits[0].argmax())),
        heads=heads,
        convention=convention,
    )
