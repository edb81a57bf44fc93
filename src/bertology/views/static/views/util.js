// util.js: Small utilities: clamp, range, head and layer labels, element creation (el) and printable token
// text.
// Uses: HEAD_COLOURS (contract.js).
// Refers at run time only (inside functions, once every module has run) to: headPalette (colours.js).

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
