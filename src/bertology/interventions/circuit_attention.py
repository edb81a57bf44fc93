"""The attention of a clean and a corrupted input, which a circuit's page draws for each head."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertology.attention.capturing import Attention, capture_batch
from bertology.models.loading import LoadedModel


@dataclass(frozen=True)
class PairAttention:
    """The attention of one clean/corrupted pair: each :class:`~bertology.attention.capturing.Attention`
    holds ``probs [layers, heads, n, n]`` and its tokens (``n`` may differ between the two)."""

    clean: Attention
    corrupted: Attention


def circuit_attention(
    model: LoadedModel | str | Path, clean: str, corrupted: str, *, max_length: int | None = None
) -> PairAttention:
    """Every head's attention on ``clean`` and on ``corrupted`` (one pass, padding removed), for the
    circuit page's heatmaps (:func:`bertology.report.circuit.write_circuit_page`)."""
    batch = capture_batch([clean, corrupted], model=model, max_length=max_length)
    return PairAttention(batch[0], batch[1])
