"""Inputs: corpus and treebank files read as records (:mod:`~bertology.corpus.readers`), cut into
model-ready segments (:mod:`~bertology.corpus.segments`), encoded with their token-to-word alignment
(:mod:`~bertology.corpus.encoding`) and batched by length (:mod:`~bertology.corpus.batching`).

The bottom of the one-way flow: it imports only the leaf helpers (``bertology.errors``, ``options``),
never a model, a capture or anything above.
"""
