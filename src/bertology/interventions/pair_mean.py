"""Mean ablation's one definition, shared by ``bertology patch --ablation mean`` and ``bertology circuit
--ablation mean``: an activation averaged over every position of the texts of every pair's source input.

- Over which inputs: the source run's (what a counterfactual patch would carry: the corrupted inputs
  under noising, the clean ones under denoising), so ``mean`` differs from ``counterfactual`` only by
  dropping what varies from pair to pair and position to position. Under noising, the default of an
  ablation and of a circuit, that is the mean over the corrupted inputs, as Wang et al. (2022) mean-ablate
  over their pABC distribution.
- Over which positions: every position of the texts (an answer's tokens appended to score it left out),
  one vector per site and layer written at every position: what EAP-IG's (MIB's)
  ``compute_mean_activations(per_position=False)`` says it does ("if you gave this hook input lengths, we
  assume you want to mean over positions"), not what its code computes (``src/eap/utils.py`` at
  hannamw/EAP-IG 795f560: the mask keeps each input's last position only, ``mask[..., input_lengths - 1]
  = 1``, divided by the length, and the result is averaged over the graph's nodes, ``means.mean(0)``), so
  bertology's ``mean`` is ours, not numerically MIB's. It is defined for pairs of any token counts; a
  per-position mean (EAP-IG's ``mean-positional``) is not offered. In a decoder the first position (the
  attention sink, often of far larger norm) is averaged in with the others.
- Weights: each pair and position counts once (a pair's two rows, for answers of several tokens, hold
  the same texts and count the same), summed in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def text_sum(tensor: torch.Tensor, tokens: int) -> tuple[torch.Tensor, int]:
    """(float64 [*features] the sum of ``tensor`` [rows, positions, *features] over its rows and first
    ``tokens`` positions (the texts'), how many vectors were summed): one group's share of the mean."""
    return tensor[:, :tokens].double().sum((0, 1)), tensor.shape[0] * tokens


def mean_over_texts(tensors: Sequence[torch.Tensor], text_tokens: Sequence[int]) -> torch.Tensor:
    """[*features] the mean of ``tensors`` (one per group of pairs, [rows, tokens, *features]) over every
    row and the group's first ``text_tokens`` positions (its texts'), in the tensors' dtype."""
    shares = [text_sum(tensor, tokens) for tensor, tokens in zip(tensors, text_tokens, strict=True)]
    total = sum(
        (share for share, _ in shares), torch.zeros((), dtype=torch.float64, device=tensors[0].device)
    )
    return (total / sum(count for _, count in shares)).to(tensors[0].dtype)
