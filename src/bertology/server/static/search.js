// Corpus search on the explorer page (bertology serve --index DIR): the tokens of a typed input, and for
// a clicked token its nearest corpus tokens. Every text from the server goes in with textContent.
"use strict";

(() => {
  const byId = (id) => document.getElementById(id);
  let tokens = [];

  async function ask(path, body) {
    const response = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error || `${response.status} ${response.statusText}`);
    return answer;
  }

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
      head.textContent = `${item.token} · ${item.relation || "no relation"} · attends to ${item.attends}${similarity}`;
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
    const table = byId("relation-histogram");
    table.replaceChildren();
    for (const [relation, count] of answer.histogram) {
      const row = table.insertRow();
      row.insertCell().textContent = relation;
      row.insertCell().textContent = String(count);
    }
    status(`${answer.neighbours.length} corpus tokens.`);
  }

  async function search(position) {
    status("Searching…");
    for (const [index, button] of [...byId("search-tokens").children].entries()) {
      button.classList.toggle("selected", index === position);
    }
    try {
      showFound(await ask("/api/search/input", { text: byId("search-text").value, layer: layer(), token: position }));
    } catch (error) {
      status(`Search failed: ${error.message}`);
    }
  }

  async function showTokens(event) {
    event.preventDefault();
    try {
      tokens = (await ask("/api/search/input", { text: byId("search-text").value, layer: layer() })).tokens;
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
    try {
      showFound(await ask("/api/search/word", { word: byId("search-word").value, layer: layer() }));
    } catch (error) {
      status(`Search failed: ${error.message}`);
    }
  }

  async function start() {
    let info;
    try {
      info = await ask("/api/search/info", {});
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
  }

  start();
})();
