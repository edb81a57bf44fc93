"""The attention of a clean and a corrupted input, which a circuit's page draws for each head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertology.attention.capturing import Attention, capture_encoded
from bertology.corpus.encoding import encode_token_ids
from bertology.interventions.patching_pairs import text_token_ids
from bertology.models.loading import LoadedModel, resolve_model


@dataclass(frozen=True)
class PairAttention:
    """The attention of one clean/corrupted pair: each :class:`~bertology.attention.capturing.Attention`
    holds ``probs [layers, heads, n, n]`` and its tokens (``n`` may differ between the two)."""

    clean: Attention
    corrupted: Attention


def circuit_attention(
    model: LoadedModel | str | Path, clean: str, corrupted: str, *, prepend_bos: bool = False
) -> PairAttention:
    """Every head's attention on ``clean`` and on ``corrupted``, each text alone and tokenized as the
    circuit run reads it (``prepend_bos``: the tokenizer's BOS token first, as ``--prepend-bos``), for the
    circuit page's heatmaps (:func:`bertology.report.circuit.write_circuit_page`)."""
    loaded = resolve_model(model)
    clean_attention, corrupted_attention = (
        capture_encoded(
            loaded, encode_token_ids(loaded.tokenizer, np.array([text_token_ids(loaded, text, prepend_bos)]))
        )[0]
        for text in (clean, corrupted)
    )
    return PairAttention(clean_attention, corrupted_attention)
