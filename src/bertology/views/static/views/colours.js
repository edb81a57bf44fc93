// colours.js: Theme and colours: the theme's CSS variables read back for canvas drawing, the head palette of
// each theme, colour arithmetic (mixing, WCAG luminance, diverging ramps).
// Uses: DARK_THEME_LIGHTEN, HEAD_COLOURS (contract.js); headColour, range (util.js).

  // ---------------------------------------------------------------------------------------------
  // Theme: CSS variables on <html data-theme>, read back for canvas drawing
  // ---------------------------------------------------------------------------------------------

  const THEME_VARS = {
    bg: "--bt-bg", fg: "--bt-fg", muted: "--bt-muted", panel: "--bt-panel", border: "--bt-border",
    accent: "--bt-accent", highlight: "--bt-highlight", heat: "--bt-heat", neg: "--bt-neg", pos: "--bt-pos",
    font: "--bt-font", mono: "--bt-mono",
  };

  function applyTheme(name) {
    document.documentElement.dataset.theme = name === "dark" ? "dark" : "light";
  }

  const currentTheme = () => document.documentElement.dataset.theme || "light";

  function themeColours() {
    const style = getComputedStyle(document.documentElement);
    const colours = {};
    for (const [key, name] of Object.entries(THEME_VARS)) colours[key] = style.getPropertyValue(name).trim();
    return colours;
  }

  let colourProbe = null;
  /** Any CSS colour -> [r, g, b] (via the canvas colour parser). */
  function rgbOf(colour) {
    colourProbe = colourProbe || document.createElement("canvas").getContext("2d");
    colourProbe.fillStyle = "#000000";
    colourProbe.fillStyle = colour;
    const value = colourProbe.fillStyle;
    if (value.startsWith("#")) return [1, 3, 5].map((i) => parseInt(value.slice(i, i + 2), 16));
    return value.match(/[\d.]+/g).slice(0, 3).map(Number);
  }

  const mixRgb = (a, b, t) => a.map((v, i) => Math.round(v + (b[i] - v) * t));
  const cssRgb = ([r, g, b]) => `rgb(${r},${g},${b})`;
  const hexRgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const cssHex = (rgb) => `#${rgb.map((v) => v.toString(16).padStart(2, "0")).join("")}`;

  /** WCAG 2 relative luminance of an [r, g, b] colour (0..255 channels). */
  function luminance(rgb) {
    const [r, g, b] = rgb.map((v) => {
      const c = v / 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }

  /** Black or white, whichever contrasts more with `rgb` (at least 4.58:1 for any colour). */
  const inkOn = (rgb) => (luminance(rgb) > 0.179 ? "#000000" : "#ffffff");

  const palettes = {};
  /** The 20 head colours of the current theme (hex). */
  function headPalette() {
    const theme = currentTheme();
    if (!palettes[theme]) {
      const lighten = (hex) => cssHex(mixRgb(hexRgb(hex), [255, 255, 255], DARK_THEME_LIGHTEN));
      palettes[theme] = theme === "dark" ? HEAD_COLOURS.map(lighten) : HEAD_COLOURS;
    }
    return palettes[theme];
  }

  /** Colour every element marked data-head-colour="h" (swatches, column labels) with head h's theme colour:
   *  --bt-swatch, and --bt-swatch-ink for text on it. */
  function paintHeadColours(scope) {
    for (const node of scope.querySelectorAll("[data-head-colour]")) {
      const colour = headColour(Number(node.dataset.headColour));
      node.style.setProperty("--bt-swatch", colour);
      node.style.setProperty("--bt-swatch-ink", inkOn(hexRgb(colour)));
    }
  }

  /** 2 * steps + 1 colours from `neg` through the background to `pos`. */
  function divergingRamp(colours, steps = 32) {
    const [bg, neg, pos] = [colours.bg, colours.neg, colours.pos].map(rgbOf);
    return range(2 * steps + 1).map((k) => {
      const t = (k - steps) / steps;
      return cssRgb(t < 0 ? mixRgb(bg, neg, -t) : mixRgb(bg, pos, t));
    });
  }
