// head.js: The head view (HeadView), and its long-input part (LongInput: a window of a long input's top-k
// weights, the minimap and the strip of attention outside the window).
// Uses: MINIMAP_PX, SEGMENT_FILTERS (contract.js); clamp, el, range (util.js); decodeArray (decode.js);
// themeColours (colours.js); prepareCanvas (canvas.js); AttentionLines (line-panel.js); HeadPicker, button,
// checkControl, filterControl, frame, layerOptions, selectControl (controls.js).
// Refers at run time only (inside functions, once every module has run) to: heatLookup (model.js).

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
