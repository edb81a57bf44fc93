// What both pages of the web app use (index.html, explore.html load it before their own script): the
// element lookup, the page's state and status line, and calls to this server's API with its errors.
"use strict";

const $ = (id) => document.getElementById(id);

/** Show the page's state ("busy", "ready", "error", "idle") on <body data-state>, ``message`` in #status. */
function setState(state, message) {
  document.body.dataset.state = state;
  $("status").textContent = message || "";
  $("status").classList.toggle("error", state === "error");
}

/** GET ``path`` (no ``body``) or POST ``body`` as JSON; the answer as JSON, or as text with
 *  ``expect === "text"``. A failed call throws an Error with the server's JSON ``error`` message, or the
 *  HTTP status line when the answer is not JSON. */
async function callApi(path, body, expect) {
  const response = await fetch(path, {
    method: body === undefined ? "GET" : "POST",
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      message = (await response.json()).error || message;
    } catch (ignored) {
      // not JSON: keep the status line
    }
    throw new Error(message);
  }
  return expect === "text" ? response.text() : response.json();
}
