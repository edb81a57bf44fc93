"""How much each head's attention changed between two moments of training.

For one head, probe example and query token ``q``, let ``p`` be the attention row before and ``r``
after. The change of the head is the mean, over every real query token of every probe example, of the
Jensen-Shannon divergence (natural log, so in nats, between 0 and ``ln 2``)::

    JS(p, r) = 1/2 sum_k p_k ln(p_k / m_k) + 1/2 sum_k r_k ln(r_k / m_k),   m = (p + r) / 2

This is the per-token divergence that :mod:`bertology.analysis.distances` uses between two heads (Clark
et al. 2019, Sec. 6), here between one head at two steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import xlogy


def js_divergence_rows(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """JS divergence in nats of each pair of rows: ``before`` and ``after`` [..., k] -> [...] float64."""
    p = np.asarray(before, dtype=np.float64)
    r = np.asarray(after, dtype=np.float64)
    m = (p + r) / 2
    terms = xlogy(p, p) + xlogy(r, r) - 2 * xlogy(m, m)
    return np.maximum(terms.sum(-1) / 2, 0.0)


def head_change(before: Sequence[np.ndarray], after: Sequence[np.ndarray]) -> np.ndarray:
    """[L, H] mean JS divergence per query token between ``before`` and ``after``.

    before, after: one ``[L, H, n, n]`` array per probe example (its own ``n``, no padding).
    """
    total, rows = 0.0, 0
    for first, second in zip(before, after, strict=True):
        total = total + js_divergence_rows(first, second).sum(-1)
        rows += first.shape[-2]
    return np.asarray(total / rows)
