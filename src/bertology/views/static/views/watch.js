// watch.js: The watch page (WatchView): the head or model view of one training example at any recorded step,
// the training rules' alerts and the report.
// Uses: api (contract.js); clamp, el (util.js); decodeArray (decode.js); currentTheme (colours.js); button,
// selectControl (controls.js).
// Refers at run time only (inside functions, once every module has run) to: ACTIONS, VIEWS, checkData,
// installApi (boot.js).

  // ---------------------------------------------------------------------------------------------
  // Watch page: the head or model view of one probe example at any recorded training step, then a
  // report (facts, figures, a table). Every step's attention is decoded once; the step slider swaps the
  // shown array (setAttention) without rebuilding the view; another example or view kind rebuilds it.
  // data: {view: "watch", title, model, layers, heads, layer, theme, steps: [T],
  //        examples: [{tokens, segments, pair, n, caption, text, attention: packed [T, layers, heads, n, n]}],
  //        facts: [[term, value]], sections: [{id, title, figures: [{png, alt, caption}], table?}],
  //        alerts?: [{rule, step, what, where: [..], heads: [[layer, head]], follows, record}]} (the training
  //        rules'; follows: the divergence an alert came after, or null)
  // ---------------------------------------------------------------------------------------------

  const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

  function checkWatchData(data) {
    for (const key of ["layers", "heads"]) {
      if (!Number.isInteger(data[key]) || data[key] < 1) throw new Error(`"${key}" must be a positive integer`);
    }
    if (!Array.isArray(data.steps) || data.steps.length < 1) throw new Error("the run has no recorded step");
    if (!Array.isArray(data.examples) || data.examples.length < 1) throw new Error("the run has no probe example");
    data.model = String(data.model || "model");
    data.title = String(data.title || "Training");
    data.layer = Number.isInteger(data.layer) ? clamp(data.layer, 0, data.layers - 1) : 0;
  }

  async function decodeWatchArrays(data) {
    const arrays = await Promise.all(data.examples.map((example, i) => decodeArray(example.attention, `example ${i}`)));
    arrays.forEach((array, i) => {
      const { n } = data.examples[i];
      const expected = [data.steps.length, data.layers, data.heads, n, n];
      if (array.shape.length !== 5 || expected.some((size, axis) => size !== array.shape[axis])) {
        throw new Error(`example ${i} has attention of shape [${array.shape}], expected [${expected}]`);
      }
    });
    return arrays;
  }

  function reportFigure({ png, alt, caption }) {
    if (!BASE64.test(png)) throw new Error("a figure is not base64 PNG data");
    const image = el("img", { src: `data:image/png;base64,${png}`, alt, loading: "lazy" });
    return el("figure", {}, [image, caption && el("figcaption", { text: caption })]);
  }

  function reportTable({ caption, columns, rows }) {
    const head = el("tr", {}, columns.map((name) => el("th", { text: name })));
    const body = rows.map((row) => el("tr", {}, row.map((cell) => el("td", { text: String(cell) }))));
    const table = el("table", {}, [el("thead", {}, [head]), el("tbody", {}, body)]);
    return el("div", {}, [caption && el("p", { class: "bt-caption", text: caption }), el("div", { class: "bt-table-wrap" }, [table])]);
  }

  /** The training rules' alerts: #bt-alerts, a button per alert (.bt-alert[data-rule][data-step]) that
   *  calls show(index): move to the alert's record and show the heads it names. */
  function watchAlerts(data, show) {
    const alerts = Array.isArray(data.alerts) ? data.alerts : [];
    if (!alerts.length) return null;
    const items = alerts.map((alert, i) => {
      const where = Array.isArray(alert.where) ? alert.where.join(", ") : "";
      const button = el("button", {
        class: "bt-alert", type: "button", "data-rule": String(alert.rule), "data-step": String(alert.step),
        text: `step ${alert.step} · ${alert.rule}${alert.follows ? ` (after ${alert.follows})` : ""}: ${alert.what}${where ? ` (${where})` : ""}`,
      });
      button.addEventListener("click", () => show(i));
      return el("li", {}, [button]);
    });
    return el("section", { id: "bt-alerts", class: "bt-alerts" }, [
      el("h2", { text: `Alerts (${alerts.length})` }), el("ul", {}, items),
    ]);
  }

  function watchReport(data) {
    const facts = el("dl", { class: "bt-facts" }, data.facts.flatMap(([term, value]) => [
      el("dt", { text: term }), el("dd", { text: value }),
    ]));
    const sections = data.sections.map((section) => el("section", { id: `bt-${section.id}` }, [
      el("h2", { text: section.title }),
      ...(section.figures || []).map(reportFigure),
      section.table && reportTable(section.table),
    ]));
    return el("div", { id: "bt-report", class: "bt-report" }, [facts, ...sections]);
  }

  class WatchView {
    constructor(data, arrays) {
      this.data = data;
      this.arrays = arrays;
      this.stepIndex = data.steps.length - 1;
      this.example = 0;
      this.mode = "head";
      this.inner = null;
      this.slider = el("input", {
        id: "bt-step", type: "range", min: 0, max: data.steps.length - 1, step: 1, value: this.stepIndex,
        "aria-label": "Training step",
      });
      this.slider.addEventListener("input", () => this.setStep(this.slider.value));
      this.stepLabel = el("output", { id: "bt-step-label", class: "bt-step-label" });
      const examples = data.examples.map((example, i) => [i, `${i}: ${example.caption}`]);
      this.exampleControl = selectControl("bt-example", "Example", examples, 0, (v) => this.setExample(v));
      const modes = [["head", "Head view"], ["model", "Model view"]];
      this.modeControl = selectControl("bt-mode", "View", modes, this.mode, (v) => this.setMode(v));
      this.exampleText = el("div", { id: "bt-example-text", class: "bt-hint" });
      const subtitle = `${data.model} · ${data.steps.length} recorded steps · ${data.examples.length} probe examples`;
      const toolbar = el("header", { class: "bt-toolbar" }, [
        el("div", { class: "bt-title" }, [el("strong", { text: data.title }), el("span", { class: "bt-subtitle", text: subtitle })]),
        this.exampleControl.element,
        this.modeControl.element,
        el("label", { class: "bt-control bt-step" }, ["Step", this.slider, this.stepLabel]),
      ]);
      this.live = el("div", { class: "bt-watch-live" });
      const alerts = watchAlerts(data, (i) => this.showAlert(i));
      this.element = el("div", { class: "bt-watch" }, [toolbar, alerts, this.exampleText, this.live, watchReport(data)]);
      this.showStep();
    }

    /** The attention of `example` at record `stepIndex`, {shape: [layers, heads, n, n], values} (no copy). */
    attentionAt(example, stepIndex) {
      const [, layers, heads, n] = this.arrays[example].shape;
      const size = layers * heads * n * n;
      const values = this.arrays[example].values.subarray(stepIndex * size, (stepIndex + 1) * size);
      return { shape: [layers, heads, n, n], values };
    }

    showStep() {
      const { steps } = this.data;
      this.slider.value = String(this.stepIndex);
      this.stepLabel.textContent = `${steps[this.stepIndex]} (record ${this.stepIndex + 1} of ${steps.length})`;
    }

    /** (Re)build the inner head or model view for the current example and step. */
    build() {
      const example = this.data.examples[this.example];
      const previous = this.inner && this.inner.state();
      const layer = previous && Number.isInteger(previous.layer) ? previous.layer : this.data.layer;
      const data = {
        view: this.mode, model: this.data.model, theme: currentTheme(), tokens: example.tokens,
        segments: example.segments, pair: Boolean(example.pair), layers: this.data.layers, heads: this.data.heads,
        n: example.n, layer, head: 0, query: 0,
      };
      checkData(data);
      this.exampleText.textContent = example.text;
      this.inner = new VIEWS[this.mode](data, { attention: this.attentionAt(this.example, this.stepIndex) }, ACTIONS);
      this.live.replaceChildren(this.inner.element);
      installApi(this.inner, data);
      const innerState = api.state;
      Object.assign(api, {
        view: "watch",
        state: () => ({ ...innerState(), watch: this.state() }),
        setStep: (index) => this.setStep(index),
        setExample: (index) => this.setExample(index),
        setMode: (mode) => this.setMode(mode),
        showAlert: (index) => this.showAlert(index),
      });
      this.inner.draw();
    }

    setStep(index) {
      this.stepIndex = clamp(Number(index), 0, this.data.steps.length - 1);
      this.showStep();
      this.inner.setAttention(this.attentionAt(this.example, this.stepIndex));
    }

    setExample(index) {
      this.example = clamp(Number(index), 0, this.data.examples.length - 1);
      this.exampleControl.select.value = String(this.example);
      this.build();
    }

    /** Alert `index`: its record on the slider; for an alert about heads, the head view of the first
     *  named head's layer with the heads it names in that layer selected. */
    showAlert(index) {
      const alert = this.data.alerts[clamp(Number(index), 0, this.data.alerts.length - 1)];
      this.setStep(Number.isInteger(alert.record) ? alert.record : this.data.steps.length - 1);
      const heads = Array.isArray(alert.heads) ? alert.heads : [];
      if (!heads.length) return;
      if (this.mode !== "head") this.setMode("head");
      const layer = heads[0][0];
      this.inner.setLayer(layer);
      this.inner.setHeads(heads.filter(([at]) => at === layer).map(([, head]) => head));
    }

    setMode(mode) {
      if (mode !== "head" && mode !== "model") throw new Error(`unknown view ${mode}`);
      this.mode = mode;
      this.modeControl.select.value = mode;
      this.build();
    }

    state() {
      const { steps } = this.data;
      return { step: steps[this.stepIndex], stepIndex: this.stepIndex, steps: steps.length, example: this.example, mode: this.mode };
    }
  }
