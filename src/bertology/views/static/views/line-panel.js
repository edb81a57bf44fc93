// line-panel.js: The attention line panel (AttentionLines): a token table with the lines of the shown heads,
// used by the head view and by the model view's enlarged head.
// Uses: EXPORT_LINE_BUDGET, LINE_AREA, LINE_BUDGET, SEGMENT_FILTERS, api (contract.js); displayToken,
// headLabel, layerLabel, sameToken (util.js); themeColours (colours.js); FULL_BAND, focusWeights, linesNote,
// paintBoxes, strokeLines, svgBoxes, svgLines (lines.js); TokenTable (tokens.js).

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
