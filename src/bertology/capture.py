"""Capture attention for texts and pairs: encode, run the model once, collect every layer.

``capture(text, text_b)`` gives one :class:`Attention` (padding-free numpy arrays);
``capture_batch(texts, texts_b)`` gives an :class:`AttentionBatch` (padded torch tensors, for
statistics) that also yields one :class:`Attention` per input.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.hook import recording
from bertology.inputs import EncodedBatch, Text, encode
from bertology.models import LoadedModel, require_pair_template, resolve_model
from bertology.norms import NormWeighting, Weights, check_weights


class HeadGrid:
    """Mixin for results whose ``probs`` is ``[layers, heads, ...]``."""

    probs: np.ndarray

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]


@dataclass
class Attention(HeadGrid):
    """The attention of one input, padding removed.

    probs: [layers, heads, n, n] float32; row = attending (query) token, column = attended-to (key)
        token; each row sums to 1.
    tokens: the n token strings. segment_ids: [n] 0 = text A, 1 = text B. special: [n] bool.
    word_ids: [n] index into ``words`` or -1 for special tokens. word_segments: [len(words)].
    queries, keys: [layers, heads, n, head_dim] float32 (before scaling) or ``None``.
    scaling: [layers] the factor applied to q·k before softmax.
    value_norms: [layers, heads, n] float32 ``||f(x_j)||`` of each key token (norm-based weights captured
        with ``qk=True``), else ``None``.
    truncated: tokens cut to fit the model. model_name: the model's label.
    weights: what ``probs`` holds: ``"attention"`` (the softmax output) or ``"norm"`` (norm-based
        weights, see :mod:`bertology.norms`).
    """

    probs: np.ndarray
    tokens: list[str]
    segment_ids: np.ndarray
    special: np.ndarray
    word_ids: np.ndarray
    words: list[str]
    word_segments: np.ndarray
    queries: np.ndarray | None
    keys: np.ndarray | None
    scaling: np.ndarray
    truncated: int
    model_name: str
    weights: Weights = "attention"
    value_norms: np.ndarray | None = None

    @property
    def is_pair(self) -> bool:
        return bool(self.segment_ids.max(initial=0) > 0)


@dataclass
class AttentionBatch:
    """Attention of a padded batch.

    probs: [batch, layers, heads, max_n, max_n] float32; entries past ``lengths[b]`` are padding
        (zero columns for padded keys; padded query rows are meaningless).
    queries, keys: [batch, layers, heads, max_n, head_dim] or ``None``.
    scaling: [layers]. encoded: tokens, segments and word alignment of every input.
    weights: what ``probs`` holds (see :class:`Attention`).
    value_norms: [batch, layers, heads, max_n] (see :class:`Attention`) or ``None``.
    """

    probs: torch.Tensor
    queries: torch.Tensor | None
    keys: torch.Tensor | None
    scaling: np.ndarray
    encoded: EncodedBatch
    model_name: str
    weights: Weights = "attention"
    value_norms: torch.Tensor | None = None

    @property
    def lengths(self) -> np.ndarray:
        return self.encoded.lengths

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> Attention:
        n = int(self.lengths[index])
        enc = self.encoded

        def unpad(values: torch.Tensor | None) -> np.ndarray | None:
            return None if values is None else values[index, :, :, :n].float().cpu().numpy()

        return Attention(
            probs=self.probs[index, :, :, :n, :n].float().cpu().numpy(),
            tokens=enc.tokens[index],
            segment_ids=enc.segment_ids[index],
            special=enc.special[index],
            word_ids=enc.word_ids[index],
            words=enc.words[index],
            word_segments=enc.word_segments[index],
            queries=unpad(self.queries),
            keys=unpad(self.keys),
            scaling=self.scaling,
            truncated=enc.truncated[index],
            model_name=self.model_name,
            weights=self.weights,
            value_norms=unpad(self.value_norms),
        )

    def __iter__(self) -> Iterator[Attention]:
        return (self[index] for index in range(len(self)))


def accepted_inputs(loaded: LoadedModel, encoded: EncodedBatch) -> dict[str, torch.Tensor]:
    """The encoded tensors the model's forward takes (DistilBERT takes no token_type_ids)."""
    parameters = inspect.signature(loaded.model.forward).parameters
    return {
        name: tensor.to(loaded.device) for name, tensor in encoded.model_inputs.items() if name in parameters
    }


def _encode(
    loaded: LoadedModel,
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None,
    max_length: int | None,
    pad_to_multiple_of: int | None,
) -> EncodedBatch:
    """Encode for one forward pass of ``loaded`` (an encoder, or a decoder given single texts).

    Raises:
        BertologyError: an encoder-decoder model (use :func:`~bertology.capture_seq2seq.capture_seq2seq`),
            or pairs for a model whose tokenizer has no pair template.
    """
    if loaded.kind == "encoder-decoder":
        raise BertologyError(
            f"'{loaded.name}' is an encoder-decoder model; capture it from a source and a target text "
            "with capture_seq2seq (or 'bertology view SOURCE --target TARGET')."
        )
    if texts_b is not None and any(text is not None for text in texts_b):
        require_pair_template(loaded)
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    return encode(loaded.tokenizer, texts, texts_b, max_length=limit, pad_to_multiple_of=pad_to_multiple_of)


def _weighting(loaded: LoadedModel, weights: str, keep_norms: bool = False) -> NormWeighting | None:
    """What turns each call's softmax output into ``weights`` (``None``: keep the softmax output)."""
    return NormWeighting(loaded.model, keep_norms=keep_norms) if check_weights(weights) == "norm" else None


def capture_batch(
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None = None,
    *,
    model: LoadedModel | str | Path | None = None,
    qk: bool = False,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    weights: Weights = "attention",
) -> AttentionBatch:
    """Run ``model`` once on a padded batch and return the attention of every layer (the pass stops at
    the last layer's attention: nothing after it changes attention).

    max_length: token limit per input (default and upper bound: the model's own limit).
    qk: also keep each layer's per-head query and key vectors (for the neuron view).
    pad_to_multiple_of: pad the batch to a multiple of this many tokens (see :func:`encode`).
    weights: ``"attention"`` (the softmax output) or ``"norm"`` (norm-based weights,
        :mod:`bertology.norms`; with ``qk``, also each key's ``||f(x_j)||``).
    """
    loaded = resolve_model(model)
    encoded = _encode(loaded, texts, texts_b, max_length, pad_to_multiple_of)
    weighting = _weighting(loaded, weights, keep_norms=qk)
    with (
        torch.inference_mode(),
        recording(keep_qk=qk, weighting=weighting, stop_after=loaded.num_layers) as recorder,
    ):
        loaded.model(**accepted_inputs(loaded, encoded))
    calls = recorder.calls
    return AttentionBatch(
        probs=torch.stack([call.probs for call in calls], dim=1),
        queries=torch.stack([call.query for call in calls], dim=1) if qk else None,
        keys=torch.stack([call.key for call in calls], dim=1) if qk else None,
        scaling=np.array([call.scaling for call in calls]),
        encoded=encoded,
        model_name=loaded.name,
        weights=weights,
        value_norms=torch.stack(weighting.norms, dim=1).cpu() if weighting and weighting.keep_norms else None,
    )


def stream_batch(
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None,
    consumer: Callable[[EncodedBatch], Callable[[torch.Tensor], None]],
    *,
    model: LoadedModel,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    weights: Weights = "attention",
) -> EncodedBatch:
    """Run ``model`` once on a padded batch, streaming each layer's attention as soon as it is computed
    (up to the last layer's attention, where the pass stops).

    consumer: called once with the encoded batch before the model runs; it returns the function that
        then receives each layer's ``probs`` [batch, heads, N, N] (right-padded), in layer order.
    Nothing is kept, so each layer's buffer is reused by the next: the way to feed streaming statistics.
    Options as :func:`capture_batch`. Returns the encoded batch (tokens, lengths, word alignment).
    """
    encoded = _encode(model, texts, texts_b, max_length, pad_to_multiple_of)
    weighting = _weighting(model, weights)
    with (
        torch.inference_mode(),
        recording(consume=consumer(encoded), weighting=weighting, stop_after=model.num_layers),
    ):
        model.model(**accepted_inputs(model, encoded))
    return encoded


def capture(
    text: Text,
    text_b: Text | None = None,
    *,
    model: LoadedModel | str | Path | None = None,
    qk: bool = False,
    max_length: int | None = None,
    weights: Weights = "attention",
) -> Attention:
    """The attention of one text or one pair (see :func:`capture_batch`)."""
    batch = capture_batch(
        [text],
        None if text_b is None else [text_b],
        model=model,
        qk=qk,
        max_length=max_length,
        weights=weights,
    )
    return batch[0]
