"""Corpus search: every token's contextual vector in a similarity index (:mod:`~bertology.index.token_index`)
and the index folder on disk, switched whole by one manifest (:mod:`~bertology.index.store`).

May import :mod:`bertology.models`, :mod:`bertology.corpus`, :mod:`bertology.files` and the leaf helpers;
the server's search and the command line use it.
"""
