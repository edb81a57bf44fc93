"""Head interventions on a decoder, measured by its language-model loss on a corpus.

The loss is the mean next-token cross-entropy, in nats per predicted token:

    L = - (1 / N) sum_x sum_t log p(x_{t+1} | x_1 .. x_t)

over every position ``t`` of every sequence ``x`` whose next token is a real token (not padding), ``N``
such positions in all. A corpus file is read as :func:`bertology.corpus.segments.iter_segments` reads it for a
decoder (consecutive paragraphs packed into runs of at most ``max_length`` tokens, one running text each);
constructed sequences (repeated random tokens, say) are given as token ids.

- :class:`LanguageModelTask`: a decoder and its sequences as a :class:`~bertology.interventions.task.Task`,
  so the single-head sweep, Michel et al.'s importance (``I_h = E_x |∂L(x)/∂ξ_h|`` with ``L(x)`` the mean
  next-token cross-entropy of sequence ``x``) and the pruning curves of a classifier measure ``L`` too.
- :func:`language_model_loss`: ``L`` with any head gates.

With grouped-query attention each query head has its own gate (its output, before the output projection);
the key/value head it shares is untouched until all of its query heads are removed, which then computes
what removing the key/value head computes (:mod:`bertology.models.surgery` removes its weights only then).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from bertology.corpus.segments import iter_segments
from bertology.errors import BertologyError
from bertology.interventions.replacement import HeadReplacement, head_replacement
from bertology.interventions.task import LOSS, Inputs, Score, Task, Terms
from bertology.models.devices import float64_home
from bertology.models.heads import HeadSelection
from bertology.models.loading import LoadedModel


@dataclass(frozen=True)
class TokenSequences:
    """Token id sequences a decoder reads, each as its tokenizer builds it (special tokens included).

    ids: per sequence, [tokens] int64. origins: where each came from (``"file:first-last"`` lines of a
    corpus, or a description).
    """

    ids: list[np.ndarray]
    origins: list[str]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def predicted_tokens(self) -> int:
        """Positions whose next token is predicted: ``sum(len(x) - 1)``."""
        return sum(max(len(ids) - 1, 0) for ids in self.ids)

    def part(self, start: int, stop: int) -> TokenSequences:
        """Sequences ``start .. stop - 1``."""
        return TokenSequences(self.ids[start:stop], self.origins[start:stop])

    @classmethod
    def of_texts(
        cls, loaded: LoadedModel, texts: Sequence[str], *, max_length: int | None = None
    ) -> TokenSequences:
        """``texts`` tokenized by ``loaded``'s tokenizer, each cut to ``max_length`` tokens (default: the
        model's limit)."""
        limit = loaded.max_length if max_length is None else min(max_length, loaded.max_length)
        encoded = loaded.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]
        return cls(
            [np.asarray(ids, dtype=np.int64) for ids in encoded], [f"text {i}" for i in range(len(texts))]
        )

    @classmethod
    def of_ids(cls, ids: np.ndarray | Sequence[Sequence[int]], origin: str = "sequence") -> TokenSequences:
        """Constructed sequences ``ids`` ([sequences, tokens] or a list of lists), taken as they are."""
        rows = [np.asarray(row, dtype=np.int64) for row in ids]
        return cls(rows, [f"{origin} {index}" for index in range(len(rows))])

    @classmethod
    def of_corpus(
        cls,
        loaded: LoadedModel,
        path: str | Path,
        *,
        max_length: int = 128,
        max_segments: int | None = None,
    ) -> TokenSequences:
        """The first ``max_segments`` (``None``: all) segments of the corpus file at ``path``, read as
        :func:`~bertology.corpus.segments.iter_segments` reads it for a decoder, tokenized and cut to
        ``max_length``.

        Raises:
            BertologyError: a missing or unreadable corpus, or one without text.
        """
        segments = list(
            islice(iter_segments(path, loaded.tokenizer, max_length=max_length, pairs=False), max_segments)
        )
        texts = [" ".join(s.text_a) if isinstance(s.text_a, list) else s.text_a for s in segments]
        sequences = cls.of_texts(loaded, texts, max_length=max_length)
        return cls(sequences.ids, [segment.origin for segment in segments])


def require_language_model(loaded: LoadedModel) -> None:
    """Refuse a model without a language-modelling head (load decoders with ``language_model=True``).

    Raises:
        BertologyError: an encoder, or a decoder loaded without its head.
    """
    if loaded.kind != "decoder" or loaded.model.get_output_embeddings() is None:
        raise BertologyError(
            f"The language-model loss needs a decoder with its language-modelling head; load '{loaded.name}' "
            "with load_model(..., language_model=True) (a decoder model such as Llama, Qwen or Gemma)."
        )


def token_batches(
    loaded: LoadedModel, data: TokenSequences, *, batch_size: int = 8
) -> Iterator[tuple[dict[str, torch.Tensor], np.ndarray]]:
    """``data`` in batches of ``batch_size`` consecutive sequences: the model's inputs (``input_ids`` and
    ``attention_mask`` [batch, tokens], right-padded, on its device; no key/value cache) and the rows."""
    pad = loaded.tokenizer.pad_token_id or 0
    for start in range(0, len(data), batch_size):
        rows = np.arange(start, min(start + batch_size, len(data)))
        width = max(len(data.ids[row]) for row in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for index, row in enumerate(rows):
            sequence = torch.as_tensor(data.ids[row])
            ids[index, : len(sequence)] = sequence
            mask[index, : len(sequence)] = 1
        inputs = {"input_ids": ids.to(loaded.device), "attention_mask": mask.to(loaded.device)}
        yield {**inputs, "use_cache": False}, rows  # type: ignore[dict-item]


def next_token_losses(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, the sum of the next-token cross-entropies ``-log p(x_{t+1} | x_1 .. x_t)`` (nats,
    float64) and the number of positions summed: ``logits`` [batch, tokens, vocabulary] at position ``t``
    predict ``input_ids[:, t + 1]``, where both tokens are real (``attention_mask`` 1); see
    :func:`token_losses`."""
    valid = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
    return token_losses(logits[:, :-1], input_ids[:, 1:], valid, chunk=chunk)


def token_losses(
    logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, *, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence, the sum of the cross-entropies ``-log p(targets[t])`` of ``logits`` [batch, positions,
    vocabulary] at the positions where ``valid`` [batch, positions] holds (nats, float64), and the number of
    positions summed.

    Only those positions are scored, as rows of a [positions, vocabulary] matrix taken ``chunk`` rows at a
    time into float64 for the log-softmax (a float32 log-sum-exp over a 49k vocabulary is off by about 1e-4
    nats), on the CPU for MPS (:func:`~bertology.models.devices.float64_home`). Differentiable. Returns
    ([batch], [batch]) on the float64 device.
    """
    home = float64_home(logits.device)
    batch, position = valid.nonzero(as_tuple=True)
    wanted_ids = targets[batch, position].to(home)
    scored = logits[batch, position].to(home)
    losses = torch.cat(
        [
            -torch.log_softmax(rows.double(), -1).gather(1, wanted[:, None])[:, 0]
            for rows, wanted in zip(scored.split(chunk), wanted_ids.split(chunk), strict=True)
        ]
        or [scored.new_zeros(0, dtype=torch.float64)]
    )
    sums = torch.zeros(len(valid), dtype=torch.float64, device=home).index_add(0, batch.to(home), losses)
    return sums, valid.sum(1).to(home)


#: A decoder's study on a corpus (``bertology ablate --lm-corpus``).
LANGUAGE_MODEL_TERMS = Terms(
    source="corpus",
    examples="sequences",
    counted="predicted tokens",
    baseline="loss (nats per token)",
    sentence="Language-model loss with every head: {score:.4f} nats per token (the mean next-token "
    "cross-entropy over {count} predicted tokens of {examples} corpus segments).",
    headline="Language-model loss {score:.4f} nats per token on {count} tokens of {examples} segments",
    head="query head",
    averaged="corpus segments x",
    loss="the segment's mean next-token cross-entropy",
    axis="next-token cross-entropy (nats)",
    sign=": positive where the head helped",
    pruned_as="language_model",
    title=" (language-model loss)",
)


@dataclass(frozen=True)
class LanguageModelTask(Task):
    """The decoder ``loaded`` (with its language-modelling head) scored by its mean next-token cross-entropy
    ``L`` on the sequences ``data``: per sequence ``s(x)`` the summed cross-entropy, ``w(x)`` the tokens
    predicted; its loss for the importance is the sequence's mean. Batches are consecutive sequences.

    Raises:
        BertologyError: a model without a language-modelling head.
    """

    loaded: LoadedModel
    data: TokenSequences
    score: Score = LOSS
    terms: Terms = LANGUAGE_MODEL_TERMS
    nothing_scored = "The sequences have no next token to predict (each needs 2 tokens or more)."
    token_mask = "attention_mask"

    def __post_init__(self) -> None:
        require_language_model(self.loaded)

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, batch_size: int, *, by_length: bool = False) -> Iterator[tuple[Inputs, np.ndarray]]:
        return token_batches(self.loaded, self.data, batch_size=batch_size)

    def parts(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        sums, counts = next_token_losses(logits, inputs["input_ids"], inputs["attention_mask"])
        return torch.stack([sums, counts.double()], -1)

    def loss(self, logits: torch.Tensor, inputs: Inputs, rows: np.ndarray) -> torch.Tensor:
        sums, counts = next_token_losses(logits, inputs["input_ids"], inputs["attention_mask"])
        return (sums / counts.clamp_min(1)).sum()

    def replacement(
        self, ablation: str | HeadReplacement, *, seed: int = 0, batch_size: int = 8
    ) -> HeadReplacement:
        loaded, data = self.loaded, self.data

        def reference(rows: np.ndarray | None, size: int) -> Iterator[tuple[Inputs, np.ndarray]]:
            if rows is None:
                return token_batches(loaded, data, batch_size=size)
            chosen = TokenSequences([data.ids[row] for row in rows], [data.origins[row] for row in rows])
            return ((inputs, rows[found]) for inputs, found in token_batches(loaded, chosen, batch_size=size))

        return head_replacement(
            loaded,
            ablation,
            batches=reference,
            lengths=lambda: [len(ids) for ids in data.ids],
            seed=seed,
            batch_size=batch_size,
        )


def language_model_loss(
    loaded: LoadedModel,
    data: TokenSequences,
    *,
    gates: torch.Tensor | HeadSelection | None = None,
    replacement: HeadReplacement | None = None,
    batch_size: int = 8,
) -> float:
    """The mean next-token cross-entropy ``L`` (nats per token) of ``loaded`` on ``data``, with head
    ``gates`` if given (see :func:`~bertology.interventions.gates.head_gates`), gated heads taking
    ``replacement`` (from :meth:`LanguageModelTask.replacement` on ``data``; ``None``: zero).

    Raises:
        BertologyError: a model without a language-modelling head, or no token to predict.
    """
    task = LanguageModelTask(loaded, data)
    return task.evaluate(gates=gates, replacement=replacement, batch_size=batch_size)
