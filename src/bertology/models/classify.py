"""Run a sequence classifier over many examples: batched logits, and accuracy against gold labels.

Shared by fine-tuning (evaluation), ablation and pruning (scores) and the explain command, so every
score in bertology is computed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertology.corpus.encoding import encode
from bertology.models.loading import LoadedModel
from bertology.progress import Progress


def predict_logits(
    loaded: LoadedModel,
    texts: Sequence[str],
    texts_b: Sequence[str] | None = None,
    *,
    batch_size: int = 32,
    max_length: int | None = None,
    on_progress: Progress | None = None,
) -> np.ndarray:
    """Logits of ``loaded`` (a classifier from ``load_model(..., classifier=True)``) for every input.

    Returns: [len(texts), num_labels] float32, in input order. Runs without gradients, in eval mode
    (the model's mode is restored afterwards). on_progress: told the inputs done after each batch, out of
    ``len(texts)``.
    """
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    was_training = loaded.model.training
    loaded.model.eval()
    chunks: list[np.ndarray] = []
    try:
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                stop = start + batch_size
                encoded = encode(
                    loaded.tokenizer,
                    texts[start:stop],
                    None if texts_b is None else texts_b[start:stop],
                    max_length=limit,
                )
                logits = loaded.model(**loaded.model_inputs(encoded)).logits
                chunks.append(logits.float().cpu().numpy())
                if on_progress is not None:
                    on_progress(min(stop, len(texts)), len(texts))
    finally:
        loaded.model.train(was_training)
    return np.concatenate(chunks)


def accuracy(logits: np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """Fraction of rows of ``logits`` [n, num_labels] whose arg-max equals ``labels`` [n]."""
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(labels)))
