// decode.js: Decoding the page's packed arrays: base64, zlib inflate, typed arrays of 8-bit codes and float16;
// the shape checks of a view's arrays.
// Uses no other module's names.
// Refers at run time only (inside functions, once every module has run) to: LongInput (head.js).

  // ---------------------------------------------------------------------------------------------
  // Decoding: base64 -> zlib inflate -> typed arrays (uint8 codes, float16 bits)
  // ---------------------------------------------------------------------------------------------

  function base64ToBytes(text) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(text);
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    return bytes;
  }

  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  /** IEEE 754 half -> number. */
  function halfToFloat(bits) {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const fraction = bits & 0x3ff;
    if (exponent === 0) return sign * fraction * 2 ** -24;
    if (exponent === 31) return fraction ? NaN : sign * Infinity;
    return sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
  }

  let halfTable = null;
  function halfLookup() {
    if (!halfTable) {
      halfTable = new Float32Array(65536);
      for (let bits = 0; bits < 65536; bits++) halfTable[bits] = halfToFloat(bits);
    }
    return halfTable;
  }

  function littleEndianHalves(buffer) {
    if (new Uint8Array(new Uint16Array([1]).buffer)[0] === 1) return new Uint16Array(buffer);
    const view = new DataView(buffer);
    const out = new Uint16Array(buffer.byteLength / 2);
    for (let i = 0; i < out.length; i++) out[i] = view.getUint16(2 * i, true);
    return out;
  }

  /** Decode one packed array: {shape, values: Uint8Array} (uint8) or {shape, halves: Uint16Array}. */
  async function decodeArray(packed, name) {
    if (packed.codec !== "deflate-base64") throw new Error(`${name}: unknown codec ${packed.codec}`);
    const buffer = await inflate(base64ToBytes(packed.data));
    const count = packed.shape.reduce((a, b) => a * b, 1);
    const width = { uint8: 1, float16: 2, uint16: 2 }[packed.dtype];
    if (!width) throw new Error(`${name}: unknown dtype ${packed.dtype}`);
    if (buffer.byteLength !== count * width) {
      throw new Error(`${name}: ${buffer.byteLength} bytes do not match shape [${packed.shape}]`);
    }
    if (packed.dtype === "uint8") {
      if ((packed.scale ?? 255) !== 255) throw new Error(`${name}: unsupported scale ${packed.scale}`);
      return { shape: packed.shape, values: new Uint8Array(buffer) };
    }
    if (packed.dtype === "uint16") return { shape: packed.shape, values: littleEndianHalves(buffer) };
    return { shape: packed.shape, halves: littleEndianHalves(buffer) };
  }

  /** `length` float16 values of a decoded array from flat index `offset`, as float32. */
  function halfSlice(array, offset, length) {
    const table = halfLookup();
    const out = new Float32Array(length);
    for (let i = 0; i < length; i++) out[i] = table[array.halves[offset + i]];
    return out;
  }

  async function decodeArrays(data) {
    const names = ["attention", "queries", "keys", "valueNorms"].filter((name) => data[name]);
    const arrays = await Promise.all(names.map((name) => decodeArray(data[name], name)));
    const decoded = Object.fromEntries(names.map((name, i) => [name, arrays[i]]));
    if (data.view === "head" && data.long) {
      decoded.long = await LongInput.decode(data);
      decoded.attention = decoded.long.windowAttention(data.long.start, data.long.stop);
    }
    if (data.view === "model" && data.long && data.long.thumbnails) {
      decoded.thumbnails = await decodeArray(data.long.thumbnails, "long.thumbnails");
      const shape = decoded.thumbnails.shape;
      if (shape[0] !== data.layers || shape[1] !== data.heads || shape[2] !== shape[3]) {
        throw new Error(`long.thumbnails has shape [${shape}]`);
      }
    }
    checkShapes(data, decoded);
    return decoded;
  }

  function checkShapes(data, arrays) {
    const { layers, heads, n } = data;
    const expect = (name, shape) => {
      const actual = arrays[name] && arrays[name].shape;
      if (!actual) throw new Error(`the ${data.view} view needs "${name}"`);
      if (shape.some((size, i) => size !== null && size !== actual[i]) || actual.length !== shape.length) {
        throw new Error(`${name} has shape [${actual}], expected [${shape.map((s) => s ?? "d")}]`);
      }
    };
    if (data.view === "neuron") {
      expect("queries", [layers, heads, n, null]);
      expect("keys", [layers, heads, n, arrays.queries.shape[3]]);
      if (data.valueNorms) expect("valueNorms", [layers, heads, n]);
    } else {
      expect("attention", [layers, heads, n, data.keyTokens.length]);
    }
  }
