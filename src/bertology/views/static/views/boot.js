// boot.js: Boot: the data checks, the page API installed for the view in charge, the height reported to a
// parent frame, the error line, and main(), which starts the page. Closes the function scope that contract.js
// opens.
// Uses: api, scriptStart (contract.js); clamp, el, range (util.js); decodeArrays (decode.js); applyTheme,
// currentTheme, paintHeadColours (colours.js); download, renderPicture (canvas.js); HeadView (head.js);
// ModelView (model.js); NeuronView (neuron.js); WatchView, checkWatchData, decodeWatchArrays (watch.js);
// startSets (sets.js).

  // ---------------------------------------------------------------------------------------------
  // Boot
  // ---------------------------------------------------------------------------------------------

  const VIEWS = { head: HeadView, model: ModelView, neuron: NeuronView };
  /** The toolbar buttons of every view call the page API (which the view in charge installed). */
  const ACTIONS = {
    toggleTheme: () => api.toggleTheme(),
    exportPng: () => api.exportPng(),
    exportSvg: () => api.exportSvg(),
  };

  function checkData(data) {
    if (!VIEWS[data.view]) throw new Error(`unknown view "${data.view}"`);
    for (const key of ["layers", "heads", "n"]) {
      if (!Number.isInteger(data[key]) || data[key] < 1) throw new Error(`"${key}" must be a positive integer`);
    }
    if (!Array.isArray(data.tokens) || data.tokens.length !== data.n) throw new Error(`expected ${data.n} tokens`);
    const segmentsOk = Array.isArray(data.segments) && data.segments.length === data.n;
    data.segments = segmentsOk ? data.segments : data.tokens.map(() => 0);
    // Key tokens: their own list for cross-attention (attention [layers, heads, n, keyTokens.length]).
    if (data.keyTokens === undefined || data.keyTokens === null) {
      data.keyTokens = data.tokens;
      data.keySegments = data.segments;
    } else {
      if (!Array.isArray(data.keyTokens) || data.keyTokens.length < 1) throw new Error('"keyTokens" must list tokens');
      const keySegmentsOk = Array.isArray(data.keySegments) && data.keySegments.length === data.keyTokens.length;
      data.keySegments = keySegmentsOk ? data.keySegments : data.keyTokens.map(() => 0);
    }
    data.causal = data.causal === true;
    data.faintLines = data.faintLines === true;
    data.model = String(data.model || "model");
    for (const key of ["layer", "head", "query"]) data[key] = Number.isInteger(data[key]) ? data[key] : 0;
    data.layer = clamp(data.layer, 0, data.layers - 1);
    data.head = clamp(data.head, 0, data.heads - 1);
    if (data.headNames !== undefined && data.headNames !== null) {
      if (!Array.isArray(data.headNames) || data.headNames.length !== data.heads) {
        throw new Error(`"headNames" must list ${data.heads} names`);
      }
      data.headNames = data.headNames.map(String);
    } else {
      data.headNames = null;
    }
    if (data.layerNames !== undefined && data.layerNames !== null) {
      if (!Array.isArray(data.layerNames) || data.layerNames.length !== data.layers) {
        throw new Error(`"layerNames" must list ${data.layers} names`);
      }
      data.layerNames = data.layerNames.map(String);
    } else {
      data.layerNames = null;
    }
    const headIndex = (head) => Number.isInteger(head) && head >= 0 && head < data.heads;
    if (data.selectedHeads !== undefined && data.selectedHeads !== null) {
      if (!Array.isArray(data.selectedHeads) || !data.selectedHeads.every(headIndex)) {
        throw new Error(`"selectedHeads" must list heads 0 to ${data.heads - 1}`);
      }
      data.selectedHeads = range(data.heads).filter((head) => data.selectedHeads.includes(head));
    } else {
      data.selectedHeads = null;
    }
  }

  function fileName(data, extension) {
    return `bertology-${data.view}-${data.model.replace(/[^\w.-]+/g, "_")}.${extension}`;
  }

  function installApi(view, data) {
    const redraw = () => {
      paintHeadColours(document);
      view.draw();
      view.frame.syncThemeButton();
    };
    const svgText = () => new XMLSerializer().serializeToString(view.svg());
    const pngDataUrl = () => renderPicture(view.picture()).toDataURL("image/png");
    const call = (method) => (...args) => {
      if (!view[method]) throw new Error(`the ${data.view} view has no ${method}()`);
      return view[method](...args);
    };
    Object.assign(api, {
      view: data.view,
      state: () => ({ ...view.state(), theme: currentTheme() }),
      setLayer: call("setLayer"),
      setHead: call("setHead"),
      setQuery: call("setQuery"),
      setHeads: call("setHeads"),
      setFilter: call("setFilter"),
      setFaintLines: call("setFaintLines"),
      focusToken: (side, index) => view.focusToken(side || null, index),
      openDetail: call("openDetail"),
      weightBoxes: call("weightBoxes"),
      closeDetail: call("closeDetail"),
      neuron: call("neuron"),
      setTheme: (name) => {
        applyTheme(name);
        redraw();
      },
      toggleTheme: () => api.setTheme(currentTheme() === "dark" ? "light" : "dark"),
      pngDataUrl,
      exportPng: () => {
        renderPicture(view.picture()).toBlob((blob) => download(blob, fileName(data, "png")), "image/png");
      },
      svgText,
      exportSvg: () => download(new Blob([svgText()], { type: "image/svg+xml" }), fileName(data, "svg")),
    });
  }

  async function startView(root, data) {
    checkData(data);
    applyTheme(data.theme);
    const arrays = await decodeArrays(data);
    const view = new VIEWS[data.view](data, arrays, ACTIONS);
    installApi(view, data);
    root.dataset.view = data.view;
    root.replaceChildren(view.element);
    view.draw();
  }

  async function startWatch(root, data) {
    checkWatchData(data);
    applyTheme(data.theme);
    const watch = new WatchView(data, await decodeWatchArrays(data));
    root.dataset.view = "watch";
    root.replaceChildren(watch.element);
    watch.build();
  }

  // A page shown in a frame (a notebook's output: View._repr_html_) tells its parent how tall its content
  // is, as the message {bertologyHeight: px}, so that the frame can be sized to it instead of scrolling.
  let reportedHeight = null;
  /** The window event of a page whose frame is about to grow to the height it reported. */
  const FRAME_GROWS = "bertology-frame-grows";

  /** The root's height with nothing scrolling inside it (.bt-measure lays the page out at full size). */
  function contentHeight() {
    const page = document.documentElement;
    page.classList.add("bt-measure");
    const height = Math.ceil(document.getElementById("bertology-root").getBoundingClientRect().height);
    page.classList.remove("bt-measure");
    return height;
  }

  function reportHeight() {
    if (window.parent === window) return;
    const height = contentHeight();
    if (height === reportedHeight) return;
    reportedHeight = height;
    window.parent.postMessage({ bertologyHeight: height }, "*");
    window.dispatchEvent(new Event(FRAME_GROWS));
  }

  /**
   * How much taller (px) this page's frame is about to be: the height reported to the parent less the
   * window's (0 outside a frame). The frame out of view keeps its old window size until it is scrolled
   * to, so a token table draws the rows the grown frame will show from the start.
   */
  function frameGrowth() {
    return reportedHeight === null ? 0 : Math.max(0, reportedHeight - window.innerHeight);
  }

  function showError(root, error) {
    api.error = String(error && error.message ? error.message : error);
    const message = `Cannot show this view: ${api.error}`;
    root.replaceChildren(el("div", { class: "bt-error", role: "alert", text: message }));
    document.body.dataset.ready = "error";
  }

  async function main() {
    const root = document.getElementById("bertology-root");
    try {
      const data = JSON.parse(document.getElementById("bertology-data").textContent);
      if (data.view === "watch") await startWatch(root, data);
      else if (data.attentionSets) await startSets(root, data);
      else await startView(root, data);
      // The first picture is drawn by now. Nothing here waits for an animation frame: a browser gives
      // none to a frame out of view (a notebook's output further down), which would stay blank.
      api.firstPaintMs = performance.now() - scriptStart;
      api.ready = true;
      document.body.dataset.ready = "1";
      reportHeight();
      window.addEventListener("resize", reportHeight);
    } catch (error) {
      showError(root, error);
    }
  }

  main();
})();
