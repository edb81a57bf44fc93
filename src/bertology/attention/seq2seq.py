"""Capture the attention of an encoder-decoder model (BART, T5) for a source and a target text.

The source is encoded like any text (:func:`bertology.corpus.encoding.encode`). The target is tokenized as the
model's labels (``tokenizer(text_target=...)``) and read by the decoder with teacher forcing, exactly as
in training: the labels shifted one place right behind the model's decoder start token
(``config.decoder_start_token_id``: ``</s>`` for BART, ``<pad>`` for T5). So decoder position ``t``
reads label ``t - 1`` and predicts label ``t``; the last label (``</s>``) is never read, and the decoder
sees as many tokens as there are labels.

One forward pass makes its attention calls in this order (checked against ``output_attentions=True``
in the tests): every encoder layer's self-attention, then, per decoder layer, its (causal)
self-attention followed by its cross-attention (queries: decoder tokens, keys: source tokens).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PretrainedConfig

from bertology.corpus.encoding import encode
from bertology.errors import BertologyError, TruncationWarning
from bertology.models.hook import AttentionCall, recording
from bertology.models.loading import KIND_PHRASES, LoadedModel, resolve_model
from bertology.options import AttentionSetName

#: The three attention sets of an encoder-decoder model, in the order the views offer them.
ATTENTION_SETS: tuple[AttentionSetName, ...] = ("encoder", "decoder", "cross")


@dataclass
class Seq2SeqAttention:
    """The attention of one source and target text in an encoder-decoder model.

    encoder: [encoder_layers, heads, S, S] encoder self-attention over the source tokens.
    decoder: [decoder_layers, heads, T, T] decoder self-attention; causal, so entries above the diagonal
        (a later key) are 0.
    cross: [decoder_layers, heads, T, S] cross-attention; row = decoder (target) token, column = source
        token. Every row of every array sums to 1.
    source_tokens: the S source tokens. target_tokens: the T tokens the decoder reads (the decoder start
        token, then the target's labels but the last; see the module docstring).
    truncated: source tokens cut to fit the model. model_name: the model's label.
    """

    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray
    source_tokens: list[str]
    target_tokens: list[str]
    truncated: int
    model_name: str

    def probs(self, name: AttentionSetName) -> np.ndarray:
        """The array of one attention set (``"encoder"``, ``"decoder"`` or ``"cross"``)."""
        if name not in ATTENTION_SETS:
            raise BertologyError(f"Unknown attention '{name}'; choose one of {', '.join(ATTENTION_SETS)}.")
        return getattr(self, name)


def encoder_decoder_layers(config: PretrainedConfig) -> tuple[int, int]:
    """(encoder layers, decoder layers) of a BART- or T5-style config."""
    encoder = getattr(config, "encoder_layers", None) or config.num_layers
    decoder = getattr(config, "decoder_layers", None) or config.num_decoder_layers
    return int(encoder), int(decoder)


def _decoder_input(loaded: LoadedModel, target: str, max_length: int) -> list[int]:
    """Token ids the decoder reads for ``target``: the start token, then the labels but the last."""
    if not target.strip():
        raise BertologyError("The target text is empty or only whitespace; give some text to decode.")
    start = loaded.model.config.decoder_start_token_id
    if start is None:
        raise BertologyError(f"'{loaded.name}' has no decoder start token in its config.")
    labels = loaded.tokenizer(text_target=target)["input_ids"]
    if len(labels) > max_length:
        cut = len(labels) - max_length
        warnings.warn(
            f"The target has {len(labels)} tokens but the model takes at most {max_length}; "
            f"{cut} {'token was' if cut == 1 else 'tokens were'} cut from the end.",
            TruncationWarning,
            stacklevel=3,
        )
        labels = labels[:max_length]
    return [int(start), *labels[:-1]]


def _stack(calls: list[AttentionCall]) -> np.ndarray:
    """[layers, heads, q, k] from one input's calls (each [1, heads, q, k])."""
    return torch.stack([call.probs[0] for call in calls]).float().cpu().numpy()


def capture_seq2seq(
    source: str,
    target: str,
    *,
    model: LoadedModel | str | Path | None = None,
    max_length: int | None = None,
) -> Seq2SeqAttention:
    """Run an encoder-decoder ``model`` once on ``source`` (encoder) and ``target`` (decoder, teacher
    forcing) and return its encoder, decoder and cross-attention.

    max_length: token limit for the source and for the target each (default and upper bound: the
        model's own limit).

    Raises:
        BertologyError: a model that is not an encoder-decoder, or an empty text.
    """
    loaded = resolve_model(model)
    if loaded.kind != "encoder-decoder":
        raise BertologyError(
            f"'{loaded.name}' is {KIND_PHRASES[loaded.kind]} model; a source and a target text need an "
            "encoder-decoder model (BART, T5)."
        )
    limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
    encoded = encode(loaded.tokenizer, [source], max_length=limit)
    decoder_ids = _decoder_input(loaded, target, limit)
    device = loaded.device
    with torch.inference_mode(), recording() as recorder:
        loaded.model(
            input_ids=encoded.model_inputs["input_ids"].to(device),
            attention_mask=encoded.model_inputs["attention_mask"].to(device),
            decoder_input_ids=torch.tensor([decoder_ids], device=device),
            use_cache=False,
        )
    encoder_layers, decoder_layers = encoder_decoder_layers(loaded.model.config)
    calls = recorder.calls
    if len(calls) != encoder_layers + 2 * decoder_layers:
        raise RuntimeError(
            f"Expected {encoder_layers} + 2 x {decoder_layers} attention calls, got {len(calls)}."
        )
    decoder_calls = calls[encoder_layers:]
    return Seq2SeqAttention(
        encoder=_stack(calls[:encoder_layers]),
        decoder=_stack(decoder_calls[0::2]),
        cross=_stack(decoder_calls[1::2]),
        source_tokens=encoded.tokens[0],
        target_tokens=loaded.tokenizer.convert_ids_to_tokens(decoder_ids),
        truncated=encoded.truncated[0],
        model_name=loaded.name,
    )
