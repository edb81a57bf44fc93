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

  // ---------------------------------------------------------------------------------------------
  // Small utilities
  // ---------------------------------------------------------------------------------------------

  const clamp = (value, low, high) => Math.min(high, Math.max(low, value));
  const range = (count) => Array.from({ length: count }, (_, i) => i);
  const headColour = (head) => headPalette()[head % HEAD_COLOURS.length];
  /** A head's label: its name from data.headNames, else its 0-based number. */
  const headLabel = (data, head) => (data.headNames ? data.headNames[head] : String(head));
  /** A layer's label: its name from data.layerNames, else its 0-based number. */
  const layerLabel = (data, layer) => (data.layerNames ? data.layerNames[layer] : String(layer));
  /** "head 3", or the head's name alone when the heads are named. */
  const headCaption = (data, head) => (data.headNames ? data.headNames[head] : `head ${head}`);
  const sameToken = (a, b) => (a === b) || (a !== null && b !== null && a.side === b.side && a.index === b.index);

  /** Create an element. `text` becomes textContent; strings among children become text nodes. */
  function el(tag, props = {}, children = []) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "style") for (const [name, v] of Object.entries(value)) node.style.setProperty(name, v);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  /** Token text made printable: control characters become visible symbols, "" becomes ∅. */
  function displayToken(text) {
    if (text === "") return "\u2205";
    return String(text).replace(/[\u0000-\u001f\u007f]/g, (c) => {
      if (c === "\n") return "\u21b5";
      if (c === "\t") return "\u2192";
      return c === "\u007f" ? "\u2421" : String.fromCharCode(0x2400 + c.charCodeAt(0));
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Decoding: base64 -> zlib inflate -> typed arrays (uint8 codes, float16 bits)
  // ---------------------------------------------------------------------------------------------

  function base64ToBytes(text) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text);
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  /** IEEE 754 half -> number. */
  function halfToFloat(bits) {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const fraction = bits & 0x3ff;
    if (exponent === 0) return sign * fraction * 2 ** -24;
    if (exponent === 31) return fraction ? NaN : sign * Infinity;
    return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
  }

  let halfTable = null;
  function halfLookup() {
    if (!halfTable) {
      halfTable = new Float32Array(65536);
      for (let bits = 0; bits < 65536; bits++) halfTable[bits] = halfToFloat(bits);
    }
    return halfTable;
  }

  function littleEndianHalves(buffer) {
    if (new Uint8Array(new Uint16Array([1]).buffer)[0] === 1) return new Uint16Array(buffer);
    const view = new DataView(buffer);
    const out = new Uint16Array(buffer.byteLength / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getUint16(2 * i, true);
    return out;
  }

  /** Decode one packed array: {shape, values: Uint8Array} (uint8) or {shape, halves: Uint16Array}. */
  async function decodeArray(packed, name) {
    if (packed.codec !== "deflate-base64") throw new Error(`${name}: unknown codec ${packed.codec}`);
    const buffer = await inflate(base64ToBytes(packed.data));
    const count = packed.shape.reduce((a, b) => a * b, 1);
    const width = { uint8: 1, float16: 2, uint16: 2 }[packed.dtype];
    if (!width) throw new Error(`${name}: unknown dtype ${packed.dtype}`);
    if (buffer.byteLength !== count * width) {
      throw new Error(`${name}: ${buffer.byteLength} bytes do not match shape [${packed.shape}]`);
    }
    if (packed.dtype === "uint8") {
      if ((packed.scale ?? 255) !== 255) throw new Error(`${name}: unsupported scale ${packed.scale}`);
      return { shape: packed.shape, values: new Uint8Array(buffer) };
    }
    if (packed.dtype === "uint16") return { shape: packed.shape, values: littleEndianHalves(buffer) };
    return { shape: packed.shape, halves: littleEndianHalves(buffer) };
  }

  /** `length` float16 values of a decoded array from flat index `offset`, as float32. */
  function halfSlice(array, offset, length) {
    const table = halfLookup();
    const out = new Float32Array(length);
    for (let i = 0; i < length; i++) out[i] = table[array.halves[offset + i]];
    return out;
  }

  async function decodeArrays(data) {
    const names = ["attention", "queries", "keys", "valueNorms"].filter((name) => data[name]);
    const arrays = await Promise.all(names.map((name) => decodeArray(data[name], name)));
    const decoded = Object.fromEntries(names.map((name, i) => [name, arrays[i]]));
    if (data.view === "head" && data.long) {
      decoded.long = await LongInput.decode(data);
      decoded.attention = decoded.long.windowAttention(data.long.start, data.long.stop);
    }
    if (data.view === "model" && data.long && data.long.thumbnails) {
      decoded.thumbnails = await decodeArray(data.long.thumbnails, "long.thumbnails");
      const shape = decoded.thumbnails.shape;
      if (shape[0] !== data.layers || shape[1] !== data.heads || shape[2] !== shape[3]) {
        throw new Error(`long.thumbnails has shape [${shape}]`);
      }
    }
    checkShapes(data, decoded);
    return decoded;
  }

  function checkShapes(data, arrays) {
    const { layers, heads, n } = data;
    const expect = (name, shape) => {
      const actual = arrays[name] && arrays[name].shape;
      if (!actual) throw new Error(`the ${data.view} view needs "${name}"`);
      if (shape.some((size, i) => size !== null && size !== actual[i]) || actual.length !== shape.length) {
        throw new Error(`${name} has shape [${actual}], expected [${shape.map((s) => s ?? "d")}]`);
      }
    };
    if (data.view === "neuron") {
      expect("queries", [layers, heads, n, null]);
      expect("keys", [layers, heads, n, arrays.queries.shape[3]]);
      if (data.valueNorms) expect("valueNorms", [layers, heads, n]);
    } else {
      expect("attention", [layers, heads, n, data.keyTokens.length]);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Theme: CSS variables on <html data-theme>, read back for canvas drawing
  // ---------------------------------------------------------------------------------------------

  const THEME_VARS = {
    bg: "--bt-bg", fg: "--bt-fg", muted: "--bt-muted", panel: "--bt-panel", border: "--bt-border",
    accent: "--bt-accent", highlight: "--bt-highlight", heat: "--bt-heat", neg: "--bt-neg", pos: "--bt-pos",
    font: "--bt-font", mono: "--bt-mono",
  };

  function applyTheme(name) {
    document.documentElement.dataset.theme = name === "dark" ? "dark" : "light";
  }

  const currentTheme = () => document.documentElement.dataset.theme || "light";

  function themeColours() {
    const style = getComputedStyle(document.documentElement);
    const colours = {};
    for (const [key, name] of Object.entries(THEME_VARS)) colours[key] = style.getPropertyValue(name).trim();
    return colours;
  }

  let colourProbe = null;
  /** Any CSS colour -> [r, g, b] (via the canvas colour parser). */
  function rgbOf(colour) {
    colourProbe = colourProbe || document.createElement("canvas").getContext("2d");
    colourProbe.fillStyle = "#000000";
    colourProbe.fillStyle = colour;
    const value = colourProbe.fillStyle;
    if (value.startsWith("#")) return [1, 3, 5].map((i) => parseInt(value.slice(i, i + 2), 16));
    return value.match(/[\d.]+/g).slice(0, 3).map(Number);
  }

  const mixRgb = (a, b, t) => a.map((v, i) => Math.round(v + (b[i] - v) * t));
  const cssRgb = ([r, g, b]) => `rgb(${r},${g},${b})`;
  const hexRgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const cssHex = (rgb) => `#${rgb.map((v) => v.toString(16).padStart(2, "0")).join("")}`;

  /** WCAG 2 relative luminance of an [r, g, b] colour (0..255 channels). */
  function luminance(rgb) {
    const [r, g, b] = rgb.map((v) => {
      const c = v / 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }

  /** Black or white, whichever contrasts more with `rgb` (at least 4.58:1 for any colour). */
  const inkOn = (rgb) => (luminance(rgb) > 0.179 ? "#000000" : "#ffffff");

  const palettes = {};
  /** The 20 head colours of the current theme (hex). */
  function headPalette() {
    const theme = currentTheme();
    if (!palettes[theme]) {
      const lighten = (hex) => cssHex(mixRgb(hexRgb(hex), [255, 255, 255], DARK_THEME_LIGHTEN));
      palettes[theme] = theme === "dark" ? HEAD_COLOURS.map(lighten) : HEAD_COLOURS;
    }
    return palettes[theme];
  }

  /** Colour every element marked data-head-colour="h" (swatches, column labels) with head h's theme colour:
   *  --bt-swatch, and --bt-swatch-ink for text on it. */
  function paintHeadColours(scope) {
    for (const node of scope.querySelectorAll("[data-head-colour]")) {
      const colour = headColour(Number(node.dataset.headColour));
      node.style.setProperty("--bt-swatch", colour);
      node.style.setProperty("--bt-swatch-ink", inkOn(hexRgb(colour)));
    }
  }

  /** 2 * steps + 1 colours from `neg` through the background to `pos`. */
  function divergingRamp(colours, steps = 32) {
    const [bg, neg, pos] = [colours.bg, colours.neg, colours.pos].map(rgbOf);
    return range(2 * steps + 1).map((k) => {
      const t = (k - steps) / steps;
      return cssRgb(t < 0 ? mixRgb(bg, neg, -t) : mixRgb(bg, pos, t));
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Canvas helpers
  // ---------------------------------------------------------------------------------------------

  /** Size a canvas for `width` x `height` CSS px at the device pixel ratio; clear it; return its context. */
  function prepareCanvas(canvas, width, height) {
    const ratio = Math.min(window.devicePixelRatio || 1, MAX_CANVAS_PX / Math.max(width, height, 1));
    const pixelsWide = Math.max(1, Math.round(width * ratio));
    const pixelsHigh = Math.max(1, Math.round(height * ratio));
    if (canvas.width !== pixelsWide || canvas.height !== pixelsHigh) {
      canvas.width = pixelsWide;
      canvas.height = pixelsHigh;
    }
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, pixelsWide, pixelsHigh);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return ctx;
  }

  const canvasFont = (colours, size = 12, weight = "") => `${weight} ${size}px ${colours.font}`.trim();

  /** `text`, shortened with an ellipsis to fit `maxWidth` px in the context's current font. */
  function fitText(ctx, text, maxWidth) {
    if (ctx.measureText(text).width <= maxWidth) return text;
    let low = 0;
    let high = text.length;
    while (low < high) {
      const mid = Math.ceil((low + high) / 2);
      if (ctx.measureText(`${text.slice(0, mid)}\u2026`).width <= maxWidth) low = mid;
      else high = mid - 1;
    }
    return `${text.slice(0, low)}\u2026`;
  }

  function measureContext(colours) {
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = canvasFont(colours);
    return ctx;
  }

  /**
   * A picture is {width, height, paint(ctx, colours)} in CSS px. Render it to a fresh canvas with the
   * theme background.
   */
  function renderPicture(picture) {
    const colours = themeColours();
    // 2x for crisp pictures, 1x for very tall ones (512 tokens) to keep the file and the time small.
    const scale = Math.min(picture.height > 4000 ? 1 : 2, MAX_CANVAS_PX / Math.max(picture.width, picture.height));
    const canvas = document.createElement("canvas");
    canvas.width = Math.ceil(picture.width * scale);
    canvas.height = Math.ceil(picture.height * scale);
    const ctx = canvas.getContext("2d");
    ctx.scale(scale, scale);
    ctx.fillStyle = colours.bg;
    ctx.fillRect(0, 0, picture.width, picture.height);
    picture.paint(ctx, colours);
    return canvas;
  }

  function download(blob, filename) {
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: filename, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 30000);
  }

  function svgNode(tag, attributes = {}, text = undefined) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ---------------------------------------------------------------------------------------------
  // Attention lines: one Path2D (or SVG path) per (head, opacity level)
  //
  // Real models at n = 512 have ~10^5..10^6 weights >= 1/255 per layer, and a canvas strokes about
  // 10^5 short hairlines per 100 ms. So only the part of the picture in view is drawn (the canvas is
  // the height of the viewport; `band` is the visible y-range), and if more than a budget of lines
  // cross it, the faintest are left out (a note says so; a hovered or pinned token shows all of its own).
  // ---------------------------------------------------------------------------------------------

  /** code (0..255) -> opacity level 1..LEVELS; 0 = not drawn (weight below 1/255). */
  const LEVEL_OF_CODE = Uint8Array.from(range(256), (code) => Math.ceil((code * LEVELS) / 255));
  const FULL_BAND = { top: -Infinity, bottom: Infinity };
  /**
   * Opacity of a level's lines, from the middle of its weight range w. By default w / (heads shown), as
   * BertViz draws them: the strong lines of many heads add up where they agree (the [CLS] and [SEP]
   * patterns) and small weights fade out. Faint lines: MIN_LINE_ALPHA + (1 - MIN_LINE_ALPHA) * w, so that
   * every drawn line stays visible.
   */
  function levelAlpha(spec, level) {
    const weight = (level - 0.5) / LEVELS;
    const alpha = spec.faint ? MIN_LINE_ALPHA + (1 - MIN_LINE_ALPHA) * weight : weight / Math.max(1, spec.heads.length);
    return +alpha.toFixed(4);
  }

  /** The smallest code drawn: by default a line must reach one step of 8-bit colour (weight / heads shown
   *  at least 1/255, so code >= heads shown); faint lines: every weight of at least 1/255. */
  const visibleCode = (spec) => (spec.faint ? 1 : Math.max(1, spec.heads.length));

  const rowCentre = (i) => (i + 0.5) * ROW;

  /** Rows [from, to) whose centre lies in the band. */
  function rowsInBand(band, n) {
    const from = clamp(Math.ceil(band.top / ROW - 0.5), 0, n);
    const to = clamp(Math.floor(band.bottom / ROW - 0.5) + 1, from, n);
    return [from, to];
  }

  /**
   * Call visit(i, j, code) for each line of `head` with code >= minCode that passes the focus (one
   * token's row or column), the segment filter and crosses the band.
   * spec: {values, n, m, headCount, layer, heads, focus, filter, segments, keySegments, band, faint}
   * (n query rows, m key rows: values is [layers, heads, n, m]).
   */
  function visitLines(spec, head, minCode, visit) {
    const { values, n, m, focus, segments, keySegments, filter } = spec;
    const base = (spec.layer * spec.headCount + head) * n * m;
    const [rowFrom, rowTo] = focus && focus.side === "left" ? [focus.index, focus.index + 1] : [0, n];
    const [colFrom, colTo] = focus && focus.side === "right" ? [focus.index, focus.index + 1] : [0, m];
    const [first, end] = rowsInBand(spec.band, Math.max(n, m));
    for (let i = rowFrom; i < rowTo; i++) {
      if (filter.query !== null && segments[i] !== filter.query) continue;
      // A line from above the band must end at or below its top, one from below at or above its bottom.
      const from = i < first ? Math.max(colFrom, first) : colFrom;
      const to = i >= end ? Math.min(colTo, end) : colTo;
      const offset = base + i * m;
      for (let j = from; j < to; j++) {
        const code = values[offset + j];
        if (code < minCode || (filter.key !== null && keySegments[j] !== filter.key)) continue;
        visit(i, j, code);
      }
    }
  }

  /**
   * The smallest code to draw so that at most `budget` of the visible lines (visibleCode) are drawn:
   * {minCode, lines, candidates, floor}; lines were left out when minCode > floor.
   */
  function lineThreshold(spec, budget) {
    const floor = visibleCode(spec);
    const counts = new Float64Array(256);
    for (const head of spec.heads) visitLines(spec, head, floor, (i, j, code) => counts[code]++);
    const candidates = counts.reduce((a, b) => a + b, 0);
    let lines = 0;
    for (let code = 255; code >= floor; code--) {
      if (lines + counts[code] > budget) return { minCode: code + 1, lines, candidates, floor };
      lines += counts[code];
    }
    return { minCode: floor, lines, candidates, floor };
  }

  /** Send each drawable line of `head` to a sink (moveTo / lineTo) per opacity level; returns the sinks. */
  function traceLines(spec, head, minCode, width, makeSink) {
    const sinks = [];
    const [x0, x1] = lineSpan(spec, width);
    visitLines(spec, head, minCode, (i, j, code) => {
      const level = LEVEL_OF_CODE[code];
      const sink = sinks[level] || (sinks[level] = makeSink());
      sink.moveTo(x0, rowCentre(i));
      sink.lineTo(x1, rowCentre(j));
    });
    return sinks;
  }

  // Weight boxes: while a token is hovered or pinned, each token on the other side gets one small box per
  // shown head, filled with that head's colour at an opacity equal to the weight (as BertViz does), so
  // that heads drawing over the same lines can still be told apart. The lines end where the boxes begin.

  /** px per head of the weight boxes: 10 for a few heads, down to 5 for many. */
  const boxSize = (heads) => clamp(Math.floor(120 / Math.max(heads, 1)), 5, 10);
  const boxesWidth = (spec) => (spec.focus && spec.heads.length ? spec.heads.length * boxSize(spec.heads.length) + 4 : 0);

  /** [x0, x1]: where the lines start and end in a lane `width` px wide (clear of the weight boxes). */
  function lineSpan(spec, width) {
    if (!spec.focus) return [0, width];
    return spec.focus.side === "left" ? [0, width - boxesWidth(spec)] : [boxesWidth(spec), width];
  }

  /**
   * The focus token's weight per shown head to (focus on the left) or from (focus on the right) every
   * token on the other side: {side, index, heads, rows: [other token][head position]}, a weight being
   * code / 255, or null where the segment filter hides that pair; null when no token is in focus.
   */
  function focusWeights(spec) {
    const { focus, values, n, m, heads, filter, segments, keySegments } = spec;
    if (!focus) return null;
    const left = focus.side === "left";
    const rows = range(left ? m : n).map((other) => {
      const [i, j] = left ? [focus.index, other] : [other, focus.index];
      const hidden = (filter.query !== null && segments[i] !== filter.query)
        || (filter.key !== null && keySegments[j] !== filter.key);
      return heads.map((head) => (hidden ? null : values[((spec.layer * spec.headCount + head) * n + i) * m + j] / 255));
    });
    return { side: focus.side, index: focus.index, heads: [...heads], rows };
  }

  /** Call box(x, y, size, head, weight) for each weight box in the band (rows in lane coordinates). */
  function visitBoxes(spec, width, box) {
    const weights = focusWeights(spec);
    if (!weights) return;
    const size = boxSize(weights.heads.length);
    const x0 = weights.side === "left" ? width - boxesWidth(spec) + 4 : 0;
    const [from, to] = rowsInBand(spec.band, weights.rows.length);
    for (let row = from; row < to; row++) {
      weights.rows[row].forEach((weight, position) => {
        if (weight !== null) box(x0 + position * size, row * ROW + 3, size, weights.heads[position], weight);
      });
    }
  }

  /** Paint the weight boxes: an outline in the border colour, filled with the head colour at the weight. */
  function paintBoxes(ctx, spec, width, colours) {
    const outlines = new Path2D();
    ctx.save();
    visitBoxes(spec, width, (x, y, size, head, weight) => {
      outlines.rect(x + 0.5, y + 0.5, size - 2, ROW - 7);
      if (weight <= 0) return;
      ctx.globalAlpha = weight;
      ctx.fillStyle = headColour(head);
      ctx.fillRect(x + 1, y + 1, size - 3, ROW - 8);
    });
    ctx.globalAlpha = 1;
    ctx.lineWidth = 1;
    ctx.strokeStyle = colours.border;
    ctx.stroke(outlines);
    ctx.restore();
  }

  function svgBoxes(spec, width, colours) {
    const group = svgNode("g", { stroke: colours.border, "stroke-width": 1 });
    visitBoxes(spec, width, (x, y, size, head, weight) => {
      const attributes = { x: x + 0.5, y: y + 0.5, width: size - 2, height: ROW - 7, fill: headColour(head) };
      group.append(svgNode("rect", { ...attributes, "fill-opacity": +weight.toFixed(4) }));
    });
    return group;
  }

  /** Stroke the lines of spec.heads; returns {minCode, lines, candidates}. */
  function strokeLines(ctx, spec, width, budget) {
    const shown = lineThreshold(spec, budget);
    // Lines of one device pixel take the rasteriser's fast hairline path; wider ones only when few.
    ctx.lineWidth = shown.lines <= THICK_LINES ? 1.5 : 1 / ctx.getTransform().a;
    for (const head of spec.heads) {
      ctx.strokeStyle = headColour(head);
      traceLines(spec, head, shown.minCode, width, () => new Path2D()).forEach((path, level) => {
        ctx.globalAlpha = levelAlpha(spec, level);
        ctx.stroke(path);
      });
    }
    ctx.globalAlpha = 1;
    return shown;
  }

  /** Collects an SVG path "d" string. */
  class PathText {
    constructor() {
      this.parts = [];
    }

    moveTo(x, y) {
      this.parts.push(`M${x} ${+y.toFixed(1)}`);
    }

    lineTo(x, y) {
      this.parts.push(`L${x} ${+y.toFixed(1)}`);
    }
  }

  function svgLines(spec, width, budget) {
    const shown = lineThreshold(spec, budget);
    const group = svgNode("g", { fill: "none", "stroke-width": shown.lines <= THICK_LINES ? 1.5 : 1 });
    for (const head of spec.heads) {
      traceLines(spec, head, shown.minCode, width, () => new PathText()).forEach((path, level) => {
        const attributes = { d: path.parts.join(""), stroke: headColour(head), "stroke-opacity": levelAlpha(spec, level) };
        group.append(svgNode("path", attributes));
      });
    }
    return group;
  }

  /** A one-line note when lines were left out, else "". */
  function linesNote(shown) {
    if (shown.minCode <= shown.floor) return "";
    const weight = ((shown.minCode - 0.5) / 255).toFixed(3);
    return `Showing the ${shown.lines.toLocaleString("en")} strongest of ${shown.candidates.toLocaleString("en")} `
      + `lines in view (weights \u2265 ${weight}); hover or click a token to see all of its lines.`;
  }

  // ---------------------------------------------------------------------------------------------
  // Token table: left token column | canvas | right token column, with a sticky header row
  // ---------------------------------------------------------------------------------------------

  function tokenColumn(tokens, segments, side) {
    const column = el("div", { class: `bt-tokens bt-${side}` });
    tokens.forEach((token, index) => {
      const cls = segments[index] === 1 ? "bt-token bt-seg-b" : "bt-token";
      column.append(el("div", { class: cls, title: token, dataset: { index, side }, text: displayToken(token) }));
    });
    return column;
  }

  function tokenAt(target) {
    const node = target instanceof Element ? target.closest(".bt-token") : null;
    return node ? { side: node.dataset.side, index: Number(node.dataset.index) } : null;
  }

  /**
   * Left column: the query tokens; right column: the key tokens (the same tokens for self-attention, the
   * source tokens for cross-attention). The lane is as tall as the longer column.
   * The canvas sits in a "lane" as tall as all rows and sticks to the top of the scrolled area, so it
   * is never taller than the viewport; prepare() says which band of rows it shows, and a scroll or a
   * resize asks for a redraw (onViewport).
   */
  class TokenTable {
    /**
     * options: {tokens, segments, keyTokens?, keySegments?, canvasId, headers: {left, right},
     * onHover(token | null), onClick(token), onViewport()}
     */
    constructor(options) {
      const keyTokens = options.keyTokens || options.tokens;
      const keySegments = options.keySegments || options.segments;
      this.sides = {
        left: { tokens: options.tokens, segments: options.segments, labels: options.tokens.map(displayToken) },
        right: { tokens: keyTokens, segments: keySegments, labels: keyTokens.map(displayToken) },
      };
      this.headers = options.headers;
      this.columnLabels = [];
      this.active = null;
      this.canvas = el("canvas", { id: options.canvasId, class: "bt-canvas" });
      this.left = tokenColumn(options.tokens, options.segments, "left");
      this.right = tokenColumn(keyTokens, keySegments, "right");
      this.headerCentre = el("div", { class: "bt-th-center" });
      this.lane = el("div", { class: "bt-lane", style: { height: `${this.height}px` } }, [this.canvas]);
      const table = el("div", { class: "bt-table" }, [
        el("div", { class: "bt-th bt-th-left", text: this.headers.left }),
        this.headerCentre,
        el("div", { class: "bt-th bt-th-right", text: this.headers.right }),
        this.left,
        this.lane,
        this.right,
      ]);
      this.element = el("div", { class: "bt-scroll" }, [table]);
      const shown = () => this.element.isConnected && this.element.offsetParent !== null;
      let pending = false;
      const redrawSoon = () => {
        if (pending) return;
        pending = true;
        requestAnimationFrame(() => {
          pending = false;
          if (shown()) options.onViewport();
        });
      };
      this.element.addEventListener("scroll", redrawSoon, { passive: true });
      // A resize redraws at once: a frame out of view gets no animation frame and would stay stale. So
      // does a notebook frame about to grow to the height its page reported (FRAME_GROWS), since out of
      // view it gets no resize event either until it is scrolled to.
      for (const event of ["resize", FRAME_GROWS]) window.addEventListener(event, () => shown() && options.onViewport());
      for (const column of [this.left, this.right]) {
        column.addEventListener("mouseover", (event) => {
          const token = tokenAt(event.target);
          if (token) options.onHover(token);
        });
        column.addEventListener("mouseleave", () => options.onHover(null));
        column.addEventListener("click", (event) => {
          const token = tokenAt(event.target);
          if (token) options.onClick(token);
        });
      }
    }

    get height() {
      return Math.max(this.sides.left.tokens.length, this.sides.right.tokens.length) * ROW;
    }

    /** Size the canvas for the rows in view; returns {ctx (in row coordinates), band: {top, bottom}}. */
    prepare(width) {
      this.headerCentre.style.width = this.lane.style.width = `${width}px`;
      const room = this.element.clientHeight + frameGrowth() - HEADER;
      const height = Math.min(this.height, room >= ROW ? room : 2000);
      const ctx = prepareCanvas(this.canvas, width, height);
      const top = this.canvas.getBoundingClientRect().top - this.lane.getBoundingClientRect().top;
      const offset = clamp(Math.round(top), 0, this.height - height);
      ctx.translate(0, -offset);
      return { ctx, band: { top: offset, bottom: offset + height } };
    }

    /** Header labels over the canvas: [{x, text}] in canvas px. */
    setColumnLabels(labels) {
      this.columnLabels = labels;
      this.headerCentre.replaceChildren(
        ...labels.map(({ x, text }) => el("span", { text, style: { left: `${x}px` } })),
      );
    }

    /** Mark the shown token (and whether it is pinned). */
    setActive(token, pinned) {
      for (const node of this.element.querySelectorAll(".bt-token.bt-active")) {
        node.classList.remove("bt-active", "bt-pinned");
      }
      this.active = token;
      if (!token) return;
      const node = (token.side === "left" ? this.left : this.right).children[token.index];
      if (node) node.classList.add("bt-active", ...(pinned ? ["bt-pinned"] : []));
    }

    /** Geometry of the exported picture for a canvas body `bodyWidth` px wide. */
    exportLayout(bodyWidth, caption, colours) {
      const ctx = measureContext(colours);
      const fit = (side) => this.sides[side].labels.map((label) => fitText(ctx, label, LABEL_MAX));
      const fitted = { left: fit("left"), right: fit("right") };
      const widths = [...fitted.left, ...fitted.right].map((label) => ctx.measureText(label).width);
      ctx.font = canvasFont(colours, 11);
      widths.push(ctx.measureText(this.headers.left).width, ctx.measureText(this.headers.right).width);
      ctx.font = canvasFont(colours, 13, "600");
      const captionWidth = ctx.measureText(caption).width + 16;
      const column = Math.ceil(Math.max(40, ...widths)) + 16;
      const top = 52; // caption + header row
      const width = Math.ceil(Math.max(2 * column + bodyWidth, captionWidth));
      return { fitted, column, top, bodyX: column, width, height: top + this.height + 12 };
    }

    /** {width, height, paint} of the table: caption, headers, token labels, and paintBody(ctx) in between. */
    picture(bodyWidth, caption, paintBody) {
      const layout = this.exportLayout(bodyWidth, caption, themeColours());
      const paint = (ctx, colours) => {
        ctx.textBaseline = "middle";
        ctx.fillStyle = colours.fg;
        ctx.font = canvasFont(colours, 13, "600");
        ctx.textAlign = "left";
        ctx.fillText(caption, 8, 14);
        ctx.font = canvasFont(colours, 11);
        ctx.fillStyle = colours.muted;
        ctx.textAlign = "right";
        ctx.fillText(this.headers.left, layout.column - 8, 40);
        ctx.textAlign = "left";
        ctx.fillText(this.headers.right, layout.bodyX + bodyWidth + 8, 40);
        for (const { x, text } of this.columnLabels) ctx.fillText(text, layout.bodyX + x, 40);
        this.paintLabels(ctx, colours, layout, bodyWidth);
        ctx.save();
        ctx.translate(layout.bodyX, layout.top);
        paintBody(ctx, colours);
        ctx.restore();
      };
      return { width: layout.width, height: layout.height, paint };
    }

    paintLabels(ctx, colours, layout, bodyWidth) {
      ctx.font = canvasFont(colours, 12);
      const sides = [
        { side: "left", x: layout.column - 6, align: "right", boxX: 0 },
        { side: "right", x: layout.bodyX + bodyWidth + 6, align: "left", boxX: layout.bodyX + bodyWidth },
      ];
      for (const { side, x, align, boxX } of sides) {
        ctx.textAlign = align;
        const { segments } = this.sides[side];
        layout.fitted[side].forEach((label, index) => {
          const y = layout.top + rowCentre(index);
          if (this.active && this.active.side === side && this.active.index === index) {
            ctx.fillStyle = colours.highlight;
            ctx.fillRect(boxX, y - ROW / 2, layout.column, ROW);
          }
          ctx.fillStyle = segments[index] === 1 ? colours.accent : colours.fg;
          ctx.fillText(label, x, y);
        });
      }
    }

    /** The table as an SVG element: labels as <text> (full token in <title>), paintBody(svg group). */
    svg(bodyWidth, caption, body) {
      const colours = themeColours();
      const layout = this.exportLayout(bodyWidth, caption, colours);
      const svg = svgNode("svg", {
        xmlns: SVG_NS, width: layout.width, height: layout.height,
        viewBox: `0 0 ${layout.width} ${layout.height}`, "font-family": colours.font, "font-size": 12,
      });
      svg.append(svgNode("rect", { width: "100%", height: "100%", fill: colours.bg }));
      svg.append(svgNode("text", { x: 8, y: 18, fill: colours.fg, "font-weight": 600, "font-size": 13 }, caption));
      const header = (x, anchor, text) =>
        svgNode("text", { x, y: 44, fill: colours.muted, "font-size": 11, "text-anchor": anchor }, text);
      svg.append(header(layout.column - 8, "end", this.headers.left));
      svg.append(header(layout.bodyX + bodyWidth + 8, "start", this.headers.right));
      for (const side of ["left", "right"]) {
        const x = side === "left" ? layout.column - 6 : layout.bodyX + bodyWidth + 6;
        const anchor = side === "left" ? "end" : "start";
        const group = svgNode("g", { "text-anchor": anchor, "dominant-baseline": "central" });
        const { tokens, segments } = this.sides[side];
        layout.fitted[side].forEach((label, index) => {
          const fill = segments[index] === 1 ? colours.accent : colours.fg;
          const text = svgNode("text", { x, y: layout.top + rowCentre(index), fill }, label);
          text.append(svgNode("title", {}, tokens[index]));
          group.append(text);
        });
        svg.append(group);
      }
      body.setAttribute("transform", `translate(${layout.bodyX} ${layout.top})`);
      svg.append(body);
      return svg;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Attention line panel (head view, and the model view's enlarged head)
  // ---------------------------------------------------------------------------------------------

  class AttentionLines {
    /** onNote(text) receives a line saying which lines were left out ("" when none). */
    constructor({ data, attention, canvasId, heads, onNote }) {
      this.data = data;
      this.onNote = onNote;
      this.attention = attention;
      this.layer = data.layer;
      this.heads = heads;
      this.filter = "all";
      this.faint = data.faintLines;
      this.hover = null;
      this.pinned = null;
      this.table = new TokenTable({
        tokens: data.tokens,
        segments: data.segments,
        keyTokens: data.keyTokens,
        keySegments: data.keySegments,
        canvasId,
        headers: { left: "attending (query)", right: "attended to (key)" },
        onHover: (token) => this.setHover(token),
        onClick: (token) => this.pin(sameToken(token, this.pinned) ? null : token),
        onViewport: () => this.draw(),
      });
      this.element = this.table.element;
    }

    get focus() {
      return this.pinned || this.hover;
    }

    setHover(token) {
      if (sameToken(token, this.hover)) return;
      this.hover = token;
      if (!this.pinned) this.draw();
    }

    pin(token) {
      this.pinned = token;
      this.draw();
    }

    spec(band) {
      return {
        values: this.attention.values, n: this.data.n, m: this.data.keyTokens.length, headCount: this.data.heads,
        layer: this.layer, heads: this.heads, focus: this.focus, filter: SEGMENT_FILTERS[this.filter],
        segments: this.data.segments, keySegments: this.data.keySegments, band, faint: this.faint,
      };
    }

    draw() {
      const start = performance.now();
      const { ctx, band } = this.table.prepare(LINE_AREA);
      const spec = this.spec(band);
      const shown = strokeLines(ctx, spec, LINE_AREA, LINE_BUDGET);
      paintBoxes(ctx, spec, LINE_AREA, themeColours());
      this.table.setActive(this.focus, Boolean(this.pinned));
      this.onNote(linesNote(shown));
      api.lastDrawMs = performance.now() - start;
    }

    caption() {
      const named = this.data.headNames;
      const list = this.heads.map((head) => headLabel(this.data, head)).join(", ") || "none";
      const heads = this.heads.length === this.data.heads ? "all heads" : `${named ? "" : "head "}${list}`;
      const filter = this.filter === "all" ? "" : ` · ${SEGMENT_FILTERS[this.filter].label}`;
      const focus = this.focus;
      const fromQuery = focus && focus.side === "left";
      const tokens = fromQuery ? this.data.tokens : this.data.keyTokens;
      const token = focus ? ` · ${fromQuery ? "from" : "into"} ${displayToken(tokens[focus.index])}` : "";
      return `${this.data.model} · layer ${layerLabel(this.data, this.layer)} · ${heads}${filter}${token}`;
    }

    /** What the weight boxes show (see focusWeights), or null when no token is hovered or pinned. */
    weightBoxes() {
      return focusWeights(this.spec(FULL_BAND));
    }

    picture() {
      const spec = this.spec(FULL_BAND);
      const paint = (ctx, colours) => {
        strokeLines(ctx, spec, LINE_AREA, EXPORT_LINE_BUDGET);
        paintBoxes(ctx, spec, LINE_AREA, colours);
      };
      return this.table.picture(LINE_AREA, this.caption(), paint);
    }

    svg() {
      const spec = this.spec(FULL_BAND);
      const body = svgLines(spec, LINE_AREA, EXPORT_LINE_BUDGET);
      body.append(svgBoxes(spec, LINE_AREA, themeColours()));
      return this.table.svg(LINE_AREA, this.caption(), body);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Page frame: toolbar (title, controls, theme, export), hint, body
  // ---------------------------------------------------------------------------------------------

  function selectControl(id, label, options, value, onChange) {
    const select = el("select", { id, "aria-label": label });
    for (const [optionValue, text] of options) select.append(el("option", { value: optionValue, text }));
    select.value = String(value);
    select.addEventListener("change", () => onChange(select.value));
    return { select, element: el("label", { class: "bt-control" }, [label, select]) };
  }

  function checkControl(id, label, checked, onChange, title) {
    const input = el("input", { id, type: "checkbox" });
    input.checked = checked;
    input.addEventListener("change", () => onChange(input.checked));
    return { input, element: el("label", { class: "bt-control", title }, [input, label]) };
  }

  /** The segment filter's select (#bt-filter): All, A → A, A → B, B → A, B → B. */
  function filterControl(onChange) {
    const options = Object.entries(SEGMENT_FILTERS).map(([key, { label }]) => [key, label]);
    return selectControl("bt-filter", "Attention", options, "all", onChange);
  }

  const layerOptions = (data) => range(data.layers).map((layer) => [layer, layerLabel(data, layer)]);
  const headOptions = (data) => range(data.heads).map((head) => [head, headLabel(data, head)]);

  function button(id, text, onClick, title) {
    return el("button", { id, class: "bt-button", type: "button", title, text, onclick: onClick });
  }

  /** The page frame of a view. actions: {toggleTheme, exportPng, exportSvg?} (no exportSvg: no SVG button). */
  function frame({ data, title, controls, hint, body, actions }) {
    const themeButton = button("bt-theme", "", () => actions.toggleTheme(), "Switch light / dark theme");
    const syncThemeButton = () => {
      const dark = currentTheme() === "dark";
      themeButton.textContent = dark ? "\u2600 Light" : "\u263e Dark";
      themeButton.setAttribute("aria-pressed", String(dark));
    };
    syncThemeButton();
    const status = el("div", { id: "bt-status", class: "bt-status", role: "status" });
    const square = !data.keyTokens || data.keyTokens === data.tokens;
    const tokens = square ? `${data.n} tokens` : `${data.n} query × ${data.keyTokens.length} key tokens`;
    const causal = data.causal ? " · causal" : "";
    const weights = data.weights === "norm" ? " · norm-based weights ‖αf(x)‖" : "";
    const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;
    const subtitle = `${data.model} · ${tokens} · ${plural(data.layers, "layer")} × ${plural(data.heads, data.headNames ? "column" : "head")}${causal}${weights}`;
    const toolbar = el("header", { class: "bt-toolbar" }, [
      el("div", { class: "bt-title" }, [
        el("strong", { text: data.heading || title }),
        el("span", { class: "bt-subtitle", text: subtitle, title: subtitle }),
      ]),
      ...controls,
      el("span", { class: "bt-spacer" }),
      themeButton,
      button("bt-export-png", "PNG", () => actions.exportPng(), "Download the current picture as PNG"),
      actions.exportSvg && button("bt-export-svg", "SVG", () => actions.exportSvg(), "Download the lines as SVG"),
    ]);
    const element = el("div", { class: "bt-frame" }, [
      toolbar,
      data.caption && el("div", { id: "bt-caption", class: "bt-hint", text: data.caption }),
      el("div", { class: "bt-hint", text: hint }),
      status,
      ...body,
    ]);
    const setStatus = (text) => {
      if (status.textContent !== text) status.textContent = text;
    };
    return { element, syncThemeButton, setStatus };
  }

  /** Head selector: a colour swatch per head; click toggles, double-click shows that head alone. */
  class HeadPicker {
    constructor(data, onChange) {
      this.visible = range(data.heads).map((head) => !data.selectedHeads || data.selectedHeads.includes(head));
      this.onChange = onChange;
      const name = (head) => (data.headNames ? data.headNames[head] : `Head ${head}`);
      this.buttons = range(data.heads).map((head) =>
        el("button", {
          class: "bt-swatch", type: "button", text: headLabel(data, head),
          title: `${name(head)}: click to toggle, double-click to show it alone`,
          dataset: { head, headColour: head }, "aria-pressed": String(this.visible[head]),
          onclick: () => this.toggle(head), ondblclick: () => this.solo(head),
        }),
      );
      const props = { id: "bt-heads", class: "bt-heads", role: "group", "aria-label": "Heads" };
      this.element = el("div", props, this.buttons);
      paintHeadColours(this.element);
    }

    get heads() {
      return range(this.visible.length).filter((head) => this.visible[head]);
    }

    set(heads) {
      this.visible = this.visible.map((_, head) => heads.includes(head));
      this.buttons.forEach((node, head) => node.setAttribute("aria-pressed", String(this.visible[head])));
      this.onChange(this.heads);
    }

    toggle(head) {
      this.set(this.heads.includes(head) ? this.heads.filter((h) => h !== head) : [...this.heads, head]);
    }

    solo(head) {
      const alone = this.heads.length === 1 && this.heads[0] === head;
      this.set(alone ? range(this.visible.length) : [head]);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Head view
  // ---------------------------------------------------------------------------------------------

  /**
   * A long input's head view (bertology.views.long): each row's k largest weights of one layer for all
   * n tokens, a minimap of the layer's pooled attention, and the window of tokens drawn as lines. The
   * minimap marks the window; the strip under it shows the window's attention into each region of the
   * input (summed top-k mass, the selected heads' mean); a click jumps there, the arrows scroll.
   */
  class LongInput {
    static async decode(data) {
      const long = data.long;
      if (!Array.isArray(long.tokens) || !Number.isInteger(long.n) || long.tokens.length !== long.n) {
        throw new Error(`"long.tokens" must list ${long.n} tokens`);
      }
      const [indices, weights, minimap] = await Promise.all([
        decodeArray(long.topIndices, "long.topIndices"), decodeArray(long.topWeights, "long.topWeights"),
        decodeArray(long.minimap, "long.minimap"),
      ]);
      const shape = [data.layers, data.heads, long.n, indices.shape[3]];
      for (const [name, array] of [["topIndices", indices], ["topWeights", weights]]) {
        if (array.shape.join() !== shape.join()) throw new Error(`long.${name} has shape [${array.shape}]`);
      }
      if (minimap.shape[0] !== data.layers || minimap.shape[1] !== data.heads) {
        throw new Error(`long.minimap has shape [${minimap.shape}]`);
      }
      return new LongInput(data, indices, weights, minimap);
    }

    constructor(data, indices, weights, minimap) {
      this.n = data.long.n;
      this.layers = data.layers;
      this.heads = data.heads;
      this.k = indices.shape[3];
      this.size = data.long.stop - data.long.start;
      this.start = data.long.start;
      this.stop = data.long.stop;
      this.tokens = data.long.tokens;
      this.segments = Array.isArray(data.long.segments) && data.long.segments.length === this.n
        ? data.long.segments : this.tokens.map(() => 0);
      this.indices = indices.values;
      this.weights = weights.values;
      this.minimap = minimap;
      this.cells = minimap.shape[2];
      this.onJump = () => {};
      const cellPx = Math.max(1, Math.floor(MINIMAP_PX / this.cells));
      this.canvas = el("canvas", { id: "bt-minimap", class: "bt-minimap", title: "Click to jump there" });
      this.strip = el("canvas", { id: "bt-outside", class: "bt-minimap-strip" });
      this.pixels = cellPx * this.cells;
      this.canvas.addEventListener("click", (event) => {
        const box = this.canvas.getBoundingClientRect();
        const token = Math.floor(((event.clientY - box.top) / box.height) * this.n);
        this.onJump(token - Math.floor(this.size / 2));
      });
      this.note = el("div", { id: "bt-window-note", class: "bt-hint" });
      this.element = el("div", { class: "bt-long" }, [
        el("div", { class: "bt-long-maps" }, [this.canvas, this.strip]), this.note,
      ]);
      const step = () => Math.max(1, Math.floor(this.size / 2));
      this.controls = el("span", { class: "bt-long-controls" }, [
        button("bt-window-back", "\u25c0", () => this.onJump(this.start - step()), "Scroll the window back"),
        button("bt-window-on", "\u25b6", () => this.onJump(this.start + step()), "Scroll the window on"),
      ]);
    }

    /** The window [from, to) of this.size tokens starting at `start`, inside the input; remembered. */
    clip(start) {
      const from = clamp(Math.round(start), 0, this.n - this.size);
      this.start = from;
      this.stop = from + this.size;
      return { from, to: this.stop };
    }

    /** The page data of the window [from, to). */
    windowData(data, from, to) {
      const tokens = this.tokens.slice(from, to);
      const segments = this.segments.slice(from, to);
      return { ...data, tokens, segments, keyTokens: tokens, keySegments: segments, n: to - from };
    }

    /** {values: [layers, heads, W, W] codes}: the rows' top-k weights that fall inside the window. */
    windowAttention(from, to) {
      const w = to - from;
      const values = new Uint8Array(this.layers * this.heads * w * w);
      for (let plane = 0; plane < this.layers * this.heads; plane++) {
        for (let row = from; row < to; row++) {
          const base = (plane * this.n + row) * this.k;
          const out = (plane * w + row - from) * w;
          for (let j = 0; j < this.k; j++) {
            const key = this.indices[base + j];
            if (key >= from && key < to) values[out + key - from] = this.weights[base + j];
          }
        }
      }
      return { shape: [this.layers, this.heads, w, w], values };
    }

    /** [cells]: the window rows' mean top-k mass (0..1, over the selected heads of `layer`) into each
     * minimap region. */
    regionMass(heads, layer) {
      const mass = new Float64Array(this.cells);
      for (const head of heads) {
        for (let row = this.start; row < this.stop; row++) {
          const base = ((layer * this.heads + head) * this.n + row) * this.k;
          for (let j = 0; j < this.k; j++) {
            mass[Math.floor((this.indices[base + j] * this.cells) / this.n)] += this.weights[base + j] / 255;
          }
        }
      }
      const rows = Math.max(1, heads.length * (this.stop - this.start));
      return Array.from(mass, (value) => value / rows);
    }

    /** The minimap and strip of `layer`'s selected `heads`. */
    draw(heads, layer) {
      const colours = themeColours();
      const s = this.cells;
      const ctx = prepareCanvas(this.canvas, this.pixels, this.pixels);
      const lut = heatLookup(colours);
      const image = ctx.createImageData(s, s);
      for (let cell = 0; cell < s * s; cell++) {
        let top = 0;
        for (const head of heads) top = Math.max(top, this.minimap.values[(layer * this.heads + head) * s * s + cell]);
        image.data.set(lut.subarray(top * 4, top * 4 + 4), cell * 4);
      }
      const scratch = document.createElement("canvas");
      scratch.width = scratch.height = s;
      scratch.getContext("2d").putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(scratch, 0, 0, this.pixels, this.pixels);
      const y = (token) => (token / this.n) * this.pixels;
      ctx.strokeStyle = colours.accent;
      ctx.lineWidth = 2;
      ctx.strokeRect(1, y(this.start), this.pixels - 2, Math.max(2, y(this.stop) - y(this.start)));
      const strip = prepareCanvas(this.strip, this.pixels, 24);
      const mass = this.regionMass(heads, layer);
      const most = Math.max(1e-9, ...mass);
      const cellPx = this.pixels / s;
      strip.fillStyle = colours.heat;
      mass.forEach((value, cell) => {
        const height = (value / most) * 22;
        strip.fillRect(cell * cellPx, 24 - height, Math.max(1, cellPx - 0.5), height);
      });
      strip.fillStyle = colours.accent;
      strip.globalAlpha = 0.25;
      strip.fillRect(y(this.start), 0, Math.max(2, y(this.stop) - y(this.start)), 24);
      strip.globalAlpha = 1;
      const cut = (from, to) => mass.slice(Math.floor((from * s) / this.n), Math.ceil((to * s) / this.n));
      const sum = (values) => values.reduce((a, b) => a + b, 0);
      const before = sum(cut(0, this.start)), after = sum(cut(this.stop, this.n));
      const percent = (value) => `${(100 * value).toFixed(1)}%`;
      this.note.textContent = `Tokens ${this.start}\u2013${this.stop - 1} of ${this.n}; the window's top-${this.k} `
        + `attention to the regions before it: ${percent(before)}, after it: ${percent(after)}.`;
    }
  }

  class HeadView {
    /** leading: controls put first in the toolbar (the attention set selector). */
    constructor(data, arrays, actions, leading = []) {
      this.data = data;
      this.long = arrays.long || null;
      this.lines = this.makeLines(data, arrays.attention, data.selectedHeads || range(data.heads));
      const layers = layerOptions(data);
      this.layerControl = selectControl("bt-layer", "Layer", layers, data.layer, (v) => this.setLayer(v));
      this.picker = new HeadPicker(data, (heads) => {
        this.lines.heads = heads;
        this.draw();
      });
      const controls = [...leading, this.layerControl.element];
      if (data.pair) {
        this.filterControl = filterControl((v) => this.setFilter(v));
        controls.push(this.filterControl.element);
      }
      const faintTitle = "Faint lines: every line at an opacity of at least 0.1 (default: its weight divided by the heads shown, as BertViz)";
      this.faintControl = checkControl("bt-faint", "Faint", data.faintLines, (on) => this.setFaintLines(on), faintTitle);
      controls.push(this.picker.element, this.faintControl.element);
      let hint = "Hover a token to see only its attention (left: from it, right: into it); "
        + "click to pin it, click again to release. Click a head colour to toggle it, double-click to show it alone.";
      this.holder = el("div", { class: "bt-lines-holder" }, [this.lines.element]);
      const body = [this.holder];
      if (this.long) {
        this.long.onJump = (start) => this.setWindow(start);
        this.full = null; // {layer, start, stop} of the full-resolution block drawn, if the app sent one
        window.addEventListener("message", (event) => this.receiveBlock(event));
        controls.push(this.long.controls);
        body.unshift(this.long.element);
        hint += ` A window of a long input: each row's ${this.long.k} largest weights; `
          + "scroll with \u25c0 \u25b6, click the minimap to jump.";
      }
      this.frame = frame({ data, title: "Head view", controls, hint, body, actions });
      this.element = this.frame.element;
      this.requestBlock();
    }

    makeLines(data, attention, heads) {
      return new AttentionLines({
        data, attention, canvasId: "bt-canvas", heads, onNote: (text) => this.frame.setStatus(text),
      });
    }

    /** Long input: show the window of tokens from `start` (clipped to the input). */
    setWindow(start) {
      const { from, to } = this.long.clip(Number(start));
      const data = this.long.windowData(this.data, from, to);
      const { heads, filter, layer, faint } = this.lines;
      this.lines = this.makeLines(data, this.long.windowAttention(from, to), heads);
      Object.assign(this.lines, { filter, layer, faint });
      this.holder.replaceChildren(this.lines.element);
      this.full = null;
      this.draw();
      this.requestBlock();
    }

    /** In a frame (the web app): ask the parent for the window's full-resolution rows of the layer. */
    requestBlock() {
      if (!this.long || window.parent === window) return;
      const { start, stop } = this.long;
      window.parent.postMessage({ bertologyBlock: { layer: this.lines.layer, rows: [start, stop], keys: [start, stop] } }, "*");
    }

    /** The parent's answer to requestBlock: its probabilities, as 8-bit codes, replace the window's top-k
     * weights of that layer (if the window and layer are still the ones shown). */
    receiveBlock(event) {
      const answer = event.source === window.parent && event.data && event.data.bertologyBlockAnswer;
      if (!answer) return;
      const { start, stop } = this.long;
      const { layer, rows, keys, attention } = answer;
      const w = stop - start;
      const fits = layer === this.lines.layer && rows[0] === start && rows[1] === stop && keys[0] === start
        && keys[1] === stop && Array.isArray(attention) && attention.length === this.data.heads;
      if (!fits) return;
      const values = this.lines.attention.values;
      attention.forEach((headRows, head) => {
        const base = (layer * this.data.heads + head) * w * w;
        for (let row = 0; row < w; row++) {
          for (let key = 0; key < w; key++) values[base + row * w + key] = Math.round(clamp(headRows[row][key], 0, 1) * 255);
        }
      });
      this.full = { layer, start, stop };
      this.draw();
    }

    draw() {
      this.lines.draw();
      if (this.long) this.long.draw(this.lines.heads, this.lines.layer);
    }

    setLayer(layer) {
      this.lines.layer = clamp(Number(layer), 0, this.data.layers - 1);
      this.layerControl.select.value = String(this.lines.layer);
      this.draw();
      if (this.long && !(this.full && this.full.layer === this.lines.layer)) this.requestBlock();
    }

    setHeads(heads) {
      this.picker.set(heads.map(Number));
    }

    /** Show another attention array of the same shape (a training step of the watch page). */
    setAttention(attention) {
      this.lines.attention = attention;
      this.draw();
    }

    setFilter(filter) {
      if (!(filter in SEGMENT_FILTERS)) throw new Error(`unknown filter ${filter}`);
      this.lines.filter = filter;
      if (this.filterControl) this.filterControl.select.value = filter;
      this.draw();
    }

    setFaintLines(on) {
      this.lines.faint = Boolean(on);
      this.faintControl.input.checked = this.lines.faint;
      this.draw();
    }

    focusToken(side, index) {
      this.lines.pin(side ? { side, index: Number(index) } : null);
    }

    weightBoxes() {
      return this.lines.weightBoxes();
    }

    state() {
      const { layer, heads, filter, pinned, hover, faint } = this.lines;
      const window = this.long ? { start: this.long.start, stop: this.long.stop, n: this.long.n } : undefined;
      const full = this.long ? this.full : undefined; // the full-resolution block drawn, if any
      return { view: "head", layer, heads: [...heads], filter, faintLines: faint, pinned, hover, window, full };
    }

    picture() {
      return this.lines.picture();
    }

    svg() {
      return this.lines.svg();
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Model view: heatmap thumbnails for every (layer, head); click one to enlarge it as lines
  // ---------------------------------------------------------------------------------------------

  /** For `pixels` output cells over `n` inputs: the input range [start, end) pooled into each cell. */
  function poolBins(n, pixels) {
    const start = new Int32Array(pixels);
    const end = new Int32Array(pixels);
    for (let p = 0; p < pixels; p++) {
      start[p] = Math.min(n - 1, Math.floor((p * n) / pixels));
      end[p] = Math.max(start[p] + 1, Math.floor(((p + 1) * n) / pixels));
    }
    return { start, end };
  }

  // Entries of the heat lookup past the 256 codes: the two stripe colours of hatched, not attendable cells.
  const HATCH_DARK = 256;
  const HATCH_LIGHT = 257;

  /**
   * RGBA for each code 0..255: background mixed towards `ink` by weight^HEAT_GAMMA (< 1: faint weights
   * show); then the two hatch colours.
   */
  function heatLookup(colours) {
    const [bg, ink, border] = [rgbOf(colours.panel), rgbOf(colours.heat), rgbOf(colours.border)];
    const lut = new Uint8ClampedArray(258 * 4);
    for (let code = 0; code < 256; code++) {
      const rgb = mixRgb(bg, ink, (code / 255) ** HEAT_GAMMA);
      lut.set([...rgb, 255], code * 4);
    }
    lut.set([...border, 255], HATCH_DARK * 4);
    lut.set([...mixRgb(bg, border, 0.4), 255], HATCH_LIGHT * 4);
    return lut;
  }

  /**
   * Max-pool a block of the n x m matrix at `offset` into a pixels x pixels ImageData: the rows
   * block.rows (query positions) by the columns block.cols (key positions), each an ascending list.
   * causal: a cell whose keys all come after its queries is hatched.
   */
  function heatmapImage(ctx, values, offset, m, pixels, block, lut, causal) {
    const { rows: rowAt, cols: colAt } = block;
    const [rows, cols] = [poolBins(rowAt.length, pixels), poolBins(colAt.length, pixels)];
    const image = ctx.createImageData(pixels, pixels);
    const out = image.data;
    for (let py = 0; py < pixels; py++) {
      for (let px = 0; px < pixels; px++) {
        let best = 0;
        for (let r = rows.start[py]; r < rows.end[py]; r++) {
          const row = offset + rowAt[r] * m;
          for (let c = cols.start[px]; c < cols.end[px]; c++) if (values[row + colAt[c]] > best) best = values[row + colAt[c]];
        }
        const target = (py * pixels + px) * 4;
        const hatched = causal && colAt[cols.start[px]] > rowAt[rows.end[py] - 1];
        const source = (hatched ? ((px + py) % 6 < 2 ? HATCH_DARK : HATCH_LIGHT) : best) * 4;
        out[target] = lut[source];
        out[target + 1] = lut[source + 1];
        out[target + 2] = lut[source + 2];
        out[target + 3] = 255;
      }
    }
    return image;
  }

  /** The query rows and key columns a segment filter keeps: {rows, cols}, positions in ascending order. */
  function filterBlock(data, filter) {
    const { query, key } = SEGMENT_FILTERS[filter];
    const keep = (segments, segment) => Int32Array.from(
      range(segments.length).filter((i) => segment === null || segments[i] === segment),
    );
    return { rows: keep(data.segments, query), cols: keep(data.keySegments, key) };
  }

  function paintHeatmap(canvas, attention, data, layer, head, size, lut, block) {
    const pixels = Math.max(1, Math.round(size * Math.min(window.devicePixelRatio || 1, 3)));
    if (canvas.width !== pixels) canvas.width = canvas.height = pixels;
    const ctx = canvas.getContext("2d");
    const m = data.keyTokens.length;
    const offset = (layer * data.heads + head) * data.n * m;
    ctx.putImageData(heatmapImage(ctx, attention.values, offset, m, pixels, block, lut, data.causal), 0, 0);
  }

  class DetailPanel {
    constructor(data, attention, onClose) {
      const note = el("span", { class: "bt-status" });
      this.lines = new AttentionLines({
        data, attention, canvasId: "bt-detail-canvas", heads: [data.head],
        onNote: (text) => { note.textContent = text; },
      });
      this.title = el("h2");
      const close = button("bt-detail-close", "\u00d7 Close", () => onClose(), "Close (Esc)");
      const panel = el("div", { id: "bt-detail", class: "bt-detail", role: "dialog", "aria-modal": "true" }, [
        el("div", { class: "bt-detail-bar" }, [this.title, note, close]),
        this.lines.element,
      ]);
      this.element = el("div", { class: "bt-overlay", hidden: true }, [panel]);
      this.element.addEventListener("click", (event) => event.target === this.element && onClose());
      document.addEventListener("keydown", (event) => event.key === "Escape" && !this.element.hidden && onClose());
    }

    get isOpen() {
      return !this.element.hidden;
    }

    open(layer, head) {
      Object.assign(this.lines, { layer, heads: [head], pinned: null, hover: null });
      this.title.textContent = `Layer ${layerLabel(this.lines.data, layer)} · ${headCaption(this.lines.data, head)}`;
      this.element.hidden = false;
      this.lines.draw();
    }

    close() {
      this.element.hidden = true;
    }
  }

  class ModelView {
    /** leading: controls put first in the toolbar (the attention set selector). */
    constructor(data, arrays, actions, leading = []) {
      this.data = data;
      this.attention = arrays.attention;
      // A long input's thumbnails: the whole input, pooled into cells (the enlarged head: the window).
      this.thumbnails = arrays.thumbnails || null;
      const cells = this.thumbnails && this.thumbnails.shape[2];
      this.thumbData = this.thumbnails ? { ...data, n: cells, keyTokens: new Array(cells) } : data;
      // Window width less padding, the layer-label column and per-thumbnail gap and border.
      const available = window.innerWidth - 28 - GRID_LABEL - data.heads * 6;
      this.size = clamp(Math.floor(available / data.heads), 32, 96);
      this.thumbs = [];
      this.filter = "all";
      this.grid = this.buildGrid();
      this.detail = new DetailPanel(data, this.attention, () => this.closeDetail());
      const columns = data.headNames ? data.headNames.join(", ") : "heads (0-based)";
      const hint = `Rows are layers, columns are ${columns}. Each thumbnail is one matrix: `
        + "rows = attending (query) token, columns = attended-to (key) token, max-pooled. Click one to enlarge it."
        + (this.thumbnails ? ` Thumbnails show all ${data.long.n} tokens; an enlarged head shows tokens `
          + `${data.long.start}\u2013${data.long.stop - 1}.` : "")
        + (data.causal ? " Causal attention: hatched cells are later tokens, which a token cannot attend to." : "");
      const scroll = el("div", { class: "bt-scroll" }, [this.grid]);
      const body = [scroll, this.detail.element];
      const controls = [...leading];
      if (data.pair && !this.thumbnails) {
        // BertViz's "Sentence A -> Sentence B" filter: the thumbnails show that block of each matrix.
        this.filterControl = filterControl((v) => this.setFilter(v));
        controls.push(this.filterControl.element);
      }
      // SVG only through the API (for an enlarged head), so no SVG button here.
      const frameActions = { ...actions, exportSvg: null };
      this.frame = frame({ data, title: "Model view", controls, hint, body, actions: frameActions });
      this.element = this.frame.element;
    }

    buildGrid() {
      const { layers, heads } = this.data;
      const grid = el("div", { id: "bt-grid", class: "bt-grid", role: "grid" });
      grid.style.gridTemplateColumns = `${GRID_LABEL}px repeat(${heads}, ${this.size + 2}px)`;
      const corner = this.data.headNames ? "layer \\ column" : "layer \\ head";
      grid.append(el("div", { class: "bt-grid-label bt-corner", text: corner }));
      for (const head of range(heads)) {
        const label = headLabel(this.data, head);
        grid.append(el("div", {
          class: "bt-grid-label bt-col-label", text: label, title: label, dataset: { headColour: head },
        }));
      }
      for (const layer of range(layers)) {
        const label = layerLabel(this.data, layer);
        grid.append(el("div", { class: "bt-grid-label bt-row-label", text: label }));
        for (const head of range(heads)) {
          const thumb = el("canvas", {
            class: "bt-thumb", tabindex: 0, role: "button",
            title: `Layer ${label}, ${headCaption(this.data, head)}: click to enlarge`,
            "aria-label": `Layer ${label}, ${headCaption(this.data, head)}`, dataset: { layer, head },
            style: { width: `${this.size}px`, height: `${this.size}px` },
          });
          this.thumbs.push(thumb);
          grid.append(thumb);
        }
      }
      const openFrom = (event) => {
        const thumb = event.target.closest(".bt-thumb");
        if (thumb) this.openDetail(Number(thumb.dataset.layer), Number(thumb.dataset.head));
      };
      grid.addEventListener("click", openFrom);
      grid.addEventListener("keydown", (event) => (event.key === "Enter" || event.key === " ") && openFrom(event));
      paintHeadColours(grid);
      return grid;
    }

    draw() {
      const start = performance.now();
      const lut = heatLookup(themeColours());
      const block = filterBlock(this.thumbData, this.filter);
      for (const thumb of this.thumbs) {
        const [layer, head] = [Number(thumb.dataset.layer), Number(thumb.dataset.head)];
        paintHeatmap(thumb, this.thumbnails || this.attention, this.thumbData, layer, head, this.size, lut, block);
      }
      if (this.detail.isOpen) this.detail.lines.draw();
      api.lastDrawMs = performance.now() - start;
    }

    openDetail(layer, head) {
      this.detail.open(clamp(Number(layer), 0, this.data.layers - 1), clamp(Number(head), 0, this.data.heads - 1));
    }

    closeDetail() {
      this.detail.close();
    }

    /** Segment filter (a pair's "A → B", ...): the thumbnails' block and the enlarged head's lines. */
    setFilter(filter) {
      if (!(filter in SEGMENT_FILTERS)) throw new Error(`unknown filter ${filter}`);
      if (!this.filterControl) throw new Error("the filter is for a pair of texts");
      this.filter = this.detail.lines.filter = filter;
      this.filterControl.select.value = filter;
      this.draw();
    }

    /** Show another attention array of the same shape (a training step of the watch page). */
    setAttention(attention) {
      this.attention = attention;
      this.detail.lines.attention = attention;
      this.draw();
    }

    focusToken(side, index) {
      this.detail.lines.pin(side ? { side, index: Number(index) } : null);
    }

    weightBoxes() {
      return this.detail.isOpen ? this.detail.lines.weightBoxes() : null;
    }

    state() {
      const { layer, heads, pinned, hover } = this.detail.lines;
      const detail = this.detail.isOpen ? { layer, head: heads[0], pinned, hover } : null;
      return { view: "model", filter: this.filter, detail };
    }

    svg() {
      if (!this.detail.isOpen) throw new Error("SVG export needs an enlarged head");
      return this.detail.lines.svg();
    }

    picture() {
      if (this.detail.isOpen) return this.detail.lines.picture();
      const { layers, heads, model } = this.data;
      const cell = this.size + 6;
      const left = 40;
      const top = 58;
      const paint = (ctx, colours) => {
        ctx.fillStyle = colours.fg;
        ctx.font = canvasFont(colours, 13, "600");
        ctx.textBaseline = "middle";
        const filter = this.filter === "all" ? "" : ` · ${SEGMENT_FILTERS[this.filter].label}`;
        ctx.fillText(`${model} · all layers × heads (rows = layers, columns = heads)${filter}`, 8, 14);
        ctx.font = canvasFont(colours, 11);
        ctx.fillStyle = colours.muted;
        ctx.textAlign = "center";
        for (const head of range(heads)) {
          ctx.fillText(fitText(ctx, headLabel(this.data, head), cell), left + head * cell + this.size / 2, 44);
        }
        ctx.textAlign = "right";
        for (const layer of range(layers)) ctx.fillText(String(layer), left - 8, top + layer * cell + this.size / 2);
        ctx.imageSmoothingEnabled = false;
        for (const thumb of this.thumbs) {
          const x = left + Number(thumb.dataset.head) * cell;
          const y = top + Number(thumb.dataset.layer) * cell;
          ctx.drawImage(thumb, x, y, this.size, this.size);
        }
      };
      return { width: Math.max(left + heads * cell + 8, 480), height: top + layers * cell + 8, paint };
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Neuron view: q, k, q × k, q·k and softmax for one query token
  // ---------------------------------------------------------------------------------------------

  /** Colour cells batched by colour: one Path2D per ramp step, filled once. */
  class CellPainter {
    constructor(ramp) {
      this.ramp = ramp;
      this.steps = (ramp.length - 1) / 2;
      this.paths = new Map();
    }

    vector(values, offset, length, scale, x, y, cell, height) {
      for (let i = 0; i < length; i++) {
        const t = scale > 0 ? clamp(values[offset + i] / scale, -1, 1) : 0;
        const step = Math.round(t * this.steps) + this.steps;
        if (!this.paths.has(step)) this.paths.set(step, new Path2D());
        this.paths.get(step).rect(x + i * cell, y, cell, height);
      }
    }

    fill(ctx) {
      for (const [step, path] of this.paths) {
        ctx.fillStyle = this.ramp[step];
        ctx.fill(path);
      }
    }
  }

  function maxAbs(values) {
    let best = 0;
    for (const value of values) if (Math.abs(value) > best) best = Math.abs(value);
    return best;
  }

  /** Diagonal stripes in the border colour: cells a causal query cannot attend to. */
  function hatchPattern(ctx, colours) {
    const tile = document.createElement("canvas");
    tile.width = tile.height = 6;
    const stripes = tile.getContext("2d");
    stripes.strokeStyle = colours.border;
    stripes.lineWidth = 1.5;
    stripes.beginPath();
    for (const shift of [-6, 0, 6]) {
      stripes.moveTo(shift, 6);
      stripes.lineTo(shift + 6, 0);
    }
    stripes.stroke();
    return ctx.createPattern(tile, "repeat");
  }

  const NEURON_TOKEN_COLUMNS = 2 * 140 + 28 + 16; // both token columns (max-width in views.css), padding, scrollbar

  /**
   * Column layout, at most `maxWidth` px wide if it can be: vector cells shrink (8 px down to 2 px) and
   * then the bars (150 px down to 96 px) until it fits. norms: add ‖f(x)‖ and the norm-based weight.
   */
  function neuronColumns(d, norms, maxWidth) {
    const layout = (cell, bar) => {
      const widths = [["query", "query q", d * cell], ["key", "key k", d * cell], ["product", "q × k", d * cell],
        ["dot", "q · k", 58], ["softmax", "softmax", bar]];
      if (norms) widths.push(["norm", "\u2016f(x)\u2016", 58], ["normWeight", "\u2016\u03b1 f(x)\u2016 (rows sum to 1)", bar]);
      const columns = {};
      let x = 6;
      for (const [name, label, width] of widths) {
        columns[name] = { x, width, label };
        x += width + 18;
      }
      return { cell, columns, width: x - 12 };
    };
    let cell = clamp(Math.floor(224 / d), 2, 8);
    while (cell > 2 && layout(cell, 150).width > maxWidth) cell--;
    let bar = 150;
    while (bar > 96 && layout(cell, bar).width > maxWidth) bar -= 6;
    return layout(cell, bar);
  }

  /** "1.23", "0.0456", "12.3": three significant digits. */
  const scaleNumber = (value) => String(+value.toPrecision(3));

  class NeuronView {
    constructor(data, arrays, actions) {
      this.data = data;
      this.queries = arrays.queries;
      this.keys = arrays.keys;
      this.valueNorms = arrays.valueNorms || null;
      this.d = arrays.queries.shape[3];
      this.layer = clamp(data.layer, 0, data.layers - 1);
      this.head = clamp(data.head, 0, data.heads - 1);
      this.query = clamp(data.query, 0, data.n - 1);
      this.filter = "all";
      this.layout = neuronColumns(this.d, this.valueNorms !== null, window.innerWidth - NEURON_TOKEN_COLUMNS);
      this.table = new TokenTable({
        tokens: data.tokens, segments: data.segments, canvasId: "bt-canvas",
        headers: { left: "query token", right: "key token" },
        onHover: () => {},
        onClick: (token) => token.side === "left" && this.queryShown(token.index) && this.setQuery(token.index),
        onViewport: () => this.draw(),
      });
      this.table.element.classList.add("bt-neuron");
      const queryOptions = data.tokens.map((token, i) => [i, `${i}: ${displayToken(token)}`]);
      this.controls = {
        layer: selectControl("bt-layer", "Layer", layerOptions(data), this.layer, (v) => this.setLayer(v)),
        head: selectControl("bt-head", "Head", headOptions(data), this.head, (v) => this.setHead(v)),
        query: selectControl("bt-query", "Query", queryOptions, this.query, (v) => this.setQuery(v)),
      };
      this.legend = el("span", { id: "bt-legend", class: "bt-legend" });
      const keys = data.causal
        ? "over the keys the query may attend to (causal attention: itself and earlier tokens; later keys are hatched)"
        : "over all keys";
      const hint = "Click a token on the left (or pick it above) to make it the query. Each row shows a key's "
        + `vector k, q × k, q · k and softmax(q · k × s) ${keys} (s: the layer's scaling, 1/\u221ad in BERT). `
        + "Colours run from \u2212m (blue) through 0 to +m (red), m as the legend says."
        + (this.valueNorms ? " Norm-based weights: \u2016f(x)\u2016 is the norm of the key token's value vector "
          + "through the head's output projection; \u2016\u03b1 f(x)\u2016 = softmax \u00d7 \u2016f(x)\u2016, "
          + "each row divided by its sum (Kobayashi et al. 2020)." : "");
      const controls = Object.values(this.controls).map((control) => control.element);
      if (data.pair) {
        // BertViz's "Sentence A -> Sentence B" filter: queries from the first sentence, key rows of the second.
        this.filterControl = filterControl((v) => this.setFilter(v));
        controls.push(this.filterControl.element);
      }
      controls.push(this.legend);
      const body = [this.table.element];
      const frameActions = { ...actions, exportSvg: null };
      this.frame = frame({ data, title: "Neuron view", controls, hint, body, actions: frameActions });
      this.element = this.frame.element;
    }

    get scaling() {
      const scaling = this.data.scaling && this.data.scaling[this.layer];
      return typeof scaling === "number" ? scaling : 1 / Math.sqrt(this.d);
    }

    /** Whether the segment filter keeps query token `i` (left) or key row `j` (right). */
    queryShown(i) {
      const segment = SEGMENT_FILTERS[this.filter].query;
      return segment === null || this.data.segments[i] === segment;
    }

    keyShown(j) {
      const segment = SEGMENT_FILTERS[this.filter].key;
      return segment === null || this.data.segments[j] === segment;
    }

    /** Whether key `j` is out of the query's reach (causal attention: a later token). */
    masked(j) {
      const band = this.data.long && this.data.long.window; // a long input's sliding window: [before, after]
      if (Array.isArray(band) && (j < this.query - band[0] || j > this.query + band[1])) return true;
      return this.data.causal && j > this.query;
    }

    /**
     * q, all k, q × k, q · k and the softmax over the keys the query may attend to (masked keys: 0), and
     * the colour scales: vectorScale for q and k, productScale for q × k (the largest magnitude shown).
     */
    compute() {
      const { n, heads } = this.data;
      const d = this.d;
      const base = (this.layer * heads + this.head) * n * d;
      const q = halfSlice(this.queries, base + this.query * d, d);
      const keys = halfSlice(this.keys, base, n * d);
      const products = new Float32Array(n * d);
      const dots = new Float64Array(n);
      for (let j = 0; j < n; j++) {
        let dot = 0;
        for (let i = 0; i < d; i++) {
          const product = q[i] * keys[j * d + i];
          products[j * d + i] = product;
          dot += product;
        }
        dots[j] = dot;
      }
      const masked = range(n).map((j) => this.masked(j));
      const scores = dots.map((dot) => dot * this.scaling);
      const top = Math.max(...scores.filter((_, j) => !masked[j]));
      const weights = scores.map((score, j) => (masked[j] ? 0 : Math.exp(score - top)));
      const total = weights.reduce((a, b) => a + b, 0);
      const probs = weights.map((w) => w / total);
      const vectorScale = Math.max(maxAbs(q), maxAbs(keys));
      const productScale = maxAbs(products);
      const hidden = range(n).map((j) => !this.keyShown(j)); // rows the segment filter leaves out
      const result = { q, keys, products, dots, probs, masked, hidden, vectorScale, productScale };
      if (!this.valueNorms) return result;
      const norms = halfSlice(this.valueNorms, (this.layer * heads + this.head) * n, n);
      const weighted = probs.map((p, j) => p * norms[j]);
      const sum = weighted.reduce((a, b) => a + b, 0);
      return { ...result, norms, normWeights: weighted.map((w) => (sum > 0 ? w / sum : 0)) };
    }

    /** Paint the rows in `band`: query row highlight, q, k and q × k cells, q · k and softmax. */
    paintBody(ctx, colours, result, band) {
      const { cell, columns, width } = this.layout;
      const d = this.d;
      const [from, to] = rowsInBand({ top: band.top - ROW, bottom: band.bottom + ROW }, this.data.n);
      const vectors = new CellPainter(divergingRamp(colours));
      const cellHeight = ROW - 6;
      const outlines = new Path2D();
      const vectorRow = (values, offset, scale, column, row) => {
        vectors.vector(values, offset, d, scale, column.x, row * ROW + 3, cell, cellHeight);
        outlines.rect(column.x - 0.5, row * ROW + 2.5, d * cell + 1, cellHeight + 1);
      };
      ctx.fillStyle = colours.highlight;
      ctx.fillRect(0, this.query * ROW, width, ROW);
      vectorRow(result.q, 0, result.vectorScale, columns.query, this.query);
      for (let j = from; j < to; j++) {
        if (result.hidden[j]) continue;
        vectorRow(result.keys, j * d, result.vectorScale, columns.key, j);
        vectorRow(result.products, j * d, result.productScale, columns.product, j);
      }
      vectors.fill(ctx);
      ctx.lineWidth = 1;
      ctx.strokeStyle = colours.border;
      ctx.stroke(outlines);
      const hatched = range(to - from).map((k) => from + k).filter((j) => result.masked[j] && !result.hidden[j]);
      if (hatched.length) {
        // Later keys: q × k and everything after it hatched; the key vector itself stays readable.
        ctx.fillStyle = hatchPattern(ctx, colours);
        for (const j of hatched) ctx.fillRect(columns.product.x - 2, j * ROW + 1, width - columns.product.x + 2, ROW - 2);
      }
      this.paintNumbers(ctx, colours, result, from, to);
    }

    paintNumbers(ctx, colours, result, from, to) {
      const { dot, softmax, norm, normWeight } = this.layout.columns;
      ctx.font = `11px ${colours.mono}`;
      ctx.textBaseline = "middle";
      const bar = (column, p, j) => {
        const barWidth = column.width - 50;
        ctx.fillStyle = colours.panel;
        ctx.fillRect(column.x, j * ROW + 4, barWidth, ROW - 8);
        ctx.fillStyle = colours.accent;
        ctx.fillRect(column.x, j * ROW + 4, Math.max(p * barWidth, p > 0 ? 1 : 0), ROW - 8);
        ctx.fillStyle = colours.fg;
        ctx.textAlign = "left";
        ctx.fillText(p.toFixed(3), column.x + barWidth + 6, rowCentre(j));
      };
      const number = (column, value, j) => {
        ctx.fillStyle = colours.fg;
        ctx.textAlign = "right";
        ctx.fillText(value.toFixed(2), column.x + column.width, rowCentre(j));
      };
      for (let j = from; j < to; j++) {
        if (result.hidden[j]) continue;
        if (result.masked[j]) {
          ctx.fillStyle = colours.muted;
          ctx.textAlign = "left";
          const why = this.data.causal && j > this.query ? "later token" : "outside the window";
          ctx.fillText(`masked (${why})`, softmax.x, rowCentre(j));
          continue;
        }
        number(dot, result.dots[j], j);
        bar(softmax, result.probs[j], j);
        if (result.norms) {
          number(norm, result.norms[j], j);
          bar(normWeight, result.normWeights[j], j);
        }
      }
    }

    /** The colour scales of the shown vectors, with their numbers: "q, k −m [bar] +m · q × k −m [bar] +m". */
    showLegend() {
      const scale = (label, value) => [
        el("span", { class: "bt-legend-label", text: label }),
        el("span", { class: "bt-legend-value", text: `\u2212${scaleNumber(value)}` }),
        el("span", { class: "bt-legend-bar" }),
        el("span", { class: "bt-legend-value", text: `+${scaleNumber(value)}` }),
      ];
      const { vectorScale, productScale } = this.result;
      this.legend.replaceChildren(...scale("q, k", vectorScale), ...scale("q \u00d7 k", productScale));
      this.legend.title = "Colour scales: blue = negative, red = positive, the ends at the largest magnitude shown";
    }

    /** Recompute for the current selection, then draw. */
    update() {
      this.result = this.compute();
      this.table.setColumnLabels(Object.entries(this.layout.columns).map(([name, { x, label }]) => ({
        x, text: name === "softmax" ? `softmax (s = ${+this.scaling.toPrecision(3)})` : label,
      })));
      const { probs, masked, hidden } = this.result;
      this.table.right.childNodes.forEach((node, j) => {
        node.style.setProperty("--bt-weight", hidden[j] ? "0" : probs[j].toFixed(3));
        node.classList.toggle("bt-masked", masked[j]);
        node.classList.toggle("bt-filtered", hidden[j]);
      });
      this.table.left.childNodes.forEach((node, i) => node.classList.toggle("bt-filtered", !this.queryShown(i)));
      this.controls.query.select.querySelectorAll("option").forEach((option, i) => {
        option.disabled = !this.queryShown(i);
      });
      this.showLegend();
      this.draw();
    }

    draw() {
      const start = performance.now();
      if (!this.result) {
        this.update();
        return;
      }
      const { ctx, band } = this.table.prepare(this.layout.width);
      this.paintBody(ctx, themeColours(), this.result, band);
      this.table.setActive({ side: "left", index: this.query }, true);
      api.lastDrawMs = performance.now() - start;
    }

    setLayer(layer) {
      this.layer = clamp(Number(layer), 0, this.data.layers - 1);
      this.controls.layer.select.value = String(this.layer);
      this.update();
    }

    setHead(head) {
      this.head = clamp(Number(head), 0, this.data.heads - 1);
      this.controls.head.select.value = String(this.head);
      this.update();
    }

    setQuery(query) {
      this.query = clamp(Number(query), 0, this.data.n - 1);
      this.controls.query.select.value = String(this.query);
      this.update();
    }

    /**
     * Segment filter (a pair's "A → B", ...): queries from the first sentence (the query moves to its first
     * token if it is not in it), key rows of the second; the softmax stays the model's, over all keys.
     */
    setFilter(filter) {
      if (!(filter in SEGMENT_FILTERS)) throw new Error(`unknown filter ${filter}`);
      if (!this.filterControl) throw new Error("the filter is for a pair of texts");
      this.filter = filter;
      this.filterControl.select.value = filter;
      if (!this.queryShown(this.query)) this.query = range(this.data.n).find((i) => this.queryShown(i));
      this.controls.query.select.value = String(this.query);
      this.update();
    }

    focusToken(side, index) {
      if (side === "left") this.setQuery(index);
    }

    state() {
      const { layer, head, query, filter, scaling } = this;
      return { view: "neuron", layer, head, query, filter, scaling };
    }

    neuron() {
      const { dots, probs, masked, hidden, norms, normWeights, vectorScale, productScale } = this.result;
      const { layer, head, query } = this;
      const shownKeys = range(this.data.n).filter((j) => !hidden[j]);
      const shown = {
        layer, head, query, dots: Array.from(dots), probs: Array.from(probs), masked: [...masked], shownKeys,
        vectorScale, productScale,
      };
      return norms ? { ...shown, norms: Array.from(norms), normWeights: Array.from(normWeights) } : shown;
    }

    picture() {
      const { vectorScale, productScale } = this.result;
      const layer = layerLabel(this.data, this.layer);
      const filter = this.filter === "all" ? "" : ` · ${SEGMENT_FILTERS[this.filter].label}`;
      const caption = `${this.data.model} · layer ${layer} · ${headCaption(this.data, this.head)}${filter} · query ${this.query}: `
        + `${displayToken(this.data.tokens[this.query])} · colour scales: q, k \u00b1${scaleNumber(vectorScale)}; `
        + `q \u00d7 k \u00b1${scaleNumber(productScale)}`;
      const result = this.result;
      const paint = (ctx, colours) => this.paintBody(ctx, colours, result, FULL_BAND);
      return this.table.picture(this.layout.width, caption, paint);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Watch page: the head or model view of one probe example at any recorded training step, then a
  // report (facts, figures, a table). Every step's attention is decoded once; the step slider swaps the
  // shown array (setAttention) without rebuilding the view; another example or view kind rebuilds it.
  // data: {view: "watch", title, model, layers, heads, layer, theme, steps: [T],
  //        examples: [{tokens, segments, pair, n, caption, text, attention: packed [T, layers, heads, n, n]}],
  //        facts: [[term, value]], sections: [{id, title, figures: [{png, alt, caption}], table?}],
  //        alerts?: [{rule, step, what, where: [..], heads: [[layer, head]], follows, record}]} (the training
  //        rules'; follows: the divergence an alert came after, or null)
  // ---------------------------------------------------------------------------------------------

  const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

  function checkWatchData(data) {
    for (const key of ["layers", "heads"]) {
      if (!Number.isInteger(data[key]) || data[key] < 1) throw new Error(`"${key}" must be a positive integer`);
    }
    if (!Array.isArray(data.steps) || data.steps.length < 1) throw new Error("the run has no recorded step");
    if (!Array.isArray(data.examples) || data.examples.length < 1) throw new Error("the run has no probe example");
    data.model = String(data.model || "model");
    data.title = String(data.title || "Training");
    data.layer = Number.isInteger(data.layer) ? clamp(data.layer, 0, data.layers - 1) : 0;
  }

  async function decodeWatchArrays(data) {
    const arrays = await Promise.all(data.examples.map((example, i) => decodeArray(example.attention, `example ${i}`)));
    arrays.forEach((array, i) => {
      const { n } = data.examples[i];
      const expected = [data.steps.length, data.layers, data.heads, n, n];
      if (array.shape.length !== 5 || expected.some((size, axis) => size !== array.shape[axis])) {
        throw new Error(`example ${i} has attention of shape [${array.shape}], expected [${expected}]`);
      }
    });
    return arrays;
  }

  function reportFigure({ png, alt, caption }) {
    if (!BASE64.test(png)) throw new Error("a figure is not base64 PNG data");
    const image = el("img", { src: `data:image/png;base64,${png}`, alt, loading: "lazy" });
    return el("figure", {}, [image, caption && el("figcaption", { text: caption })]);
  }

  function reportTable({ caption, columns, rows }) {
    const head = el("tr", {}, columns.map((name) => el("th", { text: name })));
    const body = rows.map((row) => el("tr", {}, row.map((cell) => el("td", { text: String(cell) }))));
    const table = el("table", {}, [el("thead", {}, [head]), el("tbody", {}, body)]);
    return el("div", {}, [caption && el("p", { class: "bt-caption", text: caption }), el("div", { class: "bt-table-wrap" }, [table])]);
  }

  /** The training rules' alerts: #bt-alerts, a button per alert (.bt-alert[data-rule][data-step]) that
   *  calls show(index): move to the alert's record and show the heads it names. */
  function watchAlerts(data, show) {
    const alerts = Array.isArray(data.alerts) ? data.alerts : [];
    if (!alerts.length) return null;
    const items = alerts.map((alert, i) => {
      const where = Array.isArray(alert.where) ? alert.where.join(", ") : "";
      const button = el("button", {
        class: "bt-alert", type: "button", "data-rule": String(alert.rule), "data-step": String(alert.step),
        text: `step ${alert.step} · ${alert.rule}${alert.follows ? ` (after ${alert.follows})` : ""}: ${alert.what}${where ? ` (${where})` : ""}`,
      });
      button.addEventListener("click", () => show(i));
      return el("li", {}, [button]);
    });
    return el("section", { id: "bt-alerts", class: "bt-alerts" }, [
      el("h2", { text: `Alerts (${alerts.length})` }), el("ul", {}, items),
    ]);
  }

  function watchReport(data) {
    const facts = el("dl", { class: "bt-facts" }, data.facts.flatMap(([term, value]) => [
      el("dt", { text: term }), el("dd", { text: value }),
    ]));
    const sections = data.sections.map((section) => el("section", { id: `bt-${section.id}` }, [
      el("h2", { text: section.title }),
      ...(section.figures || []).map(reportFigure),
      section.table && reportTable(section.table),
    ]));
    return el("div", { id: "bt-report", class: "bt-report" }, [facts, ...sections]);
  }

  class WatchView {
    constructor(data, arrays) {
      this.data = data;
      this.arrays = arrays;
      this.stepIndex = data.steps.length - 1;
      this.example = 0;
      this.mode = "head";
      this.inner = null;
      this.slider = el("input", {
        id: "bt-step", type: "range", min: 0, max: data.steps.length - 1, step: 1, value: this.stepIndex,
        "aria-label": "Training step",
      });
      this.slider.addEventListener("input", () => this.setStep(this.slider.value));
      this.stepLabel = el("output", { id: "bt-step-label", class: "bt-step-label" });
      const examples = data.examples.map((example, i) => [i, `${i}: ${example.caption}`]);
      this.exampleControl = selectControl("bt-example", "Example", examples, 0, (v) => this.setExample(v));
      const modes = [["head", "Head view"], ["model", "Model view"]];
      this.modeControl = selectControl("bt-mode", "View", modes, this.mode, (v) => this.setMode(v));
      this.exampleText = el("div", { id: "bt-example-text", class: "bt-hint" });
      const subtitle = `${data.model} · ${data.steps.length} recorded steps · ${data.examples.length} probe examples`;
      const toolbar = el("header", { class: "bt-toolbar" }, [
        el("div", { class: "bt-title" }, [el("strong", { text: data.title }), el("span", { class: "bt-subtitle", text: subtitle })]),
        this.exampleControl.element,
        this.modeControl.element,
        el("label", { class: "bt-control bt-step" }, ["Step", this.slider, this.stepLabel]),
      ]);
      this.live = el("div", { class: "bt-watch-live" });
      const alerts = watchAlerts(data, (i) => this.showAlert(i));
      this.element = el("div", { class: "bt-watch" }, [toolbar, alerts, this.exampleText, this.live, watchReport(data)]);
      this.showStep();
    }

    /** The attention of `example` at record `stepIndex`, {shape: [layers, heads, n, n], values} (no copy). */
    attentionAt(example, stepIndex) {
      const [, layers, heads, n] = this.arrays[example].shape;
      const size = layers * heads * n * n;
      const values = this.arrays[example].values.subarray(stepIndex * size, (stepIndex + 1) * size);
      return { shape: [layers, heads, n, n], values };
    }

    showStep() {
      const { steps } = this.data;
      this.slider.value = String(this.stepIndex);
      this.stepLabel.textContent = `${steps[this.stepIndex]} (record ${this.stepIndex + 1} of ${steps.length})`;
    }

    /** (Re)build the inner head or model view for the current example and step. */
    build() {
      const example = this.data.examples[this.example];
      const previous = this.inner && this.inner.state();
      const layer = previous && Number.isInteger(previous.layer) ? previous.layer : this.data.layer;
      const data = {
        view: this.mode, model: this.data.model, theme: currentTheme(), tokens: example.tokens,
        segments: example.segments, pair: Boolean(example.pair), layers: this.data.layers, heads: this.data.heads,
        n: example.n, layer, head: 0, query: 0,
      };
      checkData(data);
      this.exampleText.textContent = example.text;
      this.inner = new VIEWS[this.mode](data, { attention: this.attentionAt(this.example, this.stepIndex) }, ACTIONS);
      this.live.replaceChildren(this.inner.element);
      installApi(this.inner, data);
      const innerState = api.state;
      Object.assign(api, {
        view: "watch",
        state: () => ({ ...innerState(), watch: this.state() }),
        setStep: (index) => this.setStep(index),
        setExample: (index) => this.setExample(index),
        setMode: (mode) => this.setMode(mode),
        showAlert: (index) => this.showAlert(index),
      });
      this.inner.draw();
    }

    setStep(index) {
      this.stepIndex = clamp(Number(index), 0, this.data.steps.length - 1);
      this.showStep();
      this.inner.setAttention(this.attentionAt(this.example, this.stepIndex));
    }

    setExample(index) {
      this.example = clamp(Number(index), 0, this.data.examples.length - 1);
      this.exampleControl.select.value = String(this.example);
      this.build();
    }

    /** Alert `index`: its record on the slider; for an alert about heads, the head view of the first
     *  named head's layer with the heads it names in that layer selected. */
    showAlert(index) {
      const alert = this.data.alerts[clamp(Number(index), 0, this.data.alerts.length - 1)];
      this.setStep(Number.isInteger(alert.record) ? alert.record : this.data.steps.length - 1);
      const heads = Array.isArray(alert.heads) ? alert.heads : [];
      if (!heads.length) return;
      if (this.mode !== "head") this.setMode("head");
      const layer = heads[0][0];
      this.inner.setLayer(layer);
      this.inner.setHeads(heads.filter(([at]) => at === layer).map(([, head]) => head));
    }

    setMode(mode) {
      if (mode !== "head" && mode !== "model") throw new Error(`unknown view ${mode}`);
      this.mode = mode;
      this.modeControl.select.value = mode;
      this.build();
    }

    state() {
      const { steps } = this.data;
      return { step: steps[this.stepIndex], stepIndex: this.stepIndex, steps: steps.length, example: this.example, mode: this.mode };
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Attention sets (encoder-decoder models): the head or model view of one set at a time, and a selector
  // (#bt-attention) in its toolbar that rebuilds the view for another set, keeping the layer if it has it.
  // data: {view: "head" | "model", model, theme, layer, head, attentionSet: name of the set shown first,
  //        attentionSets: [{name, label, tokens, segments, keyTokens?, keySegments?, layers, heads, n, causal,
  //                         attention: packed [layers, heads, n, keys]}]}
  // ---------------------------------------------------------------------------------------------

  async function decodeSets(data) {
    if (!Array.isArray(data.attentionSets) || data.attentionSets.length < 1) throw new Error('"attentionSets" is empty');
    return Promise.all(data.attentionSets.map(async (set) => {
      const { attention, ...fields } = set;
      const setData = {
        view: data.view, model: data.model, layer: data.layer, head: data.head, query: 0, faintLines: data.faintLines, ...fields,
      };
      checkData(setData);
      const arrays = { attention: await decodeArray(attention, `${setData.name} attention`) };
      checkShapes(setData, arrays);
      return { name: String(setData.name), label: String(setData.label || setData.name), data: setData, arrays };
    }));
  }

  class AttentionSetView {
    constructor(data, sets, root) {
      this.sets = sets;
      this.root = root;
      const first = sets.find((set) => set.name === data.attentionSet) || sets[0];
      const options = sets.map(({ name, label }) => [name, label]);
      this.control = selectControl("bt-attention", "Attention", options, first.name, (v) => this.setAttentionSet(v));
      this.show(first, data.layer);
    }

    show(set, layer) {
      this.current = set;
      this.control.select.value = set.name;
      const data = { ...set.data, layer: clamp(layer, 0, set.data.layers - 1) };
      this.inner = new VIEWS[data.view](data, set.arrays, ACTIONS, [this.control.element]);
      installApi(this.inner, data);
      const innerState = api.state;
      Object.assign(api, {
        state: () => ({ ...innerState(), attentionSet: this.current.name }),
        setAttentionSet: (name) => this.setAttentionSet(name),
      });
      this.root.replaceChildren(this.inner.element);
      this.inner.draw();
      if (api.ready) reportHeight();
    }

    setAttentionSet(name) {
      const set = this.sets.find((candidate) => candidate.name === name);
      if (!set) throw new Error(`unknown attention set ${name}`);
      const { layer } = this.inner.state();
      this.show(set, Number.isInteger(layer) ? layer : set.data.layer);
    }
  }

  async function startSets(root, data) {
    if (data.view !== "head" && data.view !== "model") throw new Error(`the ${data.view} view has no attention sets`);
    applyTheme(data.theme);
    const sets = await decodeSets(data);
    root.dataset.view = data.view;
    return new AttentionSetView(data, sets, root);
  }

  // ---------------------------------------------------------------------------------------------
  // Boot
  // ---------------------------------------------------------------------------------------------

  const VIEWS = { head: HeadView, model: ModelView, neuron: NeuronView };
  /** The toolbar buttons of every view call the page API (which the view in charge installed). */
  const ACTIONS = {
    toggleTheme: () => api.toggleTheme(),
    exportPng: () => api.exportPng(),
    exportSvg: () => api.exportSvg(),
  };

  function checkData(data) {
    if (!VIEWS[data.view]) throw new Error(`unknown view "${data.view}"`);
    for (const key of ["layers", "heads", "n"]) {
      if (!Number.isInteger(data[key]) || data[key] < 1) throw new Error(`"${key}" must be a positive integer`);
    }
    if (!Array.isArray(data.tokens) || data.tokens.length !== data.n) throw new Error(`expected ${data.n} tokens`);
    const segmentsOk = Array.isArray(data.segments) && data.segments.length === data.n;
    data.segments = segmentsOk ? data.segments : data.tokens.map(() => 0);
    // Key tokens: their own list for cross-attention (attention [layers, heads, n, keyTokens.length]).
    if (data.keyTokens === undefined || data.keyTokens === null) {
      data.keyTokens = data.tokens;
      data.keySegments = data.segments;
    } else {
      if (!Array.isArray(data.keyTokens) || data.keyTokens.length < 1) throw new Error('"keyTokens" must list tokens');
      const keySegmentsOk = Array.isArray(data.keySegments) && data.keySegments.length === data.keyTokens.length;
      data.keySegments = keySegmentsOk ? data.keySegments : data.keyTokens.map(() => 0);
    }
    data.causal = data.causal === true;
    data.faintLines = data.faintLines === true;
    data.model = String(data.model || "model");
    for (const key of ["layer", "head", "query"]) data[key] = Number.isInteger(data[key]) ? data[key] : 0;
    data.layer = clamp(data.layer, 0, data.layers - 1);
    data.head = clamp(data.head, 0, data.heads - 1);
    if (data.headNames !== undefined && data.headNames !== null) {
      if (!Array.isArray(data.headNames) || data.headNames.length !== data.heads) {
        throw new Error(`"headNames" must list ${data.heads} names`);
      }
      data.headNames = data.headNames.map(String);
    } else {
      data.headNames = null;
    }
    if (data.layerNames !== undefined && data.layerNames !== null) {
      if (!Array.isArray(data.layerNames) || data.layerNames.length !== data.layers) {
        throw new Error(`"layerNames" must list ${data.layers} names`);
      }
      data.layerNames = data.layerNames.map(String);
    } else {
      data.layerNames = null;
    }
    const headIndex = (head) => Number.isInteger(head) && head >= 0 && head < data.heads;
    if (data.selectedHeads !== undefined && data.selectedHeads !== null) {
      if (!Array.isArray(data.selectedHeads) || !data.selectedHeads.every(headIndex)) {
        throw new Error(`"selectedHeads" must list heads 0 to ${data.heads - 1}`);
      }
      data.selectedHeads = range(data.heads).filter((head) => data.selectedHeads.includes(head));
    } else {
      data.selectedHeads = null;
    }
  }

  function fileName(data, extension) {
    return `bertology-${data.view}-${data.model.replace(/[^\w.-]+/g, "_")}.${extension}`;
  }

  function installApi(view, data) {
    const redraw = () => {
      paintHeadColours(document);
      view.draw();
      view.frame.syncThemeButton();
    };
    const svgText = () => new XMLSerializer().serializeToString(view.svg());
    const pngDataUrl = () => renderPicture(view.picture()).toDataURL("image/png");
    const call = (method) => (...args) => {
      if (!view[method]) throw new Error(`the ${data.view} view has no ${method}()`);
      return view[method](...args);
    };
    Object.assign(api, {
      view: data.view,
      state: () => ({ ...view.state(), theme: currentTheme() }),
      setLayer: call("setLayer"),
      setHead: call("setHead"),
      setQuery: call("setQuery"),
      setHeads: call("setHeads"),
      setFilter: call("setFilter"),
      setFaintLines: call("setFaintLines"),
      focusToken: (side, index) => view.focusToken(side || null, index),
      openDetail: call("openDetail"),
      weightBoxes: call("weightBoxes"),
      closeDetail: call("closeDetail"),
      neuron: call("neuron"),
      setTheme: (name) => {
        applyTheme(name);
        redraw();
      },
      toggleTheme: () => api.setTheme(currentTheme() === "dark" ? "light" : "dark"),
      pngDataUrl,
      exportPng: () => {
        renderPicture(view.picture()).toBlob((blob) => download(blob, fileName(data, "png")), "image/png");
      },
      svgText,
      exportSvg: () => download(new Blob([svgText()], { type: "image/svg+xml" }), fileName(data, "svg")),
    });
  }

  async function startView(root, data) {
    checkData(data);
    applyTheme(data.theme);
    const arrays = await decodeArrays(data);
    const view = new VIEWS[data.view](data, arrays, ACTIONS);
    installApi(view, data);
    root.dataset.view = data.view;
    root.replaceChildren(view.element);
    view.draw();
  }

  async function startWatch(root, data) {
    checkWatchData(data);
    applyTheme(data.theme);
    const watch = new WatchView(data, await decodeWatchArrays(data));
    root.dataset.view = "watch";
    root.replaceChildren(watch.element);
    watch.build();
  }

  // A page shown in a frame (a notebook's output: View._repr_html_) tells its parent how tall its content
  // is, as the message {bertologyHeight: px}, so that the frame can be sized to it instead of scrolling.
  let reportedHeight = null;
  /** The window event of a page whose frame is about to grow to the height it reported. */
  const FRAME_GROWS = "bertology-frame-grows";

  /** The root's height with nothing scrolling inside it (.bt-measure lays the page out at full size). */
  function contentHeight() {
    const page = document.documentElement;
    page.classList.add("bt-measure");
    const height = Math.ceil(document.getElementById("bertology-root").getBoundingClientRect().height);
    page.classList.remove("bt-measure");
    return height;
  }

  function reportHeight() {
    if (window.parent === window) return;
    const height = contentHeight();
    if (height === reportedHeight) return;
    reportedHeight = height;
    window.parent.postMessage({ bertologyHeight: height }, "*");
    window.dispatchEvent(new Event(FRAME_GROWS));
  }

  /**
   * How much taller (px) this page's frame is about to be: the height reported to the parent less the
   * window's (0 outside a frame). The frame out of view keeps its old window size until it is scrolled
   * to, so a token table draws the rows the grown frame will show from the start.
   */
  function frameGrowth() {
    return reportedHeight === null ? 0 : Math.max(0, reportedHeight - window.innerHeight);
  }

  function showError(root, error) {
    api.error = String(error && error.message ? error.message : error);
    const message = `Cannot show this view: ${api.error}`;
    root.replaceChildren(el("div", { class: "bt-error", role: "alert", text: message }));
    document.body.dataset.ready = "error";
  }

  async function main() {
    const root = document.getElementById("bertology-root");
    try {
      const data = JSON.parse(document.getElementById("bertology-data").textContent);
      if (data.view === "watch") await startWatch(root, data);
      else if (data.attentionSets) await startSets(root, data);
      else await startView(root, data);
      // The first picture is drawn by now. Nothing here waits for an animation frame: a browser gives
      // none to a frame out of view (a notebook's output further down), which would stay blank.
      api.firstPaintMs = performance.now() - scriptStart;
      api.ready = true;
      document.body.dataset.ready = "1";
      reportHeight();
      window.addEventListener("resize", reportHeight);
    } catch (error) {
      showError(root, error);
    }
  }

  main();
})();
