"""Rules on the attention monitor's records: failure modes of attention that no optimisation rule sees.

- Entropy collapse (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy
  Collapse", ICML): attention entropy falling towards 0, which precedes divergence; per head and per
  layer (the paper tracks each layer's mean).
- Heads becoming no-ops: attention mass on [CLS] and [SEP] high and rising (Clark et al. 2019 read
  such attention as a head's "no-op").
- Heads frozen: a head's attention no longer changes between records.

The quantities are the monitor's: ``entropy`` (nats), ``cls`` and ``sep`` (attention mass), the mean over
the probe set's real query tokens (:mod:`bertology.stats.surface`), and the change between records (mean
Jensen-Shannon divergence, :mod:`bertology.training.compare`). Statistics that are undefined (NaN: a
model without [CLS] / [SEP]) never fire. SageMaker Debugger has no rule on attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from bertology.training.rules.records import Finding, History


def _head(layer: int, head: int) -> str:
    return f"layer {layer} head {head}"


@dataclass(frozen=True)
class EntropyCollapse:
    """Fires for a head whose mean attention entropy was above ``floor`` nats at the first record and is
    now at most ``ratio`` times that first value and at most ``ceiling`` nats, and for a layer whose mean
    over its heads does (the same three conditions on the layer's mean). A head that was already sharp
    at the first record (e.g. attending to the previous token: about 0 nats before training) has nothing
    to collapse from, so it never fires."""

    name: ClassVar[str] = "entropy_collapse"
    ratio: float = 0.25
    ceiling: float = 0.2
    floor: float = 0.5

    def _collapsed(self, first: np.ndarray, now: np.ndarray) -> np.ndarray:
        return (first > self.floor) & (now <= self.ratio * first) & (now <= self.ceiling)

    def check(self, history: History) -> list[Finding]:
        if len(history.attention) < 2:
            return []
        first, now = history.attention[0].statistic("entropy"), history.attention[-1].statistic("entropy")
        if first is None or now is None:
            return []
        found = []
        for layer, head in zip(*np.nonzero(self._collapsed(first, now)), strict=True):
            layer, head = int(layer), int(head)
            was, value = first[layer, head], now[layer, head]
            found.append(
                Finding(_head(layer, head), f"{_head(layer, head)}: entropy {value:.3f} nats, from {was:.3f}",
                        head=(layer, head))
            )  # fmt: skip
        first_mean, now_mean = first.mean(-1), now.mean(-1)
        for layer in np.nonzero(self._collapsed(first_mean, now_mean))[0]:
            layer = int(layer)
            found.append(
                Finding(f"layer {layer}", f"layer {layer}: mean entropy {now_mean[layer]:.3f} nats, from "
                        f"{first_mean[layer]:.3f}", layer=layer)
            )  # fmt: skip
        return found


@dataclass(frozen=True)
class NoOpHeads:
    """Fires for a head whose attention mass on [CLS] and [SEP] (``cls + sep``, the mean over the probe
    set's query tokens) is at least ``threshold`` and has risen by at least ``min_rise`` since the first
    record: a head that gave at least 40 % of its attention to other tokens and now gives at most 10 %.

    ``min_rise`` 0.3 comes from measured runs (benchmarks/RESULTS.md): in healthy SST-2 runs of the
    default model no head's mass rose by more than 0.16 in 300 steps (layer 4 head 3: 0.455 to 0.612),
    and issue 33's healthy run took layer 4 head 5 from 0.79 to 0.91, which a rise of 0.1 flagged."""

    name: ClassVar[str] = "no_op_heads"
    threshold: float = 0.9
    min_rise: float = 0.3

    def check(self, history: History) -> list[Finding]:
        if len(history.attention) < 2:
            return []
        first, now = history.attention[0], history.attention[-1]
        parts = [record.statistic(name) for record in (first, now) for name in ("cls", "sep")]
        if any(part is None for part in parts):
            return []
        before, after = parts[0] + parts[1], parts[2] + parts[3]  # type: ignore[operator]
        hits = (after >= self.threshold) & (after - before >= self.min_rise)
        return [
            Finding(
                _head(int(layer), int(head)),
                f"{_head(int(layer), int(head))}: {after[layer, head]:.0%} of attention on [CLS]/[SEP], "
                f"from {before[layer, head]:.0%}",
                head=(int(layer), int(head)),
            )
            for layer, head in zip(*np.nonzero(hits), strict=True)
        ]


@dataclass(frozen=True)
class FrozenHeads:
    """Fires for a head whose attention changed by at most ``max_change`` nats (mean JS divergence per
    query token) between each of the last ``records`` pairs of consecutive records."""

    name: ClassVar[str] = "frozen_heads"
    records: int = 2
    max_change: float = 1e-9

    def check(self, history: History) -> list[Finding]:
        changes = [record.change for record in history.attention[1:] if record.change is not None]
        if len(changes) < self.records:
            return []
        recent = np.stack(changes[-self.records :])  # [records, L, H]
        first = history.attention[-self.records - 1].step
        hits = (recent <= self.max_change).all(0)
        return [
            Finding(
                _head(int(layer), int(head)),
                f"{_head(int(layer), int(head))}: attention unchanged since step {first}",
                head=(int(layer), int(head)),
            )
            for layer, head in zip(*np.nonzero(hits), strict=True)
        ]
