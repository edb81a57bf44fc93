"""Captured attention: texts and pairs (:mod:`~bertology.attention.capturing`: ``capture``, ``Attention``,
``AttentionBatch``), long inputs by queries and keys (:mod:`~bertology.attention.long_capture`),
encoder-decoders (:mod:`~bertology.attention.seq2seq`), norm-based weights
(:mod:`~bertology.attention.norms`) and word-level attention (:mod:`~bertology.attention.words`).

May import :mod:`bertology.models`, :mod:`bertology.corpus` and the leaf helpers; the computations over
attention (stats, analysis, probes, interventions) and the renderers import it, never the other way.
"""
