// tokens.js: The token table: the left token column, the line canvas and the right token column under a sticky
// header row, with hover and pinning (TokenTable).
// Uses: HEADER, LABEL_MAX, ROW, SVG_NS (contract.js); clamp, displayToken, el (util.js); themeColours
// (colours.js); canvasFont, fitText, measureContext, prepareCanvas, svgNode (canvas.js); rowCentre (lines.js).
// Refers at run time only (inside functions, once every module has run) to: FRAME_GROWS, frameGrowth
// (boot.js).

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
