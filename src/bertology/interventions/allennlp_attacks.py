"""Input reduction and HotFlip as AllenNLP Interpret's code defines them (allenai/allennlp 2.10,
``allennlp/interpret/attackers/input_reduction.py`` and ``hotflip.py``), for a classifier.

Both attack the prediction ``y`` for the input: ``Predictor.json_to_labeled_instances`` labels the
instance with it (``label = numpy.argmax(outputs["probs"])``), and every gradient is that of the loss of
that label, ``L = −log p(y|x)`` (``Predictor.get_gradients``), with respect to the output of the layer
``find_embedding_layer`` picks: for a transformers BERT, RoBERTa or ALBERT model the word embeddings
``e_i`` alone (``return module.word_embeddings``), before the position and segment embeddings. The
tokens are all of the encoded input's, special tokens included, as AllenNLP's transformer tokenizer puts
them in the text field.

- :func:`input_reduction` (``InputReduction``, Feng et al. 2018): ``candidates = [(instance, -1,
  tag_mask)]``; while the last input that kept the label has more than one token (``num_ignore_tokens =
  1``) and there are candidates, the ``beam_size`` (3) shortest candidates (``heapq.nsmallest``, so the
  first ones in order among equals) are run one at a time; one whose prediction is not ``y`` is dropped
  (``if utils.instance_has_changed(...): continue``); each other becomes the current input and proposes
  removing each of its ``beam_size`` tokens of smallest gradient norm ``‖∂L/∂e_i‖₂`` (``grads_mag =
  [np.sqrt(grad.dot(grad)) for grad in grads]``; ``smallest = np.argmin(grads_mag)`` again and again,
  ties to the first). The result is the last input that kept the label. No token is exempt: the
  attacker skips its ``ignore_tokens`` (``["@@NULL@@"]``) with ``if token in ignore_tokens``, which
  compares ``Token`` objects with strings and so never holds; [CLS] and [SEP] may go too.
- :func:`hotflip` (``Hotflip``, Ebrahimi et al. 2018): the positions whose token's text is one of
  :data:`IGNORED_TOKENS` (``DEFAULT_IGNORE_TOKENS``) count as flipped already; then, repeatedly, the
  position of largest squared gradient norm ``∂L/∂e_i · ∂L/∂e_i`` (``grads_magnitude = [g.dot(g) for g
  in grad]``; ``numpy.argmax``, ties to the first) not yet flipped is flipped to the vocabulary entry
  ``w`` of largest first-order estimate of the loss's rise ``(E[w] − E[a]) · ∂L/∂e_i`` (``E``: the
  word-embedding matrix, ``a``: the current entry; ``_first_order_taylor``, ``sign = -1`` for an
  untargeted attack), over the entries whose vocabulary string is alphanumeric (``if not
  self.vocab._index_to_token[self.namespace][i].isalnum()``: excluded; the current entry is not). The
  model runs again after each flip, and the attack stops once the prediction is not ``y`` or every
  position is flipped (``max_tokens`` only bounds a constructed embedding matrix, which a model with an
  embedding layer does not need). Each position is flipped at most once. ``max_flips`` (not AllenNLP's)
  stops it earlier.
"""

from __future__ import annotations

import numpy as np
import torch

from bertology.interventions.attack_steps import AttackedInput, AttackStep, Candidate
from bertology.models.loading import LoadedModel

#: AllenNLP's ``DEFAULT_IGNORE_TOKENS`` of HotFlip: tokens never flipped (compared with the token's text).
IGNORED_TOKENS = ("@@NULL@@", ".", ",", ";", "!", "?", "[MASK]", "[SEP]", "[CLS]")


def _without(candidate: Candidate, index: int) -> Candidate:
    """``candidate`` with its token ``index`` removed (its steps kept)."""
    return Candidate(
        candidate.positions[:index] + candidate.positions[index + 1 :],
        candidate.ids[:index] + candidate.ids[index + 1 :],
        candidate.steps,
    )


def input_reduction(original: AttackedInput, beam: int) -> list[AttackStep]:
    """AllenNLP's input reduction (module docstring); the steps to the last input that kept the label."""
    current = Candidate(tuple(range(len(original.ids))), original.ids)
    candidates: list[tuple[Candidate, int | None]] = [(current, None)]  # (input, original position removed)
    while len(current.ids) > 1 and candidates:
        beam_candidates = sorted(candidates, key=lambda entry: len(entry[0].ids))[:beam]
        candidates = []
        for candidate, removed in beam_candidates:
            probabilities, gradient = original.loss_gradient(candidate)
            if int(probabilities.argmax()) != original.target:
                continue
            if removed is not None:
                step = original.step(candidate, probabilities, removed, None)
                candidate = Candidate(candidate.positions, candidate.ids, (*candidate.steps, step))
            current = candidate
            norms = gradient.float().norm(dim=-1).cpu().numpy()  # [m]
            for index in np.argsort(norms, kind="stable")[:beam].tolist():
                candidates.append((_without(candidate, index), candidate.positions[index]))
    return list(current.steps)


def alphanumeric_entries(loaded: LoadedModel) -> np.ndarray:
    """[rows of the embedding matrix] bool: the vocabulary entries whose string is alphanumeric
    (``str.isalnum``), those AllenNLP's HotFlip may flip to; rows beyond the vocabulary never."""
    rows = loaded.model.get_input_embeddings().weight.shape[0]
    allowed = np.zeros(rows, dtype=bool)
    for token, index in loaded.tokenizer.get_vocab().items():
        if index < rows and token.isalnum():
            allowed[index] = True
    return allowed


def hotflip(original: AttackedInput, max_flips: int | None) -> list[AttackStep]:
    """AllenNLP's HotFlip (module docstring); the steps, one flip each."""
    matrix = original.loaded.model.get_input_embeddings().weight.detach()  # [vocabulary, dim]
    barred = torch.as_tensor(~alphanumeric_entries(original.loaded), device=matrix.device)
    current = Candidate(tuple(range(len(original.ids))), original.ids)
    flipped = [index for index, token in enumerate(original.tokens) if token in IGNORED_TOKENS]
    _, gradient = original.loss_gradient(current)
    steps: list[AttackStep] = []
    while max_flips is None or len(steps) < max_flips:
        magnitude = (gradient * gradient).sum(-1).float().cpu().numpy()  # [m]
        magnitude[flipped] = -1
        position = int(np.argmax(magnitude))
        if magnitude[position] == -1:
            break
        flipped.append(position)
        loss_gradient = gradient[position].to(matrix.dtype)  # [dim]
        rise = matrix @ loss_gradient - matrix[current.ids[position]] @ loss_gradient  # [vocabulary]
        rise[barred] = -torch.inf
        entry = int(rise.argmax())
        current = Candidate(current.positions, (*current.ids[:position], entry, *current.ids[position + 1 :]))
        probabilities, gradient = original.loss_gradient(current)
        steps.append(original.step(current, probabilities, position, entry))
        if int(probabilities.argmax()) != original.target:
            break
    return steps
