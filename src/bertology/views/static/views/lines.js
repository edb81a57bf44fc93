// lines.js: Attention lines: the lines of each head bucketed by opacity, the part of them in view within a
// budget, the weight boxes of a hovered or pinned token, drawn on a canvas or written as SVG.
// Uses: LEVELS, MIN_LINE_ALPHA, ROW, THICK_LINES (contract.js); clamp, headColour, range (util.js); svgNode
// (canvas.js).

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
