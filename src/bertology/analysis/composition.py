"""Q-, K- and V-composition scores between heads, from the weights alone (Elhage et al. 2021, "A
Mathematical Framework for Transformer Circuits", section "Three Kinds of Composition").

With residual vectors as rows (``x W``), head ``h`` reads the residual stream through ``W_Q^h, W_K^h,
W_V^h`` ``[d_model, d_head]`` and writes through ``W_O^h`` ``[d_head, d_model]``; its OV circuit is
``W_OV^h = W_V^h W_O^h`` and its QK circuit ``W_QK^h = W_Q^h (W_K^h)^T`` (both ``[d_model, d_model]``).
The paper's composition score of an earlier head ``a`` into a later head ``b`` is
``||W_A W_B||_F / (||W_A||_F ||W_B||_F)``, exactly as TransformerLens computes it
(``HookedTransformer.all_composition_scores`` through ``utils.composition_scores``, left ``OV``):

- Q-composition: ``W_A = W_OV^a``, ``W_B = W_QK^b`` (``a`` writes what ``b``'s queries read);
- K-composition: ``W_A = W_OV^a``, ``W_B = (W_QK^b)^T = W_K^b (W_Q^b)^T`` (what ``b``'s keys read);
- V-composition: ``W_A = W_OV^a``, ``W_B = W_OV^b``.

Scores lie in [0, 1]; only pairs with ``b`` in a later layer than ``a`` are scored (TransformerLens masks
the others to 0). What we do about the weights: the model's own projection weights, biases left out (the
circuits are bilinear, as in the paper). TransformerLens's ``from_pretrained`` folds the LayerNorm before
each attention into ``W_Q, W_K, W_V`` and centres ``W_O`` by default; we fold nothing (its
``from_pretrained_no_processing``), so for pre-norm decoders the norm's per-feature weights are not in
the scores, and for post-norm encoders (BERT) no norm sits between a head's projections anyway. With
grouped-query attention query head ``h`` uses key/value head ``h // groups`` (as transformers'
``repeat_kv``): its ``W_K`` and ``W_V`` are that shared head's. DeBERTa's relative-position terms and the
per-head query and key norms of some decoders (Qwen3, Gemma 3) are outside these linear circuits and
left out. Projections are found through :mod:`bertology.models.anatomy` (fused layouts included).

Computation: each ``[d_model, d_head]`` factor ``F`` is replaced by the ``[d_head, d_head]`` triangular
factor ``R`` of its QR decomposition (``F = Q R``, orthonormal ``Q``), which keeps every Frobenius norm, so
``||W_OV^a W_QK^b||_F = ||R_V^a (W_O^a W_Q^b) (R_K^b)^T||_F`` and no ``d_model x d_model`` matrix is
formed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from bertology.models.anatomy import AttentionParts, attention_parts, linear_weight
from bertology.models.loading import LoadedModel

#: The three kinds of composition, in the paper's order.
COMPOSITION_KINDS = ("q", "k", "v")


@dataclass(frozen=True)
class HeadFactors:
    """One layer's per-head weights, residual vectors as rows (float64).

    query, key, value: [heads, d_model, d_head] (key, value: the key/value head each query head uses).
    output: [heads, d_head, d_model].
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor


def _reading(parts: AttentionParts, which: str, slots: list[int]) -> torch.Tensor:
    """[len(slots), d_model, d_head]: the ``which`` projection's rows of each slot, transposed."""
    projection = getattr(parts, which)
    weight = linear_weight(projection.linear).detach().double()
    rows = torch.tensor(projection.rows(slots, parts.head_dim), device=weight.device)
    return weight[rows].cpu().unflatten(0, (len(slots), parts.head_dim)).transpose(1, 2)


def head_factors(parts: AttentionParts) -> HeadFactors:
    """The :class:`HeadFactors` of one layer's :class:`~bertology.models.anatomy.AttentionParts`."""
    heads = list(range(parts.heads))
    shared = [head // parts.groups for head in heads]
    output = parts.output_weight().detach().double().cpu()  # [d_model, heads * d_head]
    return HeadFactors(
        query=_reading(parts, "query", heads),
        key=_reading(parts, "key", shared),
        value=_reading(parts, "value", shared),
        output=output.T.unflatten(0, (parts.heads, parts.head_dim)),
    )


def _triangular(factor: torch.Tensor) -> torch.Tensor:
    """[..., d_head, d_head] ``R`` of ``factor`` [..., d_model, d_head] = ``Q R``: ``||X F^T||_F =
    ||X R^T||_F`` for any ``X``."""
    return torch.linalg.qr(factor, mode="r").R


@dataclass
class CompositionScores:
    """Q-, K- and V-composition of every head into every head of a later layer.

    scores: per kind (``"q"``, ``"k"``, ``"v"``), [layers, heads, layers, heads]: entry ``[la, ha, lb, hb]``
        the score of head ``(la, ha)`` into ``(lb, hb)``; NaN where ``lb <= la``.
    model_name: the model scored.
    """

    scores: dict[str, np.ndarray]
    model_name: str

    def to_frame(self) -> pd.DataFrame:
        """One row per scored pair and kind: ``layer_a``, ``head_a``, ``layer_b``, ``head_b`` (0-based, ``b``
        in a later layer), ``kind`` (``q``, ``k``, ``v``), ``score``."""
        frames = []
        for kind, grid in self.scores.items():
            la, ha, lb, hb = np.nonzero(~np.isnan(grid))
            frames.append(
                pd.DataFrame(
                    {
                        "layer_a": la,
                        "head_a": ha,
                        "layer_b": lb,
                        "head_b": hb,
                        "kind": kind,
                        "score": grid[la, ha, lb, hb],
                    }
                )
            )
        return pd.concat(frames, ignore_index=True)

    def matrix(self, kind: str) -> np.ndarray:
        """[layers * heads, layers * heads] the scores of ``kind``, rows the earlier head ``la * heads +
        ha``, columns the later one (NaN where not scored)."""
        grid = self.scores[kind]
        layers, heads = grid.shape[:2]
        return grid.reshape(layers * heads, layers * heads)

    def top(self, kind: str, count: int) -> list[tuple[int, int, int, int, float]]:
        """The ``count`` highest-scoring pairs of ``kind``: (layer_a, head_a, layer_b, head_b, score)."""
        frame = self.to_frame()
        best = frame[frame["kind"] == kind].nlargest(count, "score")
        return [
            (int(row.layer_a), int(row.head_a), int(row.layer_b), int(row.head_b), float(row.score))
            for row in best.itertuples()
        ]

    def to_json(self) -> str:
        """The model, the definition and, per kind, the [layers, heads, layers, heads] scores (null where not
        scored)."""
        return json.dumps(
            {
                "model": self.model_name,
                "definition": "||W_A W_B||_F / (||W_A||_F ||W_B||_F), W_A = W_OV of the earlier head; W_B: "
                "W_QK (q), W_QK^T (k), W_OV (v) of the later head (Elhage et al. 2021)",
                "scores": {
                    kind: np.where(np.isnan(grid), None, grid).tolist() for kind, grid in self.scores.items()
                },
            }
        )


def composition_scores(loaded: LoadedModel) -> CompositionScores:
    """Q-, K- and V-composition scores of every pair of heads of ``loaded`` (see the module docstring).

    Raises:
        BertologyError: a model type whose projections bertology does not know.
    """
    factors = [head_factors(parts) for parts in attention_parts(loaded.model)]
    layers, heads = len(factors), factors[0].query.shape[0]
    value_r = [_triangular(f.value) for f in factors]  # [heads, d_head, d_head] each
    output_r = [_triangular(f.output.transpose(1, 2)) for f in factors]
    query_r = [_triangular(f.query) for f in factors]
    key_r = [_triangular(f.key) for f in factors]
    ov_norms = [
        torch.linalg.matrix_norm(v @ o.transpose(1, 2)) for v, o in zip(value_r, output_r, strict=True)
    ]
    qk_norms = [torch.linalg.matrix_norm(q @ k.transpose(1, 2)) for q, k in zip(query_r, key_r, strict=True)]
    # later head b: (what the earlier head's W_O meets, the R of the far side, ||W_B||)
    right_of = {
        "q": lambda b: (factors[b].query, key_r[b], qk_norms[b]),
        "k": lambda b: (factors[b].key, query_r[b], qk_norms[b]),
        "v": lambda b: (factors[b].value, output_r[b], ov_norms[b]),
    }
    scores = {kind: np.full((layers, heads, layers, heads), np.nan) for kind in COMPOSITION_KINDS}
    for a in range(layers):
        for b in range(a + 1, layers):
            for kind in COMPOSITION_KINDS:
                near, far_r, right_norms = right_of[kind](b)
                middle = torch.einsum("aim,bmj->abij", factors[a].output, near)  # [heads_a, heads_b, dh, dh]
                product = value_r[a][:, None] @ middle @ far_r[None].transpose(-1, -2)
                norms = torch.linalg.matrix_norm(product) / ov_norms[a][:, None] / right_norms[None, :]
                scores[kind][a, :, b, :] = norms.numpy()
    return CompositionScores(scores, loaded.name)
