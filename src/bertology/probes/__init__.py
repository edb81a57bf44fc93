"""Linguistic probes over word-level attention: which heads track dependency relations, parse, and find
antecedents.

May import the captured attention (:mod:`bertology.attention`), the statistics and what lies below them;
independent of :mod:`bertology.analysis` and :mod:`bertology.interventions`.

One verb per probe (:mod:`bertology.probes.run`; files in, a :class:`~bertology.probes.base.ProbeResult`
out): :func:`probe_dependencies` (Clark et al. 2019's per-relation head accuracies), :func:`probe_parser`
(their attention-only parser), :func:`probe_coreference` (antecedent selection) and :func:`probe_gap`
(GAP's scorecard). Every result has the layer x head grid of its scores, ``best()``, tables, a summary and
``save(folder)``; :func:`bertology.report.probes.write_probe_report` writes its HTML report. Below the
verbs: ``data.iter_word_attention`` streams treebank sentences through a model as word attention and
``dependency.DependencyAccumulator`` scores every head against the gold trees.

The names below are imported on first use (the verbs load torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bertology.lazy_exports import export_lazily

if TYPE_CHECKING:
    from bertology.probes.base import BestHead, ProbeResult
    from bertology.probes.data import SkippedSentences, WordAttentionStream, iter_word_attention
    from bertology.probes.dependency import (
        DIRECTIONS,
        OFFSETS,
        Baseline,
        DependencyAccumulator,
        DependencyProbe,
        predicted_heads,
    )
    from bertology.probes.results import CoreferenceResult, DependencyResult, GapResult, ParserResult
    from bertology.probes.run import probe_coreference, probe_dependencies, probe_gap, probe_parser

_HOMES = {
    "SkippedSentences": "data",
    "WordAttentionStream": "data",
    "iter_word_attention": "data",
    "DIRECTIONS": "dependency",
    "OFFSETS": "dependency",
    "Baseline": "dependency",
    "DependencyAccumulator": "dependency",
    "DependencyProbe": "dependency",
    "predicted_heads": "dependency",
    "BestHead": "base",
    "ProbeResult": "base",
    "CoreferenceResult": "results",
    "DependencyResult": "results",
    "GapResult": "results",
    "ParserResult": "results",
    "probe_coreference": "run",
    "probe_dependencies": "run",
    "probe_gap": "run",
    "probe_parser": "run",
}

__all__ = [
    "DIRECTIONS",
    "OFFSETS",
    "Baseline",
    "BestHead",
    "CoreferenceResult",
    "DependencyAccumulator",
    "DependencyProbe",
    "DependencyResult",
    "GapResult",
    "ParserResult",
    "ProbeResult",
    "SkippedSentences",
    "WordAttentionStream",
    "iter_word_attention",
    "predicted_heads",
    "probe_coreference",
    "probe_dependencies",
    "probe_gap",
    "probe_parser",
]

export_lazily(__name__, _HOMES)
