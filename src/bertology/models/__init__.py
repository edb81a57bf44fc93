"""The model and its internals: loading (:mod:`~bertology.models.loading`, ``load_model``), the table of
model types, the packaged offline models, devices and precision, where the layers and projections are
(:mod:`~bertology.models.anatomy`), the attention call every layer is routed through
(:mod:`~bertology.models.hook`, :mod:`~bertology.models.module_capture`), head names, head removal
(:mod:`~bertology.models.surgery`) and running a classifier over examples.

May import :mod:`bertology.corpus` and the leaf helpers; nothing that captures or computes over attention.
"""
