// model.js: The model view (ModelView): heatmap thumbnails of every layer and head, pooled and hatched where
// causal, and the enlarged head (DetailPanel) drawn as lines.
// Uses: GRID_LABEL, HEAT_GAMMA, SEGMENT_FILTERS, api (contract.js); clamp, el, headCaption, headColour,
// headLabel, layerLabel, range (util.js); mixRgb, paintHeadColours, rgbOf, themeColours (colours.js);
// canvasFont, fitText (canvas.js); AttentionLines (line-panel.js); button, filterControl, frame (controls.js).

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
