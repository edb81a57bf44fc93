"""Attention, rollout and flow of one input as a model view: rows are layers, columns the methods."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bertology.analysis.relevance import (
    FLOW_MAX_TOKENS,
    RELEVANCE_METHODS,
    Relevance,
    RelevanceMethod,
    normalise_rows,
    relevance,
)
from bertology.attention.capturing import Attention
from bertology.files.outputs import write_text
from bertology.progress import Progress
from bertology.views import View
from bertology.views.build import Theme, view_data

HEADING = "Attention rollout and flow"
CAPTION = (
    "Rows: layers (0-based); columns: head-mean attention, attention rollout and attention flow "
    "(Abnar and Zuidema 2020) of each token at that layer's output over the input tokens. Flow values are "
    "maximum flows, not shares; each flow row is divided by its sum for display (the JSON keeps the values)."
)


@dataclass(repr=False)
class RelevanceView(View):
    """A model view whose "heads" are the methods, with the :class:`Relevance` it shows."""

    relevance: Relevance

    @property
    def heading(self) -> str:
        return HEADING

    def save_json(self, path: str | Path) -> Path:
        """Write the matrices as JSON (see :meth:`Relevance.to_json`, flow not normalised)."""
        return write_text(path, self.relevance.to_json())


def relevance_view(
    attention: Attention,
    methods: Sequence[RelevanceMethod] = RELEVANCE_METHODS,
    *,
    max_tokens: int = FLOW_MAX_TOKENS,
    on_progress: Progress | None = None,
    theme: Theme = "light",
) -> RelevanceView:
    """Compute ``methods`` for ``attention`` (see :func:`bertology.analysis.relevance.relevance`) and build
    a model view of ``attention: [layers, 1 + len(methods), n, n]`` with ``headNames`` ["attention",
    *methods]: head-mean attention, rollout, and flow with each row divided by its sum."""
    result = relevance(attention, methods, max_tokens=max_tokens, on_progress=on_progress)
    columns = {"attention": result.attention, **result.methods}
    shown = [normalise_rows(values) if name == "flow" else values for name, values in columns.items()]
    maps = replace(attention, probs=np.stack(shown, axis=1), queries=None, keys=None)
    data = view_data(maps, "model", theme=theme, head_names=list(columns))
    data["caption"] = CAPTION
    data["heading"] = HEADING
    return RelevanceView("model", data, result)
