"""Word-level attention rows of chosen query words, captured a layer at a time in bounded memory.

The coreference and GAP probes need, per input, the attention *from* a few query words (mention heads,
the pronoun) *to* every word, in every layer and head: ``W[q, w]`` = the mean over the query word's tokens
of their attention rows, summed over the tokens of key word ``w`` (mean mode, as
:func:`bertology.attention.words.word_attention`). :func:`query_word_rows` computes only those rows while the
model runs and keeps nothing else: where the model's attention is ``softmax(q·k * scaling + mask)``
(:func:`~bertology.attention.long_capture.long_input_refusal` is ``None``), the forward pass uses the fused
kernel and the rows are recomputed from each layer's queries and keys (:meth:`LayerQueriesKeys.rows_at`);
otherwise each layer's probabilities are streamed (:func:`~bertology.attention.capturing.stream_batch`) and
dropped after the rows are taken from them. Either way, no ``[layers, heads, n, n]`` map is held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.attention.capturing import encode_for_model, stream_batch, stream_long_batch
from bertology.attention.long_capture import LayerQueriesKeys, long_input_refusal
from bertology.corpus.batching import PAD_MULTIPLE
from bertology.corpus.encoding import EncodedBatch
from bertology.models.loading import LoadedModel


@dataclass(frozen=True)
class QueryRows:
    """The captured rows of one input.

    rows: [layers, heads, queries, words] float32 word attention from each query word to every word
        (a query word without tokens has a zero row, a word without tokens a zero column).
    tokens: [words] int64 how many tokens each word has. truncated: tokens cut to fit the model.
    """

    rows: np.ndarray
    tokens: np.ndarray
    truncated: int


class _Rows:
    """Receives a batch's layers and keeps, per layer, the word rows of every input's query words."""

    def __init__(self, queries: Sequence[Sequence[int]], device: torch.device) -> None:
        self.queries, self.device = queries, device
        self.layers: list[list[torch.Tensor]] = []

    def __call__(self, encoded: EncodedBatch) -> Callable[[torch.Tensor | LayerQueriesKeys], None]:
        """Prepare, per input, its query tokens (``batch``, ``positions``: where their rows are), the mean
        over each query word's tokens ``[q, t]`` and the sum over each key word's tokens ``[N, words]``."""
        width = int(encoded.model_inputs["input_ids"].shape[1])
        batch, positions, self.means, self.to_words = [], [], [], []
        for index, (word_ids, queries) in enumerate(zip(encoded.word_ids, self.queries, strict=True)):
            word_ids = np.asarray(word_ids)
            picked = np.isin(word_ids, queries)
            tokens = np.flatnonzero(picked)
            batch.append(np.full(len(tokens), index))
            positions.append(tokens)
            mean = (np.asarray(queries)[:, None] == word_ids[tokens][None, :]).astype(np.float32)
            mean /= np.maximum(mean.sum(1, keepdims=True), 1.0)
            to_words = np.zeros((width, len(encoded.words[index])), dtype=np.float32)
            is_word = np.flatnonzero(word_ids >= 0)
            to_words[is_word, word_ids[is_word]] = 1.0
            self.means.append(torch.from_numpy(mean).to(self.device))
            self.to_words.append(torch.from_numpy(to_words).to(self.device))
        self.batch = torch.from_numpy(np.concatenate(batch)).long()
        self.positions = torch.from_numpy(np.concatenate(positions)).long()
        self.splits = [len(tokens) for tokens in positions]
        return self.add

    def add(self, layer: torch.Tensor | LayerQueriesKeys) -> None:
        """One layer: probabilities [B, H, N, N], or its queries and keys."""
        if isinstance(layer, LayerQueriesKeys):
            rows = layer.rows_at(self.batch, self.positions)  # [M, H, N]
        else:
            rows = layer[self.batch.to(layer.device), :, self.positions.to(layer.device)].float()
        words = []
        for part, mean, to_words in zip(rows.split(self.splits), self.means, self.to_words, strict=True):
            summed = part.transpose(0, 1) @ to_words  # [H, t, words]
            words.append(torch.einsum("qt,htw->hqw", mean, summed))
        self.layers.append(words)


def query_word_rows(
    inputs: Sequence[Sequence[str]],
    queries: Sequence[Sequence[int]],
    model: LoadedModel,
    *,
    max_length: int | None = None,
) -> list[QueryRows]:
    """One forward pass over ``inputs`` (pre-split words), padded to a multiple of
    :data:`~bertology.corpus.batching.PAD_MULTIPLE` tokens: for each input, the word rows of its ``queries``
    (word indices), see the module docstring. Inputs longer than ``max_length`` tokens (default and upper
    bound: the model's) are cut without a warning; their ``truncated`` says by how much."""
    collector = _Rows(queries, model.device)
    texts = [list(words) for words in inputs]
    encoded = encode_for_model(  # the callers count truncated inputs: no warnings
        model, texts, max_length=max_length, pad_to_multiple_of=PAD_MULTIPLE, warn=False
    )
    if long_input_refusal(model.entry, model.model.config, model.name) is None:
        stream_long_batch(encoded, collector, model=model)
    else:
        stream_batch(encoded, collector, model=model)
    per_input = [torch.stack(layer_rows) for layer_rows in zip(*collector.layers, strict=True)]
    host = torch.cat([rows.flatten() for rows in per_input]).cpu().numpy() if per_input else np.zeros(0)
    results, offset = [], 0
    for index, rows in enumerate(per_input):
        size = rows.numel()
        word_ids = np.asarray(encoded.word_ids[index])
        tokens = np.bincount(word_ids[word_ids >= 0], minlength=len(encoded.words[index]))
        results.append(
            QueryRows(host[offset : offset + size].reshape(rows.shape), tokens, int(encoded.truncated[index]))
        )
        offset += size
    return results
