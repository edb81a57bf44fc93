"""A classifier (or a decoder language model's next token) run from its inputs' word embeddings, and
gradients with respect to them.

The word (token) embeddings are what :mod:`~bertology.interventions.saliency` attributes to and what
:mod:`~bertology.interventions.attacks` changes: the model adds its own position and segment embeddings
to them. Every function here takes the model inputs of one encoded batch (``input_ids`` and the masks,
``[k, n]`` each, from ``LoadedModel.model_inputs``) and runs without changing the model's mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bertology.models.loading import LoadedModel

#: A scalar per input from the classifier's logits: ``[k, labels] -> [k]``.
Score = Callable[[torch.Tensor], torch.Tensor]


def word_embeddings(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[k, n, dim] word embeddings of ``inputs["input_ids"]`` (no gradient)."""
    with torch.no_grad():
        return loaded.model.get_input_embeddings()(inputs["input_ids"])


def is_language_model(loaded: LoadedModel) -> bool:
    """True for a decoder loaded with its language-modelling head (next-token logits)."""
    return loaded.kind == "decoder" and loaded.model.get_output_embeddings() is not None


def logits_of(loaded: LoadedModel, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[k, labels] logits for word embeddings ``[k, n, dim]`` in place of ``inputs["input_ids"]``; the
    other inputs are ``[k, n]`` or ``[1, n]`` (one input's masks for ``k`` embedded copies of it). For a
    decoder language model (:func:`is_language_model`) the labels are its vocabulary: the next-token
    logits after the last token (the inputs are unpadded)."""
    others = {
        name: tensor.expand(len(embeddings), -1) for name, tensor in inputs.items() if name != "input_ids"
    }
    if is_language_model(loaded):
        return loaded.model(inputs_embeds=embeddings, logits_to_keep=1, **others).logits[:, -1]
    return loaded.model(inputs_embeds=embeddings, **others).logits


def logits_gradient(
    loaded: LoadedModel, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor], score: Score
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [k, labels], ∂score/∂embeddings [k, n, dim])`` at word embeddings ``[k, n, dim]``, from
    one forward pass: each input's score differentiated by its own embeddings (the inputs do not
    interact)."""
    with torch.enable_grad():
        point = embeddings.detach().clone().requires_grad_(True)
        logits = logits_of(loaded, point, inputs)
        (gradient,) = torch.autograd.grad(score(logits).sum(), point)
    return logits.detach(), gradient


def score_gradient(
    loaded: LoadedModel, embeddings: torch.Tensor, inputs: dict[str, torch.Tensor], score: Score
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(score(logits) [k], ∂score/∂embeddings [k, n, dim])`` at word embeddings ``[k, n, dim]``
    (:func:`logits_gradient`)."""
    logits, gradient = logits_gradient(loaded, embeddings, inputs, score)
    return score(logits), gradient


def target_logit(target: int) -> Score:
    """The score that is the logit of label ``target``."""
    return lambda logits: logits[:, target]


def cross_entropy(target: int) -> Score:
    """The cross-entropy loss of label ``target``, ``−log softmax(logits)[target]`` (what an AllenNLP
    classifier's ``forward`` returns as ``loss`` for an instance labelled ``target``)."""
    return lambda logits: -torch.log_softmax(logits.float(), dim=-1)[:, target]


def target_log_probability(target: int) -> Score:
    """The score that is the log-probability (log-softmax of the logits) of label ``target``."""
    return lambda logits: torch.log_softmax(logits.float(), dim=-1)[:, target]
