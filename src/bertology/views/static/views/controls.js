// controls.js: The page frame (toolbar with title, controls, theme and export buttons; hint; body), its
// select, check box and button controls, and the head selector (HeadPicker).
// Uses: SEGMENT_FILTERS (contract.js); el, headColour, headLabel, layerLabel, range (util.js); currentTheme,
// paintHeadColours (colours.js).

  // ---------------------------------------------------------------------------------------------
  // Page frame: toolbar (title, controls, theme, export), hint, body
  // ---------------------------------------------------------------------------------------------

  function selectControl(id, label, options, value, onChange) {
    const select = el("select", { id, "aria-label": label });
    for (const [optionValue, text] of options) select.append(el("option", { value: optionValue, text }));
    select.value = String(value);
    select.addEventListener("change", () => onChange(select.value));
    return { select, element: el("label", { class: "bt-control" }, [label, select]) };
  }

  function checkControl(id, label, checked, onChange, title) {
    const input = el("input", { id, type: "checkbox" });
    input.checked = checked;
    input.addEventListener("change", () => onChange(input.checked));
    return { input, element: el("label", { class: "bt-control", title }, [input, label]) };
  }

  /** The segment filter's select (#bt-filter): All, A → A, A → B, B → A, B → B. */
  function filterControl(onChange) {
    const options = Object.entries(SEGMENT_FILTERS).map(([key, { label }]) => [key, label]);
    return selectControl("bt-filter", "Attention", options, "all", onChange);
  }

  const layerOptions = (data) => range(data.layers).map((layer) => [layer, layerLabel(data, layer)]);
  const headOptions = (data) => range(data.heads).map((head) => [head, headLabel(data, head)]);

  function button(id, text, onClick, title) {
    return el("button", { id, class: "bt-button", type: "button", title, text, onclick: onClick });
  }

  /** The page frame of a view. actions: {toggleTheme, exportPng, exportSvg?} (no exportSvg: no SVG button). */
  function frame({ data, title, controls, hint, body, actions }) {
    const themeButton = button("bt-theme", "", () => actions.toggleTheme(), "Switch light / dark theme");
    const syncThemeButton = () => {
      const dark = currentTheme() === "dark";
      themeButton.textContent = dark ? "\u2600 Light" : "\u263e Dark";
      themeButton.setAttribute("aria-pressed", String(dark));
    };
    syncThemeButton();
    const status = el("div", { id: "bt-status", class: "bt-status", role: "status" });
    const square = !data.keyTokens || data.keyTokens === data.tokens;
    const tokens = square ? `${data.n} tokens` : `${data.n} query × ${data.keyTokens.length} key tokens`;
    const causal = data.causal ? " · causal" : "";
    const weights = data.weights === "norm" ? " · norm-based weights ‖αf(x)‖" : "";
    const plural = (count, word) => `${count} ${word}${count === 1 ? "" : "s"}`;
    const subtitle = `${data.model} · ${tokens} · ${plural(data.layers, "layer")} × ${plural(data.heads, data.headNames ? "column" : "head")}${causal}${weights}`;
    const toolbar = el("header", { class: "bt-toolbar" }, [
      el("div", { class: "bt-title" }, [
        el("strong", { text: data.heading || title }),
        el("span", { class: "bt-subtitle", text: subtitle, title: subtitle }),
      ]),
      ...controls,
      el("span", { class: "bt-spacer" }),
      themeButton,
      button("bt-export-png", "PNG", () => actions.exportPng(), "Download the current picture as PNG"),
      actions.exportSvg && button("bt-export-svg", "SVG", () => actions.exportSvg(), "Download the lines as SVG"),
    ]);
    const element = el("div", { class: "bt-frame" }, [
      toolbar,
      data.caption && el("div", { id: "bt-caption", class: "bt-hint", text: data.caption }),
      el("div", { class: "bt-hint", text: hint }),
      status,
      ...body,
    ]);
    const setStatus = (text) => {
      if (status.textContent !== text) status.textContent = text;
    };
    return { element, syncThemeButton, setStatus };
  }

  /** Head selector: a colour swatch per head; click toggles, double-click shows that head alone. */
  class HeadPicker {
    constructor(data, onChange) {
      this.visible = range(data.heads).map((head) => !data.selectedHeads || data.selectedHeads.includes(head));
      this.onChange = onChange;
      const name = (head) => (data.headNames ? data.headNames[head] : `Head ${head}`);
      this.buttons = range(data.heads).map((head) =>
        el("button", {
          class: "bt-swatch", type: "button", text: headLabel(data, head),
          title: `${name(head)}: click to toggle, double-click to show it alone`,
          dataset: { head, headColour: head }, "aria-pressed": String(this.visible[head]),
          onclick: () => this.toggle(head), ondblclick: () => this.solo(head),
        }),
      );
      const props = { id: "bt-heads", class: "bt-heads", role: "group", "aria-label": "Heads" };
      this.element = el("div", props, this.buttons);
      paintHeadColours(this.element);
    }

    get heads() {
      return range(this.visible.length).filter((head) => this.visible[head]);
    }

    set(heads) {
      this.visible = this.visible.map((_, head) => heads.includes(head));
      this.buttons.forEach((node, head) => node.setAttribute("aria-pressed", String(this.visible[head])));
      this.onChange(this.heads);
    }

    toggle(head) {
      this.set(this.heads.includes(head) ? this.heads.filter((h) => h !== head) : [...this.heads, head]);
    }

    solo(head) {
      const alone = this.heads.length === 1 && this.heads[0] === head;
      this.set(alone ? range(this.visible.length) : [head]);
    }
  }
