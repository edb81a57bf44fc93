// The bertology web app page. Every text from the user, a model or the server is inserted with
// textContent (never as markup); views arrive as whole pages shown in a sandboxed srcdoc iframe.
"use strict";

// $, setState and callApi come from common.js.
let models = [];
let shown = null; // the input whose view and statistics are on the page
let viewRequest = 0; // number of the latest view request; older answers are dropped
let statistics = null;

function fillNumbers(select, count, keep) {
  select.replaceChildren();
  for (let index = 0; index < count; index += 1) {
    const option = document.createElement("option");
    option.value = String(index);
    option.textContent = String(index);
    select.append(option);
  }
  select.value = String(Math.min(keep, count - 1));
}

function currentModel() {
  return models.find((model) => model.name === $("model").value) || models[0];
}

function onModelChange() {
  const model = currentModel();
  fillNumbers($("layer"), model.layers, Number($("layer").value) || 0);
  fillNumbers($("head"), model.heads, Number($("head").value) || 0);
}

function readInput() {
  const textB = $("text-b").value;
  return {
    model: $("model").value,
    text: $("text").value,
    text_b: textB.trim() === "" ? null : textB,
    weights: $("weights").value,
  };
}

async function showView() {
  const number = ++viewRequest;
  const body = {
    ...shown,
    view: $("view").value,
    layer: Number($("layer").value),
    head: Number($("head").value),
    theme: matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light",
  };
  setState("busy", "Computing the view…");
  try {
    const html = await callApi("/api/view", body, "text");
    if (number !== viewRequest) return;
    $("view-frame").srcdoc = html;
    $("view-frame").hidden = false;
    $("view-frame").dataset.view = body.view;
    $("view-frame").dataset.layer = String(body.layer);
    setState("ready", "");
  } catch (error) {
    if (number === viewRequest) setState("error", error.message);
  }
}

function statisticNames(answer) {
  return [
    ...Object.keys(answer.surface).map((name) => ["surface", name]),
    ...Object.keys(answer.patterns).map((name) => ["patterns", name]),
    ["labels", "label"],
  ];
}

const STATISTIC_GROUPS = { surface: "Surface statistics", patterns: "Pattern scores", labels: "Labels" };

/**
 * The statistic picker: one group per kind, each option named and described (answer.descriptions). A
 * pattern score shows its description alone ("score of the label next (next word)"), so that the surface
 * statistic "next" (attention to the next token) and the label "next" (the next word) read apart.
 */
function fillStatisticChoice(answer) {
  const select = $("statistic");
  const keep = select.value;
  select.replaceChildren();
  const groups = {};
  for (const [group, name] of statisticNames(answer)) {
    if (!groups[group]) {
      groups[group] = document.createElement("optgroup");
      groups[group].label = STATISTIC_GROUPS[group];
      select.append(groups[group]);
    }
    const option = document.createElement("option");
    option.value = `${group}:${name}`;
    const description = answer.descriptions[group][name];
    option.textContent = !description ? name : group === "patterns" ? description : `${name}: ${description}`;
    groups[group].append(option);
  }
  if ([...select.options].some((option) => option.value === keep)) select.value = keep;
}

function drawTable() {
  const [group, name] = $("statistic").value.split(":");
  const grid = group === "labels" ? statistics.labels : statistics[group][name];
  const numbers = grid.flat().filter((value) => typeof value === "number");
  const top = Math.max(1e-9, ...numbers.map(Math.abs));
  const table = $("stat-table");
  table.replaceChildren();
  const header = table.createTHead().insertRow();
  header.append(document.createElement("th"));
  for (let head = 0; head < statistics.heads; head += 1) {
    const cell = document.createElement("th");
    cell.textContent = String(head);
    header.append(cell);
  }
  const body = table.createTBody();
  grid.forEach((row, layer) => {
    const line = body.insertRow();
    const label = document.createElement("th");
    label.textContent = String(layer);
    line.append(label);
    for (const value of row) {
      const cell = line.insertCell();
      if (typeof value === "number") {
        cell.textContent = value.toFixed(3);
        cell.style.backgroundColor = `rgba(26, 95, 180, ${(0.6 * Math.abs(value)) / top})`;
      } else {
        cell.textContent = value === null ? "–" : String(value);
      }
    }
  });
}

function showTokens(answer) {
  const list = $("tokens");
  list.replaceChildren();
  answer.tokens.forEach((token, index) => {
    const item = document.createElement("li");
    item.textContent = token;
    item.className = answer.segments[index] === 1 ? "token segment-b" : "token";
    list.append(item);
  });
}

async function showStatistics() {
  try {
    statistics = await callApi("/api/statistics", shown);
    fillStatisticChoice(statistics);
    drawTable();
    showTokens(statistics);
    $("stats").hidden = false;
  } catch (error) {
    $("stats").hidden = true;
    setState("error", error.message);
  }
}

function onSubmit(event) {
  event.preventDefault();
  shown = readInput();
  $("shown-model").textContent = shown.model;
  $("shown-text").textContent = shown.text_b === null ? shown.text : `${shown.text} | ${shown.text_b}`;
  $("shown").hidden = false;
  showView();
  showStatistics();
}

function listRuns(answer) {
  $("runs-root").textContent = answer.root
    ? `Reports and training runs in ${answer.root}:`
    : "No runs folder (start the server with --runs DIR to browse reports and training runs).";
  const list = $("runs-list");
  list.replaceChildren();
  for (const run of answer.runs) {
    const item = document.createElement("li");
    const link = document.createElement("a");
    link.href = run.url;
    link.target = "_blank";
    link.rel = "noopener noreferrer";
    link.textContent = run.path || "(the runs folder itself)";
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = run.kind;
    item.append(link, " ", kind);
    if (run.model) {
      const model = document.createElement("span");
      model.className = "model";
      model.textContent = run.model;
      item.append(" · ", model);
    }
    if (run.explore) {
      const explore = document.createElement("a");
      explore.href = run.explore;
      explore.className = "explore";
      explore.textContent = "explore";
      item.append(" · ", explore);
    }
    for (const [name, url] of Object.entries(run.links || {})) {
      const other = document.createElement("a");
      other.href = url;
      other.target = "_blank";
      other.rel = "noopener noreferrer";
      other.className = "run-link";
      other.textContent = name;
      item.append(" · ", other);
    }
    list.append(item);
  }
  if (answer.root && answer.runs.length === 0) $("runs-root").textContent += " none yet.";
}

// A long input's head view asks for its window's full-resolution rows ({bertologyBlock}); the sandboxed
// page cannot fetch, so the app asks the API and hands the block back ({bertologyBlockAnswer}).
async function answerBlock(event) {
  const frame = $("view-frame");
  const ask = event.source === frame.contentWindow && event.data && event.data.bertologyBlock;
  if (!ask || !shown) return;
  try {
    const body = { ...shown, layer: ask.layer, rows: ask.rows, keys: ask.keys };
    const answer = await callApi("/api/attention", body);
    const block = { layer: ask.layer, rows: answer.rows, keys: answer.keys, attention: answer.attention[0] };
    if (event.source === frame.contentWindow) frame.contentWindow.postMessage({ bertologyBlockAnswer: block }, "*");
  } catch (error) {
    setState("error", error.message);
  }
}

async function start() {
  addEventListener("message", answerBlock);
  $("input-form").addEventListener("submit", onSubmit);
  $("model").addEventListener("change", onModelChange);
  for (const id of ["view", "layer", "head"]) {
    $(id).addEventListener("change", () => shown && showView());
  }
  $("statistic").addEventListener("change", drawTable);
  try {
    const answer = await callApi("/api/models");
    models = answer.models;
    for (const model of models) {
      const option = document.createElement("option");
      option.value = model.name;
      option.textContent = `${model.name} (${model.layers} layers × ${model.heads} heads)`;
      $("model").append(option);
    }
    $("model").value = answer.default;
    onModelChange();
    listRuns(await callApi("/api/runs"));
    const search = await callApi("/api/search/info", {});
    $("search-item").hidden = !search.available;
    setState("idle", "");
  } catch (error) {
    setState("error", `Could not reach the server: ${error.message}`);
  }
}

start();
