// sets.js: Attention sets of encoder-decoder models (AttentionSetView): the head or model view of one set at a
// time and the selector (#bt-attention) that switches sets.
// Uses: api (contract.js); clamp (util.js); checkShapes, decodeArray (decode.js); applyTheme (colours.js);
// selectControl (controls.js).
// Refers at run time only (inside functions, once every module has run) to: ACTIONS, VIEWS, checkData,
// installApi, reportHeight (boot.js).

  // ---------------------------------------------------------------------------------------------
  // Attention sets (encoder-decoder models): the head or model view of one set at a time, and a selector
  // (#bt-attention) in its toolbar that rebuilds the view for another set, keeping the layer if it has it.
  // data: {view: "head" | "model", model, theme, layer, head, attentionSet: name of the set shown first,
  //        attentionSets: [{name, label, tokens, segments, keyTokens?, keySegments?, layers, heads, n, causal,
  //                         attention: packed [layers, heads, n, keys]}]}
  // ---------------------------------------------------------------------------------------------

  async function decodeSets(data) {
    if (!Array.isArray(data.attentionSets) || data.attentionSets.length < 1) throw new Error('"attentionSets" is empty');
    return Promise.all(data.attentionSets.map(async (set) => {
      const { attention, ...fields } = set;
      const setData = {
        view: data.view, model: data.model, layer: data.layer, head: data.head, query: 0, faintLines: data.faintLines, ...fields,
      };
      checkData(setData);
      const arrays = { attention: await decodeArray(attention, `${setData.name} attention`) };
      checkShapes(setData, arrays);
      return { name: String(setData.name), label: String(setData.label || setData.name), data: setData, arrays };
    }));
  }

  class AttentionSetView {
    constructor(data, sets, root) {
      this.sets = sets;
      this.root = root;
      const first = sets.find((set) => set.name === data.attentionSet) || sets[0];
      const options = sets.map(({ name, label }) => [name, label]);
      this.control = selectControl("bt-attention", "Attention", options, first.name, (v) => this.setAttentionSet(v));
      this.show(first, data.layer);
    }

    show(set, layer) {
      this.current = set;
      this.control.select.value = set.name;
      const data = { ...set.data, layer: clamp(layer, 0, set.data.layers - 1) };
      this.inner = new VIEWS[data.view](data, set.arrays, ACTIONS, [this.control.element]);
      installApi(this.inner, data);
      const innerState = api.state;
      Object.assign(api, {
        state: () => ({ ...innerState(), attentionSet: this.current.name }),
        setAttentionSet: (name) => this.setAttentionSet(name),
      });
      this.root.replaceChildren(this.inner.element);
      this.inner.draw();
      if (api.ready) reportHeight();
    }

    setAttentionSet(name) {
      const set = this.sets.find((candidate) => candidate.name === name);
      if (!set) throw new Error(`unknown attention set ${name}`);
      const { layer } = this.inner.state();
      this.show(set, Number.isInteger(layer) ? layer : set.data.layer);
    }
  }

  async function startSets(root, data) {
    if (data.view !== "head" && data.view !== "model") throw new Error(`the ${data.view} view has no attention sets`);
    applyTheme(data.theme);
    const sets = await decodeSets(data);
    root.dataset.view = data.view;
    return new AttentionSetView(data, sets, root);
  }
