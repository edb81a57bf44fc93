"""Reading back what a view page shows (its weight boxes, its neuron view) through the page's API, for the
browser tests that compare it with the captured attention."""

from __future__ import annotations

import numpy as np

from bertology.attention.capturing import Attention
from support.browser import ViewPage

#: Attention codes are round(p * 255): the page's weights are within half a step of the captured ones.
CODE_TOLERANCE = 0.5 / 255 + 1e-6
#: The neuron view recomputes the softmax from float16 queries and keys.
NEURON_TOLERANCE = 2e-3


# Every weight box of every token, layer by layer: [layers][focus token][other token][head position].
BOXES_JS = """({side, count, layers}) => {
  const api = window.bertology;
  const out = [];
  for (let layer = 0; layer < layers; layer++) {
    api.setLayer(layer);
    const rows = [];
    for (let index = 0; index < count; index++) {
      api.focusToken(side, index);
      rows.push(api.weightBoxes().rows);
    }
    out.push(rows);
  }
  api.focusToken(null);
  return out;
}"""

# The neuron view's softmax (and norm-based weights) for every layer, head and query.
NEURON_JS = """({layers, heads, n}) => {
  const api = window.bertology;
  const out = {probs: [], normWeights: [], masked: []};
  for (let layer = 0; layer < layers; layer++) {
    api.setLayer(layer);
    for (let head = 0; head < heads; head++) {
      api.setHead(head);
      for (let query = 0; query < n; query++) {
        api.setQuery(query);
        const shown = api.neuron();
        out.probs.push(shown.probs);
        out.masked.push(shown.masked);
        if (shown.normWeights) out.normWeights.push(shown.normWeights);
      }
    }
  }
  return out;
}"""


def assert_head_view_shows(view: ViewPage, probs: np.ndarray) -> None:
    """The head view's weight boxes, from every query token and into every key token, equal ``probs``
    ``[layers, heads, n, m]``."""
    layers, heads, n, m = probs.shape
    assert view.js("window.bertology.state().heads") == list(range(heads))
    from_queries = np.array(view.js(BOXES_JS, {"side": "left", "count": n, "layers": layers}))
    assert from_queries.shape == (layers, n, m, heads)
    np.testing.assert_allclose(from_queries, probs.transpose(0, 2, 3, 1), atol=CODE_TOLERANCE)
    into_keys = np.array(view.js(BOXES_JS, {"side": "right", "count": m, "layers": layers}))
    assert into_keys.shape == (layers, m, n, heads)
    np.testing.assert_allclose(into_keys, probs.transpose(0, 3, 2, 1), atol=CODE_TOLERANCE)


def neuron_shown(view: ViewPage, attention: Attention) -> dict[str, np.ndarray]:
    """The neuron view's softmax (and norm-based weights, when shown) of every layer, head and query,
    each ``[layers, heads, n, keys]``."""
    layers, heads, n, _ = attention.probs.shape
    shown = view.js(NEURON_JS, {"layers": layers, "heads": heads, "n": n})
    return {key: np.array(value).reshape(layers, heads, n, -1) for key, value in shown.items() if value}
