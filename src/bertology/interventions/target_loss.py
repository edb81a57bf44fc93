"""Head interventions on an encoder-decoder (BART, T5), measured by the language-model loss of the target.

The loss is the mean cross-entropy of the target's tokens given the source, by teacher forcing, in nats
per predicted token:

    L = - (1 / N) sum_(x, y) sum_t log p(y_t | x, y_1 .. y_(t-1))

over every token ``y_t`` of every target ``y`` (its end token included; the decoder reads the start token
and ``y_1 .. y_(t-1)``), ``N`` such tokens in all; the target's tokens are the tokenizer's
``text_target`` ids. A corpus is JSON Lines with a ``text`` (the source) and a ``target`` on every line.

:class:`TargetLossTask` is an encoder-decoder and its pairs as a
:class:`~bertology.interventions.task.Task`, so the single-head sweep, Michel et al.'s importance
(``L(x)`` the target's mean cross-entropy) and the pruning curves measure ``L``; its heads are gated on
all three stacks at once (the gate rows of :func:`~bertology.models.anatomy.gate_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from bertology.corpus.readers import require_file, require_records
from bertology.corpus.readers.jsonl import read_records
from bertology.errors import BertologyError
from bertology.interventions.language_model import token_losses
from bertology.interventions.replacement import HeadReplacement, ZeroReplacement
from bertology.interventions.task import LOSS, Inputs, Score, Task, Terms
from bertology.models.loading import KIND_PHRASES, LoadedModel


@dataclass(frozen=True)
class SourceTargets:
    """Sources and their targets as token ids, each as the tokenizer builds it (special tokens included).

    sources: per pair, the source's ids [tokens] int64. labels: the target's ids [tokens] int64 (what
    the decoder predicts). origins: where each came from (``"file line N"`` or a description).
    """

    sources: list[np.ndarray]
    labels: list[np.ndarray]
    origins: list[str]

    def __len__(self) -> int:
        return len(self.sources)

    @property
    def predicted_tokens(self) -> int:
        """Target tokens predicted: ``sum(len(y))``."""
        return sum(len(labels) for labels in self.labels)

    @classmethod
    def of_texts(
        cls,
        loaded: LoadedModel,
        pairs: Sequence[tuple[str, str]],
        *,
        max_length: int | None = None,
        origins: Sequence[str] | None = None,
    ) -> SourceTargets:
        """``(source, target)`` ``pairs`` tokenized by ``loaded``'s tokenizer, each cut to ``max_length``
        tokens (default: the model's limit)."""
        limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
        tokenizer = loaded.tokenizer
        sources = tokenizer([source for source, _ in pairs], truncation=True, max_length=limit)["input_ids"]
        labels = tokenizer(text_target=[target for _, target in pairs], truncation=True, max_length=limit)[
            "input_ids"
        ]
        return cls(
            [np.asarray(ids, dtype=np.int64) for ids in sources],
            [np.asarray(ids, dtype=np.int64) for ids in labels],
            list(origins) if origins is not None else [f"pair {index}" for index in range(len(pairs))],
        )

    @classmethod
    def of_corpus(
        cls, loaded: LoadedModel, path: str | Path, *, max_length: int = 128, max_segments: int | None = None
    ) -> SourceTargets:
        """The first ``max_segments`` (``None``: all) lines of the JSON Lines file at ``path``, each a
        ``text`` (the source) and its ``target``, cut to ``max_length`` tokens.

        Raises:
            BertologyError: a missing file, a bad line, a line without a target, or no line at all.
        """
        path = Path(path)
        require_file(path)
        if path.suffix != ".jsonl":
            raise BertologyError(
                f"An encoder-decoder's corpus is JSON Lines with a 'text' and a 'target' on every line; "
                f"{path.name} is not a .jsonl file."
            )
        records = list(
            islice(require_records(read_records(path, second="target"), path, "sources"), max_segments)
        )
        if missing := next((record for record in records if record.text_b is None), None):
            raise BertologyError(
                f"{path.name} line {missing.line} has no 'target': the target's loss needs a target for "
                "every source (JSON Lines with 'text' and 'target')."
            )
        pairs = [(record.text, str(record.text_b)) for record in records]
        origins = [f"{path.name} line {record.line}" for record in records]
        return cls.of_texts(loaded, pairs, max_length=max_length, origins=origins)


def require_seq2seq_language_model(loaded: LoadedModel) -> None:
    """Refuse a model that is not an encoder-decoder with its language-modelling head.

    Raises:
        BertologyError: an encoder or a decoder, or an encoder-decoder loaded without its head.
    """
    if loaded.kind != "encoder-decoder":
        raise BertologyError(
            f"The target's loss needs an encoder-decoder language model; '{loaded.name}' is "
            f"{KIND_PHRASES[loaded.kind]} model."
        )
    if loaded.model.get_output_embeddings() is None:
        raise BertologyError(
            f"The target's loss needs the language-modelling head of '{loaded.name}': load it with "
            "load_model(..., language_model=True)."
        )


def _padded(
    rows: Sequence[np.ndarray], pad: int, first: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` right-padded with ``pad`` ([batch, tokens] ids) and their mask; ``first``: a token put
    before each row, whose last token is then left out (teacher forcing's decoder input)."""
    if first is not None:
        rows = [np.concatenate([[first], row[:-1]]) for row in rows]
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.as_tensor(np.ascontiguousarray(row))
        mask[index, : len(row)] = 1
    return ids, mask


#: An encoder-decoder's study on sources and targets (``bertology ablate --lm-corpus``); its heads are not
#: removed structurally.
TARGET_LOSS_TERMS = Terms(
    source="corpus",
    examples="sequences",
    counted="predicted tokens",
    baseline="loss (nats per token)",
    sentence="Target loss with every head: {score:.4f} nats per token (the mean cross-entropy of {count} "
    "target tokens given their sources, {examples} pairs). The heads are those of the encoder's "
    "self-attention, the decoder's self-attention and cross-attention, one after the other: the rows of the "
    "plots are the encoder's layers, then the decoder's, then cross-attention's (the CSV files' stack "
    "column).",
    headline="Target loss {score:.4f} nats per token on {count} target tokens of {examples} sources, heads "
    "of the encoder, decoder and cross stacks",
    head="head",
    averaged="pairs x",
    loss="the target's mean cross-entropy",
    axis="target cross-entropy (nats)",
    sign=": positive where the head helped",
    title=" (language-model loss)",
)


@dataclass(frozen=True)
class TargetLossTask(Task):
    """The encoder-decoder ``loaded`` (loaded with ``language_model=True``) scored by the mean cross-entropy
    ``L`` of the targets of ``data`` given their sources: per pair ``s(x)`` the summed cross-entropy of the
    target's tokens, ``w(x)`` their number; its loss for the importance is the pair's mean. Batches are
    consecutive pairs. A removed head's output is zero (mean and resample ablation are for encoders and
    decoders).

    Raises:
        BertologyError: a model that is not an encoder-decoder with its head.
    """

    loaded: LoadedModel
    data: SourceTargets
    score: Score = LOSS
    terms: Terms = TARGET_LOSS_TERMS
    nothing_scored = "The targets have no token to predict."
    token_mask = "decoder_attention_mask"

    def __post_init__(self) -> None:
        require_seq2seq_language_model(self.loaded)

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, batch_size: int, *, by_length: bool = False) -> Iterator[tuple[Inputs, np.ndarray]]:
        """Consecutive pairs: ``input_ids``, ``attention_mask`` (the sources), ``decoder_input_ids`` and
        ``decoder_attention_mask`` (the start token, then the target's tokens but the last), on the model's
        device, no key/value cache."""
        for first in range(0, len(self.data), batch_size):
            rows = np.arange(first, min(first + batch_size, len(self.data)))
            yield self.inputs_of(rows), rows

    def inputs_of(self, rows: np.ndarray) -> Inputs:
        """The model's inputs for pairs ``rows`` (as :meth:`batches` gives them)."""
        loaded, data = self.loaded, self.data
        pad = loaded.tokenizer.pad_token_id or 0
        start = loaded.model.config.decoder_start_token_id
        if start is None:
            raise BertologyError(f"'{loaded.name}' has no decoder start token in its config.")
        sources = _padded([data.sources[row] for row in rows], pad)
        decoder = _padded([data.labels[row] for row in rows], pad, first=int(start))
        names = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
        inputs = dict(zip(names, (tensor.to(loaded.device) for tensor in (*sources, *decoder)), strict=True))
        return {**inputs, "use_cache": False}  # type: ignore[dict-item]

    def _losses(
        self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        labels, _ = _padded([self.data.labels[row] for row in rows], 0)
        valid = inputs["decoder_attention_mask"].bool()
        return token_losses(logits, labels.to(logits.device), valid)

    def parts(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        sums, counts = self._losses(logits, inputs, rows)
        return torch.stack([sums, counts.double()], -1)

    def loss(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        sums, counts = self._losses(logits, inputs, rows)
        return (sums / counts.clamp_min(1)).sum()

    def replacement(
        self, ablation: str | HeadReplacement, *, seed: int = 0, batch_size: int = 8
    ) -> HeadReplacement:
        if not isinstance(ablation, str):
            return ablation
        if ablation != "zero":
            raise BertologyError(
                f"An encoder-decoder's heads are removed with zero ablation; {ablation!r} ablation is for "
                "encoders and decoders (give --ablation zero)."
            )
        return ZeroReplacement()
