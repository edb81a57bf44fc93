"""Corpus analyses built on the streaming statistics: the corpus runs (:mod:`~bertology.analysis.analyze`,
:mod:`~bertology.analysis.comparison` of two models, their :mod:`~bertology.analysis.settings`), head
pattern labels, head distances and MDS, attention rollout and flow, head detectors; and the heads'
composition scores from the weights alone.

May import the captured attention (:mod:`bertology.attention`), the statistics (:mod:`bertology.stats`)
and what lies below them; independent of :mod:`bertology.probes` and :mod:`bertology.interventions`
(neither imports the other), and imported by the clusters, renderers and front ends.
"""

from bertology.analysis.composition import CompositionScores, composition_scores
from bertology.analysis.distances import DistanceAccumulator, HeadDistances, js_divergence_sums, mds_embedding
from bertology.analysis.patterns import (
    FOCUSED_PATTERNS,
    PATTERN_DESCRIPTIONS,
    PATTERNS,
    HeadPatterns,
    PatternAccumulator,
    PatternThresholds,
    label_heads,
)

__all__ = [
    "FOCUSED_PATTERNS",
    "PATTERNS",
    "PATTERN_DESCRIPTIONS",
    "CompositionScores",
    "DistanceAccumulator",
    "HeadDistances",
    "HeadPatterns",
    "PatternAccumulator",
    "PatternThresholds",
    "composition_scores",
    "js_divergence_sums",
    "label_heads",
    "mds_embedding",
]
