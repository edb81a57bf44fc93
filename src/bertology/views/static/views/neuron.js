// neuron.js: The neuron view (NeuronView): q, k, q × k, q·k and softmax of one query token, cells painted by
// colour ramp.
// Uses: ROW, SEGMENT_FILTERS, api (contract.js); clamp, displayToken, el, headCaption, layerLabel, range
// (util.js); halfSlice (decode.js); divergingRamp, themeColours (colours.js); FULL_BAND, rowCentre, rowsInBand
// (lines.js); TokenTable (tokens.js); filterControl, frame, headOptions, layerOptions, selectControl
// (controls.js).

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
