// Corpus search on the explorer page (bertology serve --index DIR): the tokens of a typed input, and for
// a clicked token its nearest corpus tokens; any corpus token listed (a word search's hit, a neighbour)
// can be clicked to become the query in turn. Every text from the server goes in with textContent.
"use strict";

(() => {
  const byId = (id) => document.getElementById(id);  // callApi comes from common.js
  let tokens = [];

  const layer = () => Number(byId("search-layer").value);
  const status = (text) => { byId("search-status").textContent = text; };

  function showFound(answer) {
    const list = byId("neighbours");
    list.replaceChildren();
    for (const item of answer.neighbours) {
      const entry = document.createElement("li");
      entry.className = "neighbour";
      const head = document.createElement("div");
      const similarity = typeof item.similarity === "number" ? ` · similarity ${item.similarity.toFixed(3)}` : "";
      const token = document.createElement("button");
      token.type = "button";
      token.className = "corpus-token";
      token.title = "Search the corpus tokens nearest to this one";
      token.textContent = item.token;
      token.addEventListener("click", () => searchCorpusToken(item));
      head.append(token, ` · ${item.pos || "no POS"} · ${item.relation || "no relation"} · attends most to ` +
        `${item.attends}${similarity}`);
      const context = document.createElement("div");
      context.className = "context";
      item.context.forEach((word, position) => {
        if (position) context.append(" ");
        if (position === item.word) {
          const mark = document.createElement("mark");
          mark.textContent = word;
          context.append(mark);
        } else {
          context.append(word);
        }
      });
      const origin = document.createElement("small");
      origin.className = "muted";
      origin.textContent = item.origin;
      entry.append(head, context, origin);
      list.append(entry);
    }
    fillHistogram(byId("relation-histogram"), answer.histogram);
    fillHistogram(byId("pos-histogram"), answer.pos_histogram);
    byId("histograms").hidden = answer.neighbours.length === 0;
    status(`${answer.neighbours.length} corpus tokens.`);
  }

  function fillHistogram(table, counts) {
    table.replaceChildren();
    for (const [value, count] of counts) {
      const row = table.insertRow();
      row.insertCell().textContent = value;
      row.insertCell().textContent = String(count);
    }
  }

  function selectInputToken(position) {
    for (const [index, button] of [...byId("search-tokens").children].entries()) {
      button.classList.toggle("selected", index === position);
    }
  }

  /** A listed corpus token becomes the query: its nearest corpus tokens, by its stored vector. */
  async function searchCorpusToken(item) {
    status("Searching…");
    selectInputToken(-1);
    byId("search-query").textContent =
      `Query: corpus token “${item.token}” in “${item.context.join(" ")}” (${item.origin}).`;
    try {
      showFound(await callApi("/api/search/token", { row: item.row, layer: layer() }));
    } catch (error) {
      status(`Search failed: ${error.message}`);
    }
  }

  async function search(position) {
    status("Searching…");
    selectInputToken(position);
    byId("search-query").textContent = `Query: input token “${tokens[position]}”.`;
    try {
      showFound(await callApi("/api/search/input", { text: byId("search-text").value, layer: layer(), token: position }));
    } catch (error) {
      status(`Search failed: ${error.message}`);
    }
  }

  async function showTokens(event) {
    event.preventDefault();
    try {
      tokens = (await callApi("/api/search/input", { text: byId("search-text").value, layer: layer() })).tokens;
    } catch (error) {
      status(`Could not read the input: ${error.message}`);
      return;
    }
    const box = byId("search-tokens");
    box.replaceChildren(...tokens.map((token, position) => {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = token;
      button.addEventListener("click", () => search(position));
      return button;
    }));
    status("");
  }

  async function findWord(event) {
    event.preventDefault();
    selectInputToken(-1);
    byId("search-query").textContent = `Occurrences of “${byId("search-word").value}” (click one for its neighbours).`;
    try {
      showFound(await callApi("/api/search/word", { word: byId("search-word").value, layer: layer() }));
    } catch (error) {
      status(`Search failed: ${error.message}`);
    }
  }

  async function start() {
    let info;
    try {
      info = await callApi("/api/search/info", {});
    } catch (error) {
      return;
    }
    if (!info.available) return; // no index on this server: the section stays hidden
    byId("search-source").textContent =
      `${info.tokens} tokens of ${info.segments} segments, model ${info.model}, layers ${info.layers.join(", ")}.`;
    const select = byId("search-layer");
    for (const value of info.layers) {
      const option = document.createElement("option");
      option.value = String(value);
      option.textContent = String(value);
      select.append(option);
    }
    select.value = String(info.layers[info.layers.length - 1]);
    byId("search-form").addEventListener("submit", showTokens);
    byId("word-form").addEventListener("submit", findWord);
    byId("search").hidden = false;
    if (location.hash === "#search") byId("search").scrollIntoView({ block: "start" });
  }

  start();
})();
