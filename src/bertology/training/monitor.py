"""Watch attention change during training: every few steps, record a fixed probe set into a run archive.

:class:`AttentionMonitor` is called from any training loop (``monitor.step(model, step)`` after each
optimizer step, ``monitor.record(model, step)`` before training and at the end);
:class:`~bertology.training.callback.MonitorCallback` adapts it to Hugging Face's ``Trainer``. Each record
captures the probe examples' attention in eval mode (no dropout; the model's mode is restored, and no
random numbers are drawn, so training runs the same with or without the monitor) and the per-head
surface statistics of :mod:`bertology.stats.surface` over the probe set. The monitor's ``latest``
record (statistics and each head's change since the previous record) is what the training rules read
(:mod:`bertology.training.rules`). The training loss of each step, given with :meth:`AttentionMonitor.loss`,
goes into the archive's ``losses`` with the next record.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertology.attention.capturing import AttentionBatch, capture_batch
from bertology.corpus.readers.glue import Split
from bertology.errors import BertologyError, TruncationWarning
from bertology.models.loading import LoadedModel
from bertology.stats.rows import SpecialTokens
from bertology.stats.surface import SURFACE_STATISTICS, SurfaceAccumulator
from bertology.training.archive import ArchiveWriter, ProbeTokens
from bertology.training.compare import head_change
from bertology.training.rules.records import AttentionRecord


@dataclass(frozen=True)
class ProbeSet:
    """The fixed examples whose attention is recorded: texts, optional second texts and gold labels."""

    texts: list[str]
    texts_b: list[str] | None = None
    labels: list[str] | None = None

    def __post_init__(self) -> None:
        if not self.texts:
            raise BertologyError("The probe set is empty; give at least one example to watch.")

    @classmethod
    def sample(cls, split: Split, count: int, seed: int) -> ProbeSet:
        """``count`` examples of ``split`` drawn without replacement with ``seed``, in file order."""
        if count < 1:
            raise BertologyError(f"The probe set needs at least one example, not {count}.")
        chosen = np.sort(np.random.default_rng(seed).permutation(len(split.examples))[:count])
        examples = [split.examples[index] for index in chosen]
        texts_b = None if examples[0].text_b is None else [example.text_b or "" for example in examples]
        return cls([example.text for example in examples], texts_b, [example.label for example in examples])


def _statistics_of(batch: AttentionBatch, special: SpecialTokens) -> np.ndarray:
    """[S, L, H] float32: :data:`SURFACE_STATISTICS` over the batch, in that order (NaN where undefined)."""
    accumulator = SurfaceAccumulator(special)
    accumulator.update(batch)
    table = accumulator.result()
    return np.stack([table[name] for name in SURFACE_STATISTICS]).astype(np.float32)


class AttentionMonitor:
    """Records the probe set's attention and per-head statistics into the archive at ``path``.

    every: record after every ``every``-th optimizer step (:meth:`step`); :meth:`record` records now.
    max_length: token limit of each probe input (default: the model's).
    The archive is created at the first record (replacing one already at ``path``). ``latest``: the
    last record as the training rules read it (the change against the record before it is computed from
    the float32 probabilities, before they are stored as float16).
    """

    def __init__(self, path: str | Path, probe: ProbeSet, *, every: int, max_length: int | None = None):
        if every < 1:
            raise BertologyError(f"The monitor records every N steps with N >= 1, not {every}.")
        self.path = Path(path)
        self.probe = probe
        self.every = every
        self.max_length = max_length
        self.writer: ArchiveWriter | None = None
        self.last_step: int | None = None
        self.latest: AttentionRecord | None = None
        self._previous: list[np.ndarray] | None = None
        self._losses: list[float] = []  # index i: step i + 1

    def loss(self, step: int, value: float) -> None:
        """Keep the training loss (nats) of optimizer step ``step`` (1-based) for the archive's ``losses``
        (written with the next record; steps without a loss are NaN there)."""
        if step > len(self._losses):
            self._losses += [np.nan] * (step - len(self._losses))
        self._losses[step - 1] = float(value)

    def step(self, loaded: LoadedModel, step: int) -> bool:
        """Record if ``step`` is a multiple of ``every``; returns whether it recorded."""
        return step % self.every == 0 and self.record(loaded, step)

    def record(self, loaded: LoadedModel, step: int) -> bool:
        """Record the attention at ``step`` now, unless this step is already the last record."""
        if step == self.last_step:
            return False
        batch = self._capture(loaded)
        if self.writer is None:
            self.writer = self._create(loaded, batch)
        statistics = _statistics_of(batch, SpecialTokens.of(loaded))
        losses = np.array(self._losses[:step], dtype=np.float32)
        self.writer.append(step, batch.probs.half().cpu().numpy(), statistics, losses)
        probs = batch.probs.float().cpu().numpy()
        examples = [probs[i, ..., :n, :n] for i, n in enumerate(self.writer.lengths)]  # [L, H, n, n] each
        change = None if self._previous is None else head_change(self._previous, examples)
        self.latest = AttentionRecord(step, tuple(SURFACE_STATISTICS), statistics, change)
        self._previous = examples
        self.last_step = step
        return True

    def _capture(self, loaded: LoadedModel) -> AttentionBatch:
        model = loaded.model
        was_training = model.training
        model.eval()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)  # counted in the archive instead
                return capture_batch(
                    self.probe.texts, self.probe.texts_b, model=loaded, max_length=self.max_length
                )
        finally:
            model.train(was_training)

    def _create(self, loaded: LoadedModel, batch: AttentionBatch) -> ArchiveWriter:
        encoded = batch.encoded
        tokens = ProbeTokens(
            texts=list(self.probe.texts),
            texts_b=None if self.probe.texts_b is None else list(self.probe.texts_b),
            labels=None if self.probe.labels is None else list(self.probe.labels),
            tokens=[list(tokens) for tokens in encoded.tokens],
            segments=[segments.tolist() for segments in encoded.segment_ids],
            truncated=[int(cut) for cut in encoded.truncated],
        )
        return ArchiveWriter.create(
            self.path,
            model=loaded.name,
            layers=loaded.num_layers,
            heads=loaded.num_heads,
            probe=tokens,
            statistics=list(SURFACE_STATISTICS),
            every=self.every,
        )
