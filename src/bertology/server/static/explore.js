// The explorer page of an analysis folder (/explore?run=PATH; without ?run= it lists the analysis runs to
// open). Every text from the server (token origins, labels, paths) is inserted with textContent, never as
// markup; example views arrive as whole pages shown in sandboxed srcdoc iframes, as on the main page.
"use strict";

// $, setState and callApi come from common.js.
const SVG = "http://www.w3.org/2000/svg";
const run = new URLSearchParams(location.search).get("run"); // null: no run chosen
const LABEL_COLOURS = {
  word_pieces: "#9467bd", other_sentence: "#8c564b", same_word: "#e377c2", next: "#ff7f0e",
  previous: "#2ca02c", delimiters: "#d62728", broad: "#1f77b4", none: "#9aa0a6",
};
let analysis = null;
let selected = null; // [layer, head]
let nearest = [];
let headRequest = 0; // number of the latest head request; older answers are dropped

const number = (value, digits = 3) => (typeof value === "number" ? value.toFixed(digits) : "–");

/** The colour of every head, [layers][heads], for the choice in #colour; and the legend's text. */
function colours() {
  const choice = $("colour").value;
  if (choice === "label") {
    return analysis.labels.map((row) => row.map((label) => LABEL_COLOURS[label] || LABEL_COLOURS.none));
  }
  const grid = analysis.statistics[choice];
  const values = grid.flat().filter((value) => typeof value === "number");
  const low = Math.min(...values);
  const high = Math.max(...values);
  const span = high - low || 1;
  return grid.map((row) => row.map((value) =>
    typeof value === "number" ? `hsl(215, 75%, ${88 - (58 * (value - low)) / span}%)` : "#9aa0a6"));
}

function drawLegend() {
  const legend = $("legend");
  legend.replaceChildren();
  const choice = $("colour").value;
  if (choice === "label") {
    const present = new Set(analysis.labels.flat());
    for (const [label, colour] of Object.entries(LABEL_COLOURS)) {
      if (!present.has(label)) continue;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.backgroundColor = colour;
      legend.append(swatch, label);
    }
    return;
  }
  const values = analysis.statistics[choice].flat().filter((value) => typeof value === "number");
  legend.textContent = `${choice}: light ${number(Math.min(...values))} to dark ${number(Math.max(...values))}; grey: undefined.`;
}

function headName(layer, head) {
  return `${layer}-${head}`;
}

function drawMap(fill) {
  const svg = $("map");
  svg.replaceChildren();
  const points = analysis.map;
  const xs = points.map((point) => point[0]);
  const ys = points.map((point) => point[1]);
  const [minX, maxX, minY, maxY] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const confidence = analysis.statistics.confidence;
  points.forEach(([x, y], index) => {
    const layer = Math.floor(index / analysis.heads);
    const head = index % analysis.heads;
    const circle = document.createElementNS(SVG, "circle");
    circle.setAttribute("cx", String(30 + (580 * (x - minX)) / (maxX - minX || 1)));
    circle.setAttribute("cy", String(30 + (420 * (y - minY)) / (maxY - minY || 1)));
    const size = confidence ? confidence[layer][head] : 0.5;
    circle.setAttribute("r", String(4 + 9 * (typeof size === "number" ? size : 0)));
    circle.setAttribute("fill", fill[layer][head]);
    circle.dataset.layer = String(layer);
    circle.dataset.head = String(head);
    const title = document.createElementNS(SVG, "title");
    title.textContent = `head ${headName(layer, head)}: ${analysis.labels[layer][head]}`;
    circle.append(title);
    circle.addEventListener("click", () => selectHead(layer, head));
    svg.append(circle);
  });
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
      cell.style.backgroundColor = fill[layer][head];
      cell.textContent = choice === "label" ? label.slice(0, 4) : number(analysis.statistics[choice][layer][head], 2);
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
  fillTable($("relations"), ["relation", "direction", "accuracy", "best head (accuracy)", "baseline"],
    detail.relations.map((row) => [row.relation, row.direction === 0 ? "dependent → head" : "head → dependent",
      number(row.accuracy), `${row.best_head ?? "–"} (${number(row.best_accuracy)})`, number(row.baseline_accuracy)]));
  $("coreference-box").hidden = detail.coreference.length === 0;
  $("coreference-source").textContent = related.coreference ? `From the coreference probe in ${related.coreference}.` : "";
  fillTable($("coreference"), ["mention type", "accuracy", "rank among heads", "mentions"],
    detail.coreference.map((row) => [row.type, number(row.accuracy), String(row.rank), String(row.count)]));
  $("ablation-box").hidden = detail.ablation === null;
  if (detail.ablation !== null) {
    const entry = detail.ablation;
    $("ablation").textContent = `Removing this head changes the dev accuracy by ${number(entry.change, 4)} ` +
      `(to ${number(entry.accuracy)}; rank ${entry.rank}, 1 = hurts most)` +
      (entry.importance === null ? "" : `; importance ${number(entry.importance, 4)}`) + ` (${related.ablation}).`;
  }
}

async function showExamples(detail, request) {
  const box = $("examples");
  box.replaceChildren();
  $("examples-note").textContent = analysis.examples_per_head === 0
    ? "This analysis stored no examples (run bertology analyze again, with --examples-per-head above 0)."
    : `The segments where this head's ${detail.example_pattern} score was highest, highest first, drawn from ` +
      "the attention stored by the analysis (8-bit).";
  for (const example of detail.examples) {
    const figure = document.createElement("figure");
    figure.className = "example";
    const caption = document.createElement("figcaption");
    caption.textContent = `#${example.rank + 1}: score ${number(example.score)}, segment ${example.segment} ` +
      `(${example.origin}), ${example.tokens} tokens`;
    const frame = document.createElement("iframe");
    frame.setAttribute("sandbox", "allow-scripts allow-downloads");
    frame.title = `Head view of example ${example.rank + 1}`;
    frame.dataset.rank = String(example.rank);
    figure.append(caption, frame);
    box.append(figure);
  }
  const theme = matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  for (const frame of box.querySelectorAll("iframe")) {
    const body = { run, layer: detail.layer, head: detail.head, rank: Number(frame.dataset.rank), theme };
    const html = await callApi("/api/explore/example", body, "text");
    if (request !== headRequest) return;
    frame.srcdoc = html;
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
    option.textContent = name.startsWith("score_") ? `pattern score: ${name.slice(6)}` : name;
    select.append(option);
  }
}

/** No run chosen: the analysis runs of the runs folder, each a link to its explorer page. */
async function listAnalysisRuns() {
  $("analysis-view").hidden = true;
  $("run-picker").hidden = false;
  $("report-link").hidden = true;
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
