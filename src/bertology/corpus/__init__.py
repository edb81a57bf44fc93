"""Inputs: corpus and treebank files read as records (:mod:`~bertology.corpus.readers`), cut into
model-ready segments (:mod:`~bertology.corpus.segments`), encoded with their token-to-word alignment
(:mod:`~bertology.corpus.encoding`) and batched by length (:mod:`~bertology.corpus.batching`); read in
this process or spread over reader processes (:mod:`~bertology.corpus.reader_processes`), and kept encoded
on disk for later runs (:mod:`~bertology.corpus.cache`).

The bottom of the one-way flow: it imports only the leaf helpers (``bertology.errors``, ``options``),
never a model, a capture or anything above.
"""
