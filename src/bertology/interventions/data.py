"""Labelled examples for a classifier, and their encoded batches.

Batches are cut as :func:`bertology.models.classify.predict_logits` cuts them (input order, the same batch
size and token limit), so a score computed from them equals one computed through it; or, for speed,
from the examples sorted by token count, so a batch is padded to little more than its own length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from bertology.corpus.encoding import EncodedBatch, encode
from bertology.corpus.readers.glue import GlueTask, Split
from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel


@dataclass(frozen=True)
class LabelledTexts:
    """Inputs of a classifier with gold labels.

    texts, texts_b: text A of each example and, for pair tasks, text B (else ``None``).
    labels: [examples] int, ids in the model's label order (``config.label2id``).
    """

    texts: list[str]
    texts_b: list[str] | None
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)

    def part(self, start: int, stop: int) -> LabelledTexts:
        """Examples ``start .. stop - 1``."""
        texts_b = None if self.texts_b is None else self.texts_b[start:stop]
        return LabelledTexts(self.texts[start:stop], texts_b, self.labels[start:stop])

    def take(self, rows: np.ndarray) -> LabelledTexts:
        """Examples ``rows``, in that order."""
        texts_b = None if self.texts_b is None else [self.texts_b[row] for row in rows]
        return LabelledTexts([self.texts[row] for row in rows], texts_b, self.labels[rows])

    @classmethod
    def of_split(cls, loaded: LoadedModel, task: GlueTask, split: Split) -> LabelledTexts:
        """The examples of ``split`` with their labels mapped to ``loaded``'s label ids by name.

        Raises:
            BertologyError: the task has a label the classifier does not know.
        """
        label2id = {str(name): int(number) for name, number in loaded.model.config.label2id.items()}
        unknown = sorted({example.label for example in split.examples} - label2id.keys())
        if unknown:
            raise BertologyError(
                f"The classifier '{loaded.name}' has the labels {', '.join(sorted(label2id))}, but "
                f"{task.name} has {', '.join(unknown[:5])}; use a classifier fine-tuned on this task."
            )
        labels = np.array([label2id[example.label] for example in split.examples], dtype=np.int64)
        return cls(split.texts, split.texts_b, labels)


@dataclass(frozen=True)
class Batch:
    """One encoded batch.

    inputs: the model's tensors ([batch, tokens] each, on the model's device).
    encoded: their tokens and roles. labels: [batch] int64 on the model's device.
    rows: [batch] int, the position of each example in the :class:`LabelledTexts` it came from.
    """

    inputs: dict[str, torch.Tensor]
    encoded: EncodedBatch
    labels: torch.Tensor
    rows: np.ndarray


def batches(
    loaded: LoadedModel,
    data: LabelledTexts,
    *,
    batch_size: int = 32,
    by_length: bool = False,
    max_length: int | None = None,
) -> Iterator[Batch]:
    """``data`` encoded in batches of ``batch_size`` examples: consecutive ones (as ``predict_logits``
    cuts them), or with ``by_length`` consecutive ones in the order of their token counts (stable)."""
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    order = np.arange(len(data))
    if by_length:
        order = np.argsort(token_counts(loaded, data, max_length=limit), kind="stable")
    for start in range(0, len(data), batch_size):
        rows = order[start : start + batch_size]
        encoded = encode(
            loaded.tokenizer,
            [data.texts[row] for row in rows],
            None if data.texts_b is None else [data.texts_b[row] for row in rows],
            max_length=limit,
        )
        labels = torch.as_tensor(data.labels[rows], device=loaded.device)
        yield Batch(loaded.model_inputs(encoded), encoded, labels, rows)


def token_counts(loaded: LoadedModel, data: LabelledTexts, *, max_length: int | None = None) -> list[int]:
    """Tokens of each example of ``data`` as ``loaded``'s tokenizer encodes it (special tokens included, cut
    to ``max_length``, default the model's limit)."""
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    encoded = loaded.tokenizer(data.texts, data.texts_b, truncation=True, max_length=limit)["input_ids"]
    return [len(ids) for ids in encoded]


@contextmanager
def eval_mode(loaded: LoadedModel) -> Iterator[None]:
    """Inside the block ``loaded``'s model is in eval mode (no dropout); its mode is restored after."""
    was_training = loaded.model.training
    loaded.model.eval()
    try:
        yield
    finally:
        loaded.model.train(was_training)
