"use strict";
// The circuit page (bertology.report.circuit): draws the graph of the data block at the slider's size, and
// a clicked node's edges and (a head's) attention. Every name and token is inserted as text.
(() => {
  const root = document.getElementById("circuit");
  const data = JSON.parse(document.getElementById("circuit-data").textContent);
  const graph = data.graph;
  const ROW = 26;
  const MARGIN = 24;
  const TOP = 40;  // room for the layers' labels
  const SHOWN_EDGES = 5;
  const KIND_OFFSET = { q: -4, k: 0, v: 4, ".": 0 };
  const KIND_NAME = { q: "query", k: "key", v: "value", ".": "" };
  const total = graph.scores.length;
  const largest = total ? Math.abs(graph.scores[0]) || 1 : 1;
  // Columns as wide as the box allows (22 to 80 px): input, then per layer its heads and its MLP, logits.
  const lastColumn = Math.max(1, ...graph.nodes.map((node) => node[1]));
  const available = document.getElementById("graph-box").clientWidth - 2 * MARGIN;
  const COLUMN = Math.max(22, Math.min(80, Math.floor(available / lastColumn)));
  const nodes = graph.nodes.map(([name, column, row]) => ({
    name,
    x: MARGIN + column * COLUMN,
    y: TOP + row * ROW,
    head: /^a(\d+)\.h(\d+)$/.exec(name),
  }));
  // The heads an edge's input belongs to: a key or value input is its key/value head's (its node named as
  // that head, a5.h1 for a5.h1<k>), read by graph.groups query heads under grouped-query attention.
  const GROUPS = graph.groups || 1;
  const nodeIndex = new Map(nodes.map((node, index) => [node.name, index]));
  const readers = graph.downstream.map((down, i) => {
    const head = nodes[down].head;
    const kind = graph.kinds[i];
    if (GROUPS === 1 || !head || (kind !== "k" && kind !== "v")) return [down];
    const first = Number(head[2]) * GROUPS;
    const found = [];
    for (let h = first; h < first + GROUPS; h += 1) {
      const index = nodeIndex.get(`a${head[1]}.h${h}`);
      if (index !== undefined) found.push(index);
    }
    return found.length ? found : [down];
  });
  const width = 2 * MARGIN + lastColumn * COLUMN;
  const height = TOP + MARGIN + Math.max(0, graph.heads - 1) * ROW;
  const canvas = document.getElementById("edges");
  const context = canvas.getContext("2d");
  const ratio = window.devicePixelRatio || 1;
  const box = document.getElementById("graph");
  box.style.width = `${width}px`;
  box.style.height = `${height}px`;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;

  const el = (tag, text, className) => {
    const element = document.createElement(tag);
    if (text !== undefined) element.textContent = text;
    if (className) element.className = className;
    return element;
  };
  const number = (value, digits = 3) => (value === null || value === undefined ? "–" : value.toFixed(digits));

  function shortLabel(node) {
    if (node.head) return node.head[2];
    if (node.name === "input") return "in";
    if (node.name === "logits") return "out";
    return "m";
  }

  for (let layer = 0; layer < graph.layers; layer += 1) {
    const label = el("span", layer === 0 ? "layer 0" : String(layer), "layer-label");
    label.style.left = `${MARGIN + (1 + 2 * layer) * COLUMN}px`;
    box.append(label);
  }

  const buttons = nodes.map((node, index) => {
    const button = el("button", shortLabel(node), node.head ? "node" : "node mlp");
    button.type = "button";
    button.title = node.name;
    button.setAttribute("aria-label", node.name);
    button.dataset.node = node.name;
    button.style.left = `${node.x}px`;
    button.style.top = `${node.y}px`;
    button.addEventListener("click", () => select(index));
    box.append(button);
    return button;
  });

  const slider = document.getElementById("size");
  slider.max = String(data.sizes.length - 1);
  slider.value = String(data.opening);
  let count = 0;  // the circuit's edges: the first `count` by |score|
  let drawnCount = 0;  // of those, the strongest data.mostDrawn are drawn
  let selected = null;

  function colour(score, alpha) {
    return score >= 0 ? `rgba(214, 39, 40, ${alpha})` : `rgba(31, 119, 180, ${alpha})`;
  }

  function draw() {
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    const touched = new Uint8Array(nodes.length);
    for (let i = 0; i < count; i += 1) {
      touched[graph.upstream[i]] = 1;
      for (const reader of readers[i]) touched[reader] = 1;
    }
    let drawn = 0;
    for (let i = drawnCount - 1; i >= 0; i -= 1) {  // the strongest last, on top
      const up = nodes[graph.upstream[i]];
      const down = nodes[readers[i][0]];
      const score = graph.scores[i];
      const size = Math.abs(score) / largest;
      // into the middle of the heads that read the input
      const middleY = readers[i].reduce((sum, reader) => sum + nodes[reader].y, 0) / readers[i].length;
      const end = middleY + KIND_OFFSET[graph.kinds[i]];
      const middle = (up.x + down.x) / 2;
      context.lineWidth = 0.5 + 3.5 * size;
      context.strokeStyle = colour(score, 0.25 + 0.65 * size);
      context.beginPath();
      context.moveTo(up.x, up.y);
      context.bezierCurveTo(middle, up.y, middle, end, down.x - 8, end);
      context.stroke();
      drawn += 1;
    }
    buttons.forEach((button, index) => button.classList.toggle("out", !touched[index]));
    root.dataset.drawnEdges = String(drawn);
  }

  function setSize() {
    const stop = data.sizes[Number(slider.value)];
    count = Math.min(stop.edges, total);
    drawnCount = Math.min(count, data.mostDrawn);
    document.getElementById("size-text").textContent =
      `${stop.percent}% of the edges: the ${count} of ${total} of largest |score|` +
      (drawnCount < count ? ` (the strongest ${drawnCount} drawn)` : "");
    document.getElementById("faithfulness").textContent =
      `Faithfulness at this size: ${number(stop.faithfulness)} (${data.method}); ` +
      `a random ranking's: ${number(stop.random)}.`;
    root.dataset.percent = String(stop.percent);
    draw();
    if (selected !== null) select(selected);
  }

  function edgeRows(body, edges, into) {
    body.replaceChildren();
    for (const i of edges) {
      const row = el("tr");
      const other = nodes[into ? graph.upstream[i] : graph.downstream[i]].name;
      let kind = KIND_NAME[graph.kinds[i]];
      if (readers[i].length > 1 || readers[i][0] !== graph.downstream[i]) {  // a shared key or value
        const input = `${nodes[graph.downstream[i]].name}<${graph.kinds[i]}>`;
        kind += ` (${input}, read by ${readers[i].map((reader) => nodes[reader].name).join(", ")})`;
      }
      row.append(el("td", other), el("td", kind));
      row.append(el("td", graph.scores[i].toPrecision(4), "num"), el("td", String(i + 1), "num"));
      body.append(row);
    }
    if (!edges.length) {
      const cell = el("td", "none in the circuit at this size");
      cell.colSpan = 4;
      const row = el("tr");
      row.append(cell);
      body.append(row);
    }
  }

  const decoded = {};
  function codes(which) {
    if (!decoded[which]) {
      const text = atob(data.attention[which].codes);
      const bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i += 1) bytes[i] = text.charCodeAt(i);
      decoded[which] = bytes;
    }
    return decoded[which];
  }

  function heatmap(which, label, layer, head) {
    const input = data.attention[which];
    const [layers, heads, n] = input.shape;
    const figure = el("figure");
    figure.dataset.input = which;
    if (layer >= layers || head >= heads) {
      figure.append(el("figcaption", `${label}: the embedded attention has no head a${layer}.h${head}.`));
      return figure;
    }
    const cell = Math.max(3, Math.min(18, Math.floor(280 / n)));
    const map = el("canvas");
    map.width = n * cell;
    map.height = n * cell;
    const paint = map.getContext("2d");
    paint.fillStyle = "#ffffff";
    paint.fillRect(0, 0, map.width, map.height);
    const all = codes(which);
    const start = (layer * heads + head) * n * n;
    for (let query = 0; query < n; query += 1) {
      for (let key = 0; key < n; key += 1) {
        const p = all[start + query * n + key] / 255;
        paint.fillStyle = `rgba(26, 95, 180, ${p})`;
        paint.fillRect(key * cell, query * cell, cell, cell);
      }
    }
    const readout = el("p", "Point at a cell: query token → key token, weight.", "muted");
    map.addEventListener("mousemove", (event) => {
      const bounds = map.getBoundingClientRect();
      const key = Math.floor((event.clientX - bounds.left) / cell);
      const query = Math.floor((event.clientY - bounds.top) / cell);
      if (key < 0 || query < 0 || key >= n || query >= n) return;
      const p = all[start + query * n + key] / 255;
      readout.textContent = `${query} ${input.tokens[query]} → ${key} ${input.tokens[key]}: ${p.toFixed(3)}`;
    });
    const tokens = el("ol");
    tokens.start = 0;
    for (const token of input.tokens) tokens.append(el("li", token));
    figure.append(
      el("figcaption", `${label} input, head a${layer}.h${head}: rows are queries, columns keys`),
      map,
      readout,
      tokens,
    );
    return figure;
  }

  function select(index) {
    selected = index;
    const node = nodes[index];
    buttons.forEach((button, i) => button.classList.toggle("selected", i === index));
    document.getElementById("node-box").hidden = false;
    document.getElementById("node-title").textContent = node.name;
    const into = [];
    const out = [];
    for (let i = 0; i < count; i += 1) {
      if (readers[i].includes(index) && into.length < SHOWN_EDGES) into.push(i);
      if (graph.upstream[i] === index && out.length < SHOWN_EDGES) out.push(i);
    }
    edgeRows(document.getElementById("edges-in"), into, true);
    edgeRows(document.getElementById("edges-out"), out, false);
    const attention = document.getElementById("attention-box");
    const note = document.getElementById("attention-note");
    attention.replaceChildren();
    if (!node.head) {
      note.textContent = "";
      root.dataset.attention = "";
    } else if (!data.attention) {
      note.textContent = "This page embeds no attention (it was written without a clean and a corrupted input).";
      root.dataset.attention = "none";
    } else {
      const layer = Number(node.head[1]);
      const head = Number(node.head[2]);
      note.textContent = "The head's attention on the first pair:";
      attention.append(heatmap("clean", "Clean", layer, head), heatmap("corrupted", "Corrupted", layer, head));
      root.dataset.attention = "shown";
    }
    root.dataset.selected = node.name;
  }

  slider.addEventListener("input", setSize);
  setSize();
  root.dataset.state = "ready";
})();
