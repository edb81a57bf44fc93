// The explorer page of an analysis folder (/explore?run=PATH; without ?run= it lists the analysis runs to
// open). Every text from the server (token origins, labels, paths) is inserted with textContent, never as
// markup; example views arrive as whole pages shown in sandboxed srcdoc iframes, as on the main page.
"use strict";

// $, setState and callApi come from common.js.
const SVG = "http://www.w3.org/2000/svg";
const run = new URLSearchParams(location.search).get("run"); // null: no run chosen
// Short label names that fit a grid cell (the legend spells each out); colours come from the server
// (analysis.label_colours), the same as the report's map.
const SHORT_LABELS = {
  word_pieces: "piece", other_sentence: "other", same_word: "same", next: "next", previous: "prev",
  delimiters: "delim", broad: "broad", none: "none",
  induction: "induct", duplicate_token: "dup", previous_token: "prev-t", sink: "sink",
};
// A decoder's scores on repeated random tokens (heads.csv's score_<detector> columns; the rest are
// the corpus patterns').
const DETECTOR_SCORES = new Set(["score_induction", "score_duplicate_token", "score_previous_token"]);
const UNDEFINED_COLOUR = "#9aa0a6";
const MAP_FONT = 11; // px of the map's head names, in viewBox units
const MAP_REACH = 6; // viewBox units from a dot's centre within which a click picks it, however small it is
let analysis = null;
let selected = null; // [layer, head]
let nearest = [];
let headRequest = 0; // number of the latest head request; older answers are dropped

const number = (value, digits = 3) => (typeof value === "number" ? value.toFixed(digits) : "–");
/** A difference with its sign (+0.120, −0.050), "–" when undefined. */
const signed = (value) => (typeof value === "number" ? `${value > 0 ? "+" : value < 0 ? "−" : ""}${Math.abs(value).toFixed(3)}` : "–");

const shortLabel = (label) => SHORT_LABELS[label] || label;

/** Black or white, whichever reads better on the colour #rrggbb (WCAG relative luminance). */
function inkOnHex(hex) {
  const channel = (start) => {
    const value = parseInt(hex.slice(start, start + 2), 16) / 255;
    return value <= 0.03928 ? value / 12.92 : ((value + 0.055) / 1.055) ** 2.4;
  };
  const luminance = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
  return luminance > 0.2 ? "#000000" : "#ffffff";
}

/** The colour of every head and the colour of text on it, [layers][heads] of {fill, ink}, for the choice
 *  in #colour. */
function colours() {
  const choice = $("colour").value;
  if (choice === "label") {
    return analysis.labels.map((row) => row.map((label) => {
      const fill = analysis.label_colours[label] || UNDEFINED_COLOUR;
      return { fill, ink: inkOnHex(fill) };
    }));
  }
  const grid = analysis.statistics[choice];
  const values = grid.flat().filter((value) => typeof value === "number");
  const low = Math.min(...values);
  const high = Math.max(...values);
  const span = high - low || 1;
  return grid.map((row) => row.map((value) => {
    if (typeof value !== "number") return { fill: UNDEFINED_COLOUR, ink: "#000000" };
    const lightness = 88 - (58 * (value - low)) / span;
    return { fill: `hsl(215, 75%, ${lightness}%)`, ink: lightness < 55 ? "#ffffff" : "#000000" };
  }));
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  const choice = $("colour").value;
  if (choice === "label") {
    for (const [label, colour] of Object.entries(analysis.label_colours)) {
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.backgroundColor = colour;
      const description = (analysis.label_descriptions[label] || label).replace(`${label}: `, "");
      const item = document.createElement("span");
      item.className = "legend-item";
      item.append(swatch, `${shortLabel(label)}: ${description}`);
      legend.append(item);
    }
    return;
  }
  const values = analysis.statistics[choice].flat().filter((value) => typeof value === "number");
  legend.textContent = `${choice}: light ${number(Math.min(...values))} to dark ${number(Math.max(...values))}; grey: undefined.`;
}

function headName(layer, head) {
  return `${layer}-${head}`;
}

/** Head names beside the map's dots where they overlap no dot, no other name and stay inside the map:
 *  the heads with a label first, then the rest. points: [{x, y, r, name, labelled}]. */
function placeMapNames(svg, points) {
  const taken = [];
  const overlaps = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
  const hitsDot = (box) => points.some((point) => {
    const nearestX = Math.max(box.x0, Math.min(point.x, box.x1));
    const nearestY = Math.max(box.y0, Math.min(point.y, box.y1));
    return (nearestX - point.x) ** 2 + (nearestY - point.y) ** 2 < point.r ** 2;
  });
  const order = [...points].sort((a, b) => Number(b.labelled) - Number(a.labelled));
  for (const point of order) {
    const width = 0.62 * MAP_FONT * point.name.length;
    const height = 1.25 * MAP_FONT; // the text's ascent and descent
    const gap = point.r + 2;
    const spots = [
      [point.x + gap, point.y - height / 2], [point.x - gap - width, point.y - height / 2],
      [point.x - width / 2, point.y - gap - height], [point.x - width / 2, point.y + gap],
    ];
    for (const [x0, y0] of spots) {
      const box = { x0, y0, x1: x0 + width, y1: y0 + height };
      if (box.x0 < 0 || box.y0 < 0 || box.x1 > 640 || box.y1 > 480) continue;
      if (taken.some((other) => overlaps(box, other)) || hitsDot(box)) continue;
      taken.push(box);
      const text = document.createElementNS(SVG, "text");
      text.setAttribute("x", x0.toFixed(1));
      text.setAttribute("y", (y0 + MAP_FONT).toFixed(1)); // the baseline
      text.setAttribute("font-size", String(MAP_FONT));
      text.dataset.layer = point.layer;
      text.dataset.head = point.head;
      text.textContent = point.name;
      svg.append(text);
      break;
    }
  }
}

/** The map's dots, [{x, y, r, name, labelled, layer, head}] in viewBox units: each dot's radius is its
 *  confidence's size (4 to 13), at most half the distance to the nearest other dot, so no two dots overlap
 *  however many heads the model has. */
function mapDots() {
  const points = analysis.map;
  const xs = points.map((point) => point[0]);
  const ys = points.map((point) => point[1]);
  const [minX, maxX, minY, maxY] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const confidence = analysis.statistics.confidence;
  const dots = points.map(([x, y], index) => {
    const layer = Math.floor(index / analysis.heads);
    const head = index % analysis.heads;
    const size = confidence ? confidence[layer][head] : 0.5;
    return {
      x: 30 + (580 * (x - minX)) / (maxX - minX || 1), y: 30 + (420 * (y - minY)) / (maxY - minY || 1),
      r: 4 + 9 * (typeof size === "number" ? size : 0), name: headName(layer, head),
      labelled: analysis.labels[layer][head] !== "none", layer: String(layer), head: String(head),
    };
  });
  for (const dot of dots) {
    let nearest = Infinity;
    for (const other of dots) {
      if (other !== dot) nearest = Math.min(nearest, Math.hypot(other.x - dot.x, other.y - dot.y));
    }
    dot.r = Math.max(0, Math.min(dot.r, nearest / 2 - 0.01)); // 0.01: the attributes' rounding
  }
  return dots;
}

/** The head whose dot's centre is nearest the click, if the click is on that dot (or within MAP_REACH of
 *  its centre, for the smallest dots): the head under the pointer, whatever was drawn last. */
function clickMap(event, svg, dots) {
  const point = svg.createSVGPoint();
  point.x = event.clientX;
  point.y = event.clientY;
  const { x, y } = point.matrixTransform(svg.getScreenCTM().inverse());
  let best = null;
  let bestDistance = Infinity;
  for (const dot of dots) {
    const distance = Math.hypot(dot.x - x, dot.y - y);
    if (distance < bestDistance) [best, bestDistance] = [dot, distance];
  }
  if (best !== null && bestDistance <= Math.max(best.r, MAP_REACH)) selectHead(Number(best.layer), Number(best.head));
}

function drawMap(fill) {
  const svg = $("map");
  svg.replaceChildren();
  const placed = mapDots();
  svg.onclick = (event) => clickMap(event, svg, placed);
  placed.forEach((dot) => {
    const [layer, head] = [Number(dot.layer), Number(dot.head)];
    const circle = document.createElementNS(SVG, "circle");
    circle.setAttribute("cx", dot.x.toFixed(2));
    circle.setAttribute("cy", dot.y.toFixed(2));
    circle.setAttribute("r", dot.r.toFixed(2));
    circle.setAttribute("fill", fill[layer][head].fill);
    circle.dataset.layer = String(layer);
    circle.dataset.head = String(head);
    const title = document.createElementNS(SVG, "title");
    title.textContent = `head ${headName(layer, head)}: ${analysis.labels[layer][head]}`;
    circle.append(title);
    svg.append(circle);
  });
  placeMapNames(svg, placed);
}

function drawGrid(fill) {
  const table = $("grid");
  table.replaceChildren();
  const header = table.createTHead().insertRow();
  header.append(document.createElement("th"));
  for (let head = 0; head < analysis.heads; head += 1) {
    const cell = document.createElement("th");
    cell.textContent = String(head);
    header.append(cell);
  }
  const body = table.createTBody();
  const choice = $("colour").value;
  analysis.labels.forEach((row, layer) => {
    const line = body.insertRow();
    const name = document.createElement("th");
    name.textContent = String(layer);
    line.append(name);
    row.forEach((label, head) => {
      const cell = line.insertCell();
      cell.style.backgroundColor = fill[layer][head].fill;
      cell.style.color = fill[layer][head].ink;
      cell.textContent = choice === "label" ? shortLabel(label) : number(analysis.statistics[choice][layer][head], 2);
      cell.title = `head ${headName(layer, head)}: ${label}`;
      cell.dataset.layer = String(layer);
      cell.dataset.head = String(head);
      cell.addEventListener("click", () => selectHead(layer, head));
    });
  });
}

function redraw() {
  const fill = colours();
  drawLegend();
  drawMap(fill);
  drawGrid(fill);
  markSelection();
}

function markSelection() {
  const near = new Set(nearest.map((entry) => headName(entry.layer, entry.head)));
  for (const element of document.querySelectorAll("#map circle, #grid td")) {
    const name = headName(element.dataset.layer, element.dataset.head);
    const isSelected = selected !== null && name === headName(...selected);
    element.classList.toggle("selected", isSelected);
    element.classList.toggle("near", near.has(name));
    if (isSelected && element.tagName.toLowerCase() === "circle") element.parentNode.append(element);
  }
}

function fillTable(table, columns, rows) {
  table.replaceChildren();
  const header = table.createTHead().insertRow();
  for (const column of columns) {
    const cell = document.createElement("th");
    cell.textContent = column;
    header.append(cell);
  }
  const body = table.createTBody();
  for (const row of rows) {
    const line = body.insertRow();
    for (const value of row) line.insertCell().textContent = value;
  }
}

function headButton(layer, head, text) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "head-link";
  button.textContent = text;
  button.addEventListener("click", () => selectHead(layer, head));
  return button;
}

function showDetail(detail) {
  $("head-title").textContent = `Head ${headName(detail.layer, detail.head)} (layer ${detail.layer}, head ${detail.head})`;
  const description = analysis.label_descriptions[detail.label] || "";
  $("head-label").textContent = `Label: ${detail.label}${description ? ` (${description})` : ""}.`;
  fillTable($("head-stats"), ["statistic", "value"],
    Object.entries(detail.statistics).map(([name, value]) => [name, number(value)]));
  const list = $("nearest");
  list.replaceChildren();
  for (const entry of detail.nearest) {
    const item = document.createElement("li");
    item.append(headButton(entry.layer, entry.head, headName(entry.layer, entry.head)),
      ` ${entry.label}, ${number(entry.divergence)} nats`);
    list.append(item);
  }
  const related = analysis.related;
  $("relations-box").hidden = detail.relations.length === 0;
  $("relations-source").textContent = related.dependency ? `From the dependency probe in ${related.dependency}.` : "";
  fillTable($("relations"), ["relation", "direction", "accuracy", "baseline", "gain over baseline", "best head (accuracy)"],
    detail.relations.map((row) => [row.relation, row.direction === 0 ? "dependent → head" : "head → dependent",
      number(row.accuracy), number(row.baseline_accuracy), signed(row.gain), `${row.best_head ?? "–"} (${number(row.best_accuracy)})`]));
  $("coreference-box").hidden = detail.coreference.length === 0;
  $("coreference-source").textContent = related.coreference ? `From the coreference probe in ${related.coreference}.` : "";
  fillTable($("coreference"), ["mention type", "accuracy", "rank among heads", "mentions"],
    detail.coreference.map((row) => [row.type, number(row.accuracy), String(row.rank), String(row.count)]));
  $("ablation-box").hidden = detail.ablation === null;
  if (detail.ablation !== null) {
    const entry = detail.ablation;
    const sameModel = related.ablation_same_model;
    $("ablation-title").textContent = sameModel ? "Ablation" : "Ablation of another model";
    const rank = entry.rank === null
      ? "every head's removal changes it alike, so no head ranks above another"
      : `rank ${entry.rank} of ${analysis.layers * analysis.heads}, 1 = hurts most`;
    const whose = sameModel ? "this head" : `head ${headName(detail.layer, detail.head)} of that model`;
    $("ablation-model").textContent = sameModel ? "" : `Measured on ${related.ablation_model || "a model " +
      "the ablation does not name"}, not on this analysis's ${analysis.summary.model || "model"}: its heads ` +
      "are that model's (say, a classifier fine-tuned from this one), not these.";
    $("ablation").textContent = `Removing ${whose} changes the dev accuracy by ${number(entry.change, 4)} ` +
      `(to ${number(entry.accuracy)}; ${rank})` +
      (entry.importance === null ? "" : `; importance ${number(entry.importance, 4)}`) + ` (${related.ablation}).`;
  }
  $("patching-box").hidden = detail.patching === null;
  if (detail.patching !== null) {
    const entry = detail.patching;
    const ablated = entry.ablation === "counterfactual" ? "" : `, ${entry.ablation} ablation`;
    $("patching").textContent = `Patching this head (${entry.direction}, ${entry.method}${ablated}) has effect ` +
      `${number(entry.effect, 3)} (1: restores all of the clean behaviour; rank ${entry.rank} of ` +
      `${analysis.layers * analysis.heads}, 1 = largest by size, either sign) (${related.patching}).`;
  }
  $("circuit-box").hidden = detail.circuit === null;
  if (detail.circuit !== null) {
    const entry = detail.circuit;
    const kinds = { q: "query", k: "key", v: "value", "": "" };
    $("circuit-source").textContent = `The head's strongest edges of the ${entry.edges} the circuit run in ` +
      `${related.circuit} ranked by |score| (${entry.method}); rank 1 = largest, a circuit of n edges holds ` +
      "ranks 1 to n.";
    fillTable($("circuit-in"), ["from", "into", "score", "rank"],
      entry.into.map((edge) => [edge.node, kinds[edge.kind], signed(edge.score), String(edge.rank)]));
    fillTable($("circuit-out"), ["to", "its input", "score", "rank"],
      entry.out.map((edge) => [edge.node, kinds[edge.kind], signed(edge.score), String(edge.rank)]));
  }
}

/** The head view of a head's example `rank` in a new sandboxed frame appended to `box`; resolves once
 *  its page has arrived (not for an answer to an older head request). */
async function loadExample(box, detail, rank, request) {
  const frame = document.createElement("iframe");
  frame.setAttribute("sandbox", "allow-scripts allow-downloads");
  frame.title = `Head view of example ${rank + 1}`;
  frame.dataset.rank = String(rank);
  box.append(frame);
  const theme = matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  const body = { run, layer: detail.layer, head: detail.head, rank, theme };
  const html = await callApi("/api/explore/example", body, "text");
  if (request === headRequest) frame.srcdoc = html;
}

/** The head's first example drawn at once; the others as closed <details>, each drawn when opened. */
async function showExamples(detail, request) {
  const box = $("examples");
  box.replaceChildren();
  $("examples-note").textContent = analysis.examples_per_head === 0
    ? "This analysis stored no examples (run bertology analyze again, with --examples-per-head above 0)."
    : `The segments where this head's ${detail.example_pattern} score was highest, highest first, drawn from ` +
      "the attention stored by the analysis (8-bit). The first is shown; open another to draw it.";
  let first = null;
  for (const example of detail.examples) {
    const caption = `#${example.rank + 1}: score ${number(example.score)}, segment ${example.segment} ` +
      `(${example.origin}), ${example.tokens} tokens`;
    const item = document.createElement("details");
    item.className = "example";
    item.dataset.rank = String(example.rank);
    const summary = document.createElement("summary");
    summary.textContent = caption;
    item.append(summary);
    item.addEventListener("toggle", () => {
      if (item.open && !item.querySelector("iframe")) {
        loadExample(item, detail, example.rank, request).catch((error) => setState("error", error.message));
      }
    });
    box.append(item);
    if (first === null) first = item;
  }
  if (first !== null) {
    await loadExample(first, detail, Number(first.dataset.rank), request);
    first.open = true; // its toggle event finds the frame already there
  }
}

async function selectHead(layer, head) {
  const request = ++headRequest;
  selected = [layer, head];
  setState("busy", `Loading head ${headName(layer, head)}…`);
  try {
    const detail = await callApi("/api/explore/head", { run, layer, head });
    if (request !== headRequest) return;
    nearest = detail.nearest;
    markSelection();
    showDetail(detail);
    $("head-panel").hidden = false;
    const top = $("head-panel").getBoundingClientRect().top;
    if (top < 0 || top > innerHeight * 0.6) $("head-panel").scrollIntoView({ block: "start" });
    await showExamples(detail, request);
    if (request === headRequest) setState("ready", "");
  } catch (error) {
    if (request === headRequest) setState("error", error.message);
  }
}

function sizeFrames(event) {
  const height = Number(event.data && event.data.bertologyHeight);
  if (!(height > 0)) return;
  for (const frame of document.querySelectorAll("#examples iframe")) {
    if (frame.contentWindow === event.source) frame.style.height = `${Math.min(Math.ceil(height), 2400)}px`;
  }
}

function showSummary() {
  const list = $("summary");
  list.replaceChildren();
  for (const [key, value] of Object.entries({ folder: analysis.path || "(the runs folder)", ...analysis.summary })) {
    const entry = document.createElement("div");
    const term = document.createElement("dt");
    term.textContent = key;
    const description = document.createElement("dd");
    description.textContent = String(value);
    entry.append(term, description);
    list.append(entry);
  }
  const select = $("colour");
  const label = document.createElement("option");
  label.value = "label";
  label.textContent = "pattern label";
  select.append(label);
  for (const name of Object.keys(analysis.statistics)) {
    const option = document.createElement("option");
    option.value = name;
    const kind = DETECTOR_SCORES.has(name) ? "detector score" : "pattern score";
    option.textContent = name.startsWith("score_") ? `${kind}: ${name.slice(6)}` : name;
    select.append(option);
  }
}

/** No run chosen: the analysis runs of the runs folder, each a link to its explorer page. */
async function listAnalysisRuns() {
  $("analysis-view").hidden = true;
  $("run-picker").hidden = false;
  $("report-item").hidden = true;
  try {
    const answer = await callApi("/api/runs");
    const analyses = answer.runs.filter((entry) => entry.explore);
    $("run-picker-root").textContent = !answer.root
      ? "No runs folder (start the server with --runs DIR to explore `bertology analyze` outputs)."
      : analyses.length
        ? `Analysis runs in ${answer.root}; open one to explore its heads:`
        : `No analysis runs in ${answer.root} yet (bertology analyze CORPUS -o ${answer.root}/NAME).`;
    $("run-picker-list").replaceChildren(...analyses.map((entry) => {
      const item = document.createElement("li");
      const link = document.createElement("a");
      link.href = entry.explore;
      link.textContent = entry.path || "(the runs folder itself)";
      item.append(link);
      return item;
    }));
    setState("idle", "");
  } catch (error) {
    setState("error", `Could not list the runs: ${error.message}`);
  }
}

async function start() {
  if (run === null) {
    await listAnalysisRuns();
    return;
  }
  addEventListener("message", sizeFrames);
  $("colour").addEventListener("change", redraw);
  $("report-link").href = `/runs/${run.split("/").map(encodeURIComponent).join("/")}${run ? "/" : ""}report.html`;
  try {
    analysis = await callApi("/api/explore/analysis", { run });
    document.title = `bertology explorer: ${analysis.summary.model || run}`;
    showSummary();
    redraw();
    setState("idle", "");
  } catch (error) {
    setState("error", `Could not open the analysis: ${error.message}`);
  }
}

start();
