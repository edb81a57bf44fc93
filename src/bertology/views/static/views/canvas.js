// canvas.js: Canvas helpers: a canvas sized at the device pixel ratio, text fitted to a width, the picture
// exported as PNG, downloads, SVG elements.
// Uses: MAX_CANVAS_PX, SVG_NS (contract.js); el (util.js); themeColours (colours.js).

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
