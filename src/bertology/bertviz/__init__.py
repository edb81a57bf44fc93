"""BertViz's import paths over bertology's views: replace ``bertviz`` by ``bertology.bertviz`` in the
imports and the calls stay.

May import the views and what lies below them; nothing in the library imports it.

``from bertology.bertviz import head_view, model_view`` (the same functions as ``bertology.head_view``
and ``bertology.model_view``) and ``from bertology.bertviz.neuron_view import show``
(:func:`bertology.bertviz.neuron_view.show`).
"""

from __future__ import annotations

from bertology.views import head_view, model_view

__all__ = ["head_view", "model_view"]
