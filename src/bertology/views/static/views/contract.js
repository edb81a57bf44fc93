// contract.js: The page's contract (its stable hooks and window.bertology, in the comment below), the
// constants every module shares, and the page API object `api`. Opens the one function scope that all the
// modules share once joined (boot.js closes it).
// Uses no other module's names.
/*
 * bertology views: the head, model and neuron view of a transformer's attention, drawn in the browser.
 *
 * The page carries its data once, as JSON in the element #bertology-data (type application/json)
 * (encoding: bertology/views/payload.py). No libraries, no network, and token text is only ever
 * inserted with textContent / createTextNode, never parsed as markup.
 *
 * Stable hooks (tests, benchmarks, styling):
 *   html[data-theme]                  "light" | "dark"
 *   #bertology-root[data-view]        "head" | "model" | "neuron"
 *   body[data-ready]                  "1" once the first picture is drawn ("error" if the data is unusable);
 *                                     nothing waits for an animation frame, which a frame out of view never gets
 *   message to window.parent          {bertologyHeight: px} when the page is in a frame: its content height
 *                                     {bertologyBlock: {layer, rows: [a, b], keys: [a, b]}}: a long head
 *                                     view's window moved; the web app answers {bertologyBlockAnswer:
 *                                     {layer, rows, keys, attention: [heads][rows][keys] probabilities}}
 *                                     (POST /api/attention), drawn in place of the top-k weights
 *   #bt-attention <select>            attention set (pages with attentionSets: encoder-decoder models)
 *   #bt-layer  <select>               layer (head and neuron view)
 *   #bt-head   <select>               head (neuron view)
 *   #bt-query  <select>               query token (neuron view)
 *   #bt-filter <select>               all | AA | AB | BA | BB: segments of query -> key (pairs only; head view:
 *                                     lines, model view: the thumbnails' block and the enlarged head's lines,
 *                                     neuron view: the query tokens offered and the key rows drawn)
 *   #bt-faint <input type=checkbox>   head view: faint lines (see setFaintLines)
 *   #bt-heads                         head selector; .bt-swatch[data-head][aria-pressed] buttons
 *   .bt-col-label                     model view column headers (head numbers, or data.headNames)
 *   #bt-canvas                        main canvas (head view lines, neuron view vectors)
 *   .bt-token[data-index][data-side]  token labels, data-side "left" (attending / query) or "right"
 *                                     (attended-to / key); .bt-active = shown, .bt-pinned = clicked
 *   #bt-grid, .bt-thumb[data-layer][data-head]   model view grid of heatmap canvases
 *   #bt-detail, #bt-detail-canvas, #bt-detail-close   model view: enlarged head (inside .bt-overlay)
 *   #bt-theme, #bt-export-png, #bt-export-svg (head view)   buttons
 *   #bt-status                        error / status line
 *
 * Optional view data (head and model view): headNames [heads] labels shown instead of head numbers;
 * layerNames [layers] labels shown instead of layer numbers (a page of some layers only); selectedHeads:
 * the heads the head view shows at first (default: all);
 * keyTokens (and keySegments): the key tokens when they differ from the query tokens (cross-attention,
 * attention [layers, heads, n, keyTokens.length], right column / thumbnail columns); causal: true draws
 * later keys as not attendable (hatched thumbnails) and says "causal"; attentionSets: see below;
 * weights: "norm" says the values are norm-based weights (bertology.norms), not softmax output;
 * caption: a sentence shown under the toolbar (#bt-caption), e.g. how the values were normalised;
 * heading: the page's title in the toolbar instead of the view's name (e.g. "Attention rollout and flow").
 *   watch page (#bertology-root[data-view="watch"]): #bt-step <input type=range> (record index),
 *   #bt-step-label, #bt-example <select>, #bt-mode <select> (head | model), #bt-example-text,
 *   #bt-report (facts, figures, tables); the head or model view of the chosen example below the bar
 *
 * window.bertology:
 *   ready, view, error, firstPaintMs (since script start), lastDrawMs (last canvas draw)
 *   state()                           the current selection as a plain object
 *   setLayer(l), setHead(h), setQuery(i), setHeads([h, ...]), setFilter(f) (head, model and neuron view of a pair),
 *   setFaintLines(on) (head view: every line at an opacity of at least 0.1; data.faintLines starts with it on),
 *   focusToken(side, index) / focusToken(null)      pin a token ("left" | "right") or clear the pin
 *   weightBoxes()                     head view and enlarged head: what the weight boxes beside the other
 *                                     side's tokens show for the hovered or pinned token, null if none:
 *                                     {side, index, heads, rows: [token][head position] weight or null}
 *   openDetail(layer, head), closeDetail()          model view
 *   neuron()                          neuron view: {layer, head, query, dots, probs, masked, shownKeys (the key rows
 *                                     the segment filter keeps), vectorScale, productScale[, norms, normWeights]}
 *   setTheme("light" | "dark"), toggleTheme()
 *   pngDataUrl(), exportPng()         the current picture as a PNG data URL / as a download
 *   svgText(), exportSvg()            head view (and model view detail) as SVG text / download
 *   setAttentionSet(name)             pages with attentionSets; state().attentionSet is the shown one
 *   watch page: view is "watch"; state().watch = {step, stepIndex, steps, example, mode};
 *   setStep(index), setExample(index), setMode("head" | "model"), showAlert(index) (a training rule's
 *   alert, #bt-alerts .bt-alert[data-rule][data-step]: its step, and the heads it names); the rest act on the shown view
 */
(() => {
  "use strict";

  const ROW = 18; // px per token row; mirrors --bt-row in views.css
  const LEVELS = 16; // attention lines are bucketed into this many opacity levels
  const LINE_AREA = 360; // px between the two token columns
  const MAX_CANVAS_PX = 30000; // stay below the browsers' canvas size limits
  const LABEL_MAX = 240; // widest token label in exported pictures (px)
  const HEADER = 26; // px of the sticky header row above the token columns; mirrors --bt-head-h
  const LINE_BUDGET = 12000; // most attention lines stroked per screen draw (faintest dropped first)
  const EXPORT_LINE_BUDGET = 40000; // the same for PNG / SVG export of the whole picture
  const GRID_LABEL = 56; // px of the model view's layer-label column
  const HEAT_GAMMA = 0.75; // thumbnail intensity = weight^HEAT_GAMMA
  const THICK_LINES = 2500; // up to this many lines are drawn 1.5 px wide, more as 1-device-pixel hairlines
  const SVG_NS = "http://www.w3.org/2000/svg";
  const MINIMAP_PX = 256; // px a side of a long input's minimap

  // A tab20-like palette, dark hues first so that the first ten heads differ most. The dark theme
  // lightens every hue by DARK_THEME_LIGHTEN (towards white), so that the darker ones (grey, brown,
  // blue) stand out from its near-black background.
  const HEAD_COLOURS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
    "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
  ];
  const DARK_THEME_LIGHTEN = 0.3;
  const MIN_LINE_ALPHA = 0.1; // faint lines (data.faintLines, the "Faint lines" box): the faintest line's opacity

  const SEGMENT_FILTERS = {
    all: { label: "All", query: null, key: null },
    AA: { label: "A → A", query: 0, key: 0 },
    AB: { label: "A → B", query: 0, key: 1 },
    BA: { label: "B → A", query: 1, key: 0 },
    BB: { label: "B → B", query: 1, key: 1 },
  };

  const api = (window.bertology = { ready: false, view: null, error: null, firstPaintMs: null, lastDrawMs: null });
  const scriptStart = performance.now();
