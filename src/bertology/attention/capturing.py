"""Capture attention for texts and pairs: encode, run the model once, collect every layer.

``capture(text, text_b)`` gives one :class:`Attention` (padding-free numpy arrays), or for an input over
:data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS` tokens a
:class:`~bertology.attention.long_capture.LongAttention` (queries and keys, rows computed on demand);
``capture_batch(texts, texts_b)`` gives an :class:`AttentionBatch` (padded torch tensors, for
statistics) that also yields one :class:`Attention` per input, ``capture_long_batch`` a
:class:`~bertology.attention.long_capture.LongAttentionBatch`.

One rule for arrays: what describes one input (an :class:`Attention`, a
:class:`~bertology.attention.long_capture.LongAttention`'s blocks, thumbnails and vectors) is float32 numpy on
the host, for views, numpy and pandas; a batch (:class:`AttentionBatch`,
:class:`~bertology.attention.long_capture.LongAttentionBatch`) keeps torch tensors where the model ran, on its
device (probabilities, queries and keys in its dtype; value norms in float32), for computations that stay
there (the streaming statistics); indexing or iterating over a batch brings each input to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from bertology.attention.long_capture import (
    CHUNK_BYTES,
    LONG_INPUT_TOKENS,
    LayerQueriesKeys,
    LongAttention,
    LongAttentionBatch,
    QueryKeyRecording,
    long_input_refusal,
)
from bertology.attention.norms import NormWeighting, Weights, check_weights
from bertology.corpus.encoding import EncodedBatch, InputDescription, Text, encode
from bertology.errors import BertologyError
from bertology.models.hook import recording
from bertology.models.loading import LoadedModel, require_pair_template, resolve_model
from bertology.models.model_types import neuron_view_refusal


class HeadGrid:
    """Mixin for results whose ``probs`` is ``[layers, heads, ...]``."""

    probs: np.ndarray

    @property
    def num_layers(self) -> int:
        return self.probs.shape[0]

    @property
    def num_heads(self) -> int:
        return self.probs.shape[1]


@dataclass(frozen=True)
class Attention(InputDescription, HeadGrid):
    """The attention of one input, padding removed; the input's tokens, segments and words are those of
    its :class:`~bertology.corpus.encoding.InputDescription`.

    probs: [layers, heads, n, n] float32; row = attending (query) token, column = attended-to (key)
        token; each row sums to 1.
    queries, keys: [layers, heads, n, head_dim] float32 (before scaling) or ``None``.
    scaling: [layers] the factor applied to q·k before softmax.
    value_norms: [layers, heads, n] float32 ``||f(x_j)||`` of each key token (norm-based weights captured
        with ``qk=True``), else ``None``.
    weights: what ``probs`` holds: ``"attention"`` (the softmax output) or ``"norm"`` (norm-based
        weights, see :mod:`bertology.attention.norms`).
    """

    probs: np.ndarray
    queries: np.ndarray | None
    keys: np.ndarray | None
    scaling: np.ndarray
    weights: Weights = "attention"
    value_norms: np.ndarray | None = None


@dataclass
class AttentionBatch:
    """Attention of a padded batch, as torch tensors on the model's device (see the module docstring);
    ``batch[i]`` is input ``i``'s :class:`Attention` in float32 numpy.

    probs: [batch, layers, heads, max_n, max_n] in the model's dtype; entries past ``lengths[b]`` are
        padding (zero columns for padded keys; padded query rows are meaningless).
    queries, keys: [batch, layers, heads, max_n, head_dim] in the model's dtype, or ``None``.
    scaling: [layers]. encoded: tokens, segments and word alignment of every input.
    weights: what ``probs`` holds (see :class:`Attention`).
    value_norms: [batch, layers, heads, max_n] float32 (see :class:`Attention`) or ``None``.
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

    @cached_property
    def _host(self) -> dict[str, np.ndarray | None]:
        """``probs``, ``queries``, ``keys`` and ``value_norms`` as float32 numpy arrays, brought to the host
        in one transfer each for all the batch's inputs (not one per input)."""
        tensors = {"probs": self.probs, "queries": self.queries, "keys": self.keys, "norms": self.value_norms}
        return {
            name: None if values is None else values.detach().to(device="cpu", dtype=torch.float32).numpy()
            for name, values in tensors.items()
        }

    def __getitem__(self, index: int) -> Attention:
        n = int(self.lengths[index])
        host = self._host

        def unpad(name: str) -> np.ndarray | None:
            values = host[name]
            return None if values is None else values[index, :, :, :n]

        probs = host["probs"]
        assert probs is not None
        return Attention.of_input(
            self.encoded,
            index,
            self.model_name,
            probs=probs[index, :, :, :n, :n],
            queries=unpad("queries"),
            keys=unpad("keys"),
            scaling=self.scaling,
            weights=self.weights,
            value_norms=unpad("norms"),
        )

    def __iter__(self) -> Iterator[Attention]:
        return (self[index] for index in range(len(self)))


def encode_for_model(
    loaded: LoadedModel,
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None = None,
    *,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    warn: bool = True,
) -> EncodedBatch:
    """Encode for one forward pass of ``loaded`` (an encoder, or a decoder given single texts), cut to
    ``max_length`` tokens (and the model's own limit): the input of :func:`stream_batch` and
    :func:`stream_long_batch`.

    tokenizer: a copy of ``loaded``'s tokenizer to encode with, for a thread that encodes while the model
    runs (:func:`~bertology.corpus.batching.prefetched`; a tokenizer is not to be used by two threads
    at once).
    warn: as :func:`~bertology.corpus.encoding.encode`.

    Raises:
        BertologyError: an encoder-decoder model (use :func:`~bertology.attention.seq2seq.capture_seq2seq`),
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
    return encode(
        tokenizer or loaded.tokenizer,
        texts,
        texts_b,
        max_length=limit,
        pad_to_multiple_of=pad_to_multiple_of,
        warn=warn,
    )


def _require_queries_keys(loaded: LoadedModel, tokens: int) -> None:
    """Refuse ``qk=True`` where q·k (scaled, masked, softmaxed) is not this model's attention for inputs of
    ``tokens`` tokens (relative-position terms, capped scores, a sliding window shorter than the input).

    Raises:
        BertologyError: a sentence that says why (:func:`~bertology.models.model_types.neuron_view_refusal`).
    """
    refusal = neuron_view_refusal(loaded.entry, loaded.model.config, loaded.name, tokens)
    if refusal is not None:
        raise BertologyError(refusal)


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
    the last layer's attention: nothing after it changes attention), as torch tensors on the model's
    device (:class:`AttentionBatch`); ``result[i]`` is input ``i``'s :class:`Attention` in float32 numpy.

    max_length: token limit per input (default and upper bound: the model's own limit).
    qk: also keep each layer's per-head query and key vectors (for the neuron view; grouped-query
        attention: each query head's key is its key/value group's); refused where q·k alone does not give
        the model's attention.
    pad_to_multiple_of: pad the batch to a multiple of this many tokens (see :func:`encode`).
    weights: ``"attention"`` (the softmax output) or ``"norm"`` (norm-based weights,
        :mod:`bertology.attention.norms`; with ``qk``, also each key's ``||f(x_j)||``).
    """
    loaded = resolve_model(model)
    encoded = encode_for_model(
        loaded, texts, texts_b, max_length=max_length, pad_to_multiple_of=pad_to_multiple_of
    )
    return capture_encoded(loaded, encoded, qk, weights)


def capture_encoded(
    loaded: LoadedModel, encoded: EncodedBatch, qk: bool = False, weights: Weights = "attention"
) -> AttentionBatch:
    """:func:`capture_batch` of a batch already encoded (:func:`encode_for_model`, or
    :func:`~bertology.corpus.encoding.encode_token_ids` for constructed token sequences)."""
    if qk:
        _require_queries_keys(loaded, int(encoded.lengths.max()))
    weighting = _weighting(loaded, weights, keep_norms=qk)
    with (
        torch.inference_mode(),
        recording(keep_qk=qk, weighting=weighting, stop_after=loaded.num_layers) as recorder,
    ):
        loaded.model(**loaded.model_inputs(encoded))
    calls = recorder.calls
    return AttentionBatch(
        probs=torch.stack([call.probs for call in calls], dim=1),
        queries=torch.stack([call.query for call in calls], dim=1) if qk else None,
        keys=torch.stack([call.key for call in calls], dim=1) if qk else None,
        scaling=np.array([call.scaling for call in calls]),
        encoded=encoded,
        model_name=loaded.name,
        weights=weights,
        value_norms=torch.stack(weighting.norms, dim=1) if weighting and weighting.keep_norms else None,
    )


def stream_batch(
    encoded: EncodedBatch,
    consumer: Callable[[EncodedBatch], Callable[[torch.Tensor], None]],
    *,
    model: LoadedModel,
    weights: Weights = "attention",
) -> EncodedBatch:
    """Run ``model`` once on a padded batch (:func:`encode_for_model`), streaming each layer's attention as
    soon as it is computed (up to the last layer's attention, where the pass stops).

    consumer: called once with the encoded batch before the model runs; it returns the function that
        then receives each layer's ``probs`` [batch, heads, N, N] (right-padded), in layer order.
    Nothing is kept, so each layer's buffer is reused by the next: the way to feed streaming statistics.
    weights: as :func:`capture_batch`. Returns ``encoded``.
    """
    weighting = _weighting(model, weights)
    with (
        torch.inference_mode(),
        recording(consume=consumer(encoded), weighting=weighting, stop_after=model.num_layers),
    ):
        model.model(**model.model_inputs(encoded))
    return encoded


def _require_long_path(loaded: LoadedModel, weights: Weights = "attention") -> None:
    """Refuse the query/key capture where it cannot give this model's attention (or ``weights``).

    Raises:
        BertologyError: a sentence that says why
            (:func:`~bertology.attention.long_capture.long_input_refusal`), or norm-based weights, which need
            every layer's probabilities and value vectors.
    """
    refusal = long_input_refusal(loaded.entry, loaded.model.config, loaded.name)
    if refusal is not None:
        raise BertologyError(refusal)
    if check_weights(weights) == "norm":
        raise BertologyError(
            "Norm-based weights need every layer's probabilities; inputs captured by queries and keys (over "
            f"{LONG_INPUT_TOKENS:,} tokens) have attention weights only."
        )


def uses_queries_keys(loaded: LoadedModel, tokens: int, weights: Weights = "attention") -> bool:
    """Whether ``mode="auto"`` captures inputs of ``tokens`` tokens by queries and keys: over
    :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS`, for the attention weights of a model whose
    attention is ``softmax(q·k * scaling + mask)``
    (:func:`~bertology.attention.long_capture.long_input_refusal`)."""
    return (
        tokens > LONG_INPUT_TOKENS
        and weights == "attention"
        and long_input_refusal(loaded.entry, loaded.model.config, loaded.name) is None
    )


def _record_queries_keys(
    loaded: LoadedModel,
    encoded: EncodedBatch,
    consume: Callable[[LayerQueriesKeys], None],
    qk_dtype: torch.dtype | None,
) -> None:
    """Run ``loaded`` once on ``encoded`` with fused attention, handing each layer's queries and keys to
    ``consume`` (:class:`~bertology.attention.long_capture.QueryKeyRecording`); the pass stops after the last
    layer's attention."""
    _require_long_path(loaded)
    with (
        torch.inference_mode(),
        recording(override=QueryKeyRecording(consume, qk_dtype), stop_after=loaded.num_layers),
    ):
        loaded.model(**loaded.model_inputs(encoded))


def capture_long_batch(
    texts: Sequence[Text],
    texts_b: Sequence[Text | None] | None = None,
    *,
    model: LoadedModel | str | Path | None = None,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    qk_dtype: torch.dtype | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> LongAttentionBatch:
    """Run ``model`` once on a padded batch with fused attention and keep each layer's queries and keys
    (memory linear in the tokens; :mod:`bertology.attention.long_capture`), from which any rows of any head
    are computed exactly.

    qk_dtype: keep them in this dtype (default: the model's; ``torch.float16`` halves the memory).
    chunk_bytes: memory bound of one chunk of computed rows. Other options as :func:`capture_batch`.

    Raises:
        BertologyError: a model whose attention is not ``softmax(q·k * scaling + mask)`` (relative-position
            terms, capped scores) or an encoder-decoder.
    """
    loaded = resolve_model(model)
    encoded = encode_for_model(
        loaded, texts, texts_b, max_length=max_length, pad_to_multiple_of=pad_to_multiple_of
    )
    return _capture_long(loaded, encoded, qk_dtype, chunk_bytes)


def _capture_long(
    loaded: LoadedModel, encoded: EncodedBatch, qk_dtype: torch.dtype | None, chunk_bytes: int
) -> LongAttentionBatch:
    """:func:`capture_long_batch` of an encoded batch."""
    layers: list[LayerQueriesKeys] = []
    _record_queries_keys(loaded, encoded, layers.append, qk_dtype)
    return LongAttentionBatch(layers, encoded, loaded.name, chunk_bytes)


def stream_long_batch(
    encoded: EncodedBatch,
    consumer: Callable[[EncodedBatch], Callable[[LayerQueriesKeys], None]],
    *,
    model: LoadedModel,
) -> EncodedBatch:
    """As :func:`stream_batch`, for long inputs: the function ``consumer`` returns receives each layer's
    :class:`~bertology.attention.long_capture.LayerQueriesKeys` (queries and keys of the padded batch, rows on
    demand) instead of its probabilities, so no ``n x n`` map of a whole layer is ever formed.

    Raises:
        BertologyError: as :func:`capture_long_batch`.
    """
    _record_queries_keys(model, encoded, consumer(encoded), None)
    return encoded


#: How :func:`capture` keeps attention: ``"probs"`` every layer's probabilities, ``"qk"`` the queries and
#: keys (:mod:`bertology.attention.long_capture`), ``"auto"`` queries and keys for inputs over
#: :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS` tokens where the model allows it
#: (:func:`uses_queries_keys`), else probabilities.
CaptureMode = Literal["auto", "probs", "qk"]


def capture(
    text: Text,
    text_b: Text | None = None,
    *,
    model: LoadedModel | str | Path | None = None,
    qk: bool = False,
    max_length: int | None = None,
    weights: Weights = "attention",
    mode: CaptureMode = "auto",
    qk_dtype: torch.dtype | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> Attention | LongAttention:
    """The attention of one text or one pair: an :class:`Attention` (float32 numpy on the host; see
    :func:`capture_batch`, which keeps a batch's torch tensors on the model's device instead), or with
    ``mode="qk"`` (``"auto"``: for inputs over :data:`~bertology.attention.long_capture.LONG_INPUT_TOKENS`
    tokens) a :class:`~bertology.attention.long_capture.LongAttention` (see :func:`capture_long_batch`; its
    queries and keys are always kept, so ``qk`` changes nothing there).

    Raises:
        BertologyError: ``mode="qk"`` for a model or ``weights`` the query/key capture cannot give.
    """
    if mode not in ("auto", "probs", "qk"):
        raise BertologyError(f"The capture mode must be 'auto', 'probs' or 'qk', not {mode!r}.")
    loaded = resolve_model(model)
    encoded = encode_for_model(loaded, [text], None if text_b is None else [text_b], max_length=max_length)
    if mode == "auto":
        mode = "qk" if uses_queries_keys(loaded, int(encoded.lengths[0]), weights) else "probs"
    if mode == "qk":
        _require_long_path(loaded, weights)
        return _capture_long(loaded, encoded, qk_dtype, chunk_bytes)[0]
    return capture_encoded(loaded, encoded, qk, weights)[0]
