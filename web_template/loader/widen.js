// fp16 on the wire, fp32 in the kernels: a variant marked `widen: "fp16-initializers"` ships the
// fp32 graph with its float32 initializers stored as FLOAT16; this module rewrites every FLOAT16
// initializer of the model's main graph back to FLOAT before the session is created. It reads the
// ONNX protobuf just far enough (ModelProto.graph → GraphProto.initializer → TensorProto) and copies
// every other field verbatim: the byte-for-byte twin of pipeline/precision/fp16w.py, which the
// build's host and webgpu-kernels checks run.
//
// In a page the work runs in the loader's helper Worker, loader/worker.js (the main thread stays
// free); where no Worker can be started (Node, a CSP that forbids it, a cross-origin loader) it
// runs here.
//
// A chunked fp16w variant (manifest externalData.widened) is a graph whose narrowed initializers
// lie at the end of its external data, from externalData.widened.offset on: the graph is widened
// here with that layout (FLOAT16 → FLOAT, external offset and length moved to the float32 bytes),
// and chunks.js widens each chunk's fp16 values straight into place as it arrives (widenChunk).
//
// The same Worker decodes `.br` bodies with the package's brotli decoder on hosts that serve them
// as they are and browsers without DecompressionStream('brotli') (brotli.js, files.js).

import { wasmDecoder } from './brotli.js';
import { PackLoadError } from './errors.js';

export const WIDEN = 'fp16-initializers';
const MODEL_GRAPH = 7;
const GRAPH_INITIALIZER = 5;
const TENSOR_DATA_TYPE = 2;
const TENSOR_RAW_DATA = 9;
const TENSOR_EXTERNAL_DATA = 13;
const TENSOR_DATA_LOCATION = 14;
const ENTRY_KEY = 1;
const ENTRY_VALUE = 2;
const EXTERNAL = 1;
const FLOAT = 1;
const FLOAT16 = 10;

let table = null;
/** fp16 bits → fp32 bits for all 65536 halves, exactly as numpy converts them (NaN payloads too). */
export function halfToFloatBits() {
  if (table) return table;
  table = new Uint32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const exponent = (h >> 10) & 0x1f;
    let mantissa = h & 0x3ff;
    let bits;
    if (exponent === 0x1f) bits = sign | 0x7f800000 | (mantissa << 13);
    else if (exponent !== 0) bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (mantissa === 0) bits = sign;
    else {
      // subnormal half: normalise
      let e = 113;
      while ((mantissa & 0x400) === 0) {
        mantissa <<= 1;
        e -= 1;
      }
      bits = sign | (e << 23) | ((mantissa & 0x3ff) << 13);
    }
    table[h] = bits >>> 0;
  }
  return table;
}

function fail(message) {
  throw new PackLoadError(`fp16w model: ${message}; rebuild the package`);
}

function readVarint(bytes, pos) {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos >= bytes.length) fail('truncated varint');
    const byte = bytes[pos++];
    value += (byte & 0x7f) * scale; // lengths stay below 2^53: plain numbers suffice
    if (byte < 0x80) return [value, pos];
    scale *= 128;
  }
  return fail('varint longer than 10 bytes');
}

function varint(value) {
  const out = [];
  while (value >= 0x80) {
    out.push((value % 128) | 0x80);
    value = Math.floor(value / 128);
  }
  out.push(value);
  return Uint8Array.from(out);
}

/** [{ number, wire, start, valueStart, end }] of the top-level fields of bytes[from, to). */
function fields(bytes, from, to) {
  const out = [];
  let pos = from;
  while (pos < to) {
    const start = pos;
    let key;
    [key, pos] = readVarint(bytes, pos);
    const number = Math.floor(key / 8);
    const wire = key % 8;
    let valueStart = pos;
    if (wire === 0) [, pos] = readVarint(bytes, pos);
    else if (wire === 1) pos += 8;
    else if (wire === 2) {
      let length;
      [length, valueStart] = readVarint(bytes, pos);
      pos = valueStart + length;
    } else if (wire === 5) pos += 4;
    else fail(`unsupported protobuf wire type ${wire}`);
    if (pos > to) fail('a field runs past the end of its message');
    out.push({ number, wire, start, valueStart, end: pos });
  }
  return out;
}

const size = (pieces) => pieces.reduce((n, p) => n + p.byteLength, 0);

function delimited(number, pieces) {
  return [varint(number * 8 + 2), varint(size(pieces)), ...pieces];
}

const ascii = (bytes) => String.fromCharCode(...bytes);
const encodeAscii = (text) => Uint8Array.from(text, (c) => c.charCodeAt(0));

function decimal(bytes, what) {
  const text = ascii(bytes);
  if (!/^[0-9]{1,16}$/.test(text) || !Number.isSafeInteger(Number(text))) fail(`external data ${what} "${text.slice(0, 20)}" is not a decimal number`);
  return Number(text);
}

/** A FLOAT16 initializer in the external data, as FLOAT at the place of its widened bytes. */
function widenExternal(bytes, parts, typeField, layout) {
  const keyed = new Map(); // external_data field → its key
  const values = new Map();
  for (const f of parts) {
    if (f.number !== TENSOR_EXTERNAL_DATA || f.wire !== 2) continue;
    const inner = new Map();
    for (const g of fields(bytes, f.valueStart, f.end)) if ((g.number === ENTRY_KEY || g.number === ENTRY_VALUE) && g.wire === 2) inner.set(g.number, g);
    if (!inner.has(ENTRY_KEY) || !inner.has(ENTRY_VALUE)) fail('an external_data entry without key or value');
    const key = ascii(bytes.subarray(inner.get(ENTRY_KEY).valueStart, inner.get(ENTRY_KEY).end));
    values.set(key, bytes.subarray(inner.get(ENTRY_VALUE).valueStart, inner.get(ENTRY_VALUE).end));
    keyed.set(f, key);
  }
  if (!values.has('location') || ascii(values.get('location')) !== layout.path) fail(`a FLOAT16 initializer in external data other than '${layout.path}'`);
  if (!values.has('offset') || !values.has('length')) fail('a FLOAT16 initializer in external data without offset and length');
  const offset = decimal(values.get('offset'), 'offset');
  const length = decimal(values.get('length'), 'length');
  if (offset < layout.offset || (offset - layout.offset) % 2 || length % 2 || offset + length > layout.size) {
    fail(`a FLOAT16 initializer at bytes ${offset}-${offset + length} of the external data, outside its fp16 values (${layout.offset}-${layout.size})`);
  }
  const moved = { offset: String(layout.offset + 2 * (offset - layout.offset)), length: String(2 * length) };
  const pieces = [];
  for (const f of parts) {
    const key = keyed.get(f);
    if (f === typeField) pieces.push(varint(TENSOR_DATA_TYPE * 8), varint(FLOAT));
    else if (key === 'offset' || key === 'length') {
      const entry = [];
      for (const g of fields(bytes, f.valueStart, f.end)) {
        if (g.number === ENTRY_VALUE && g.wire === 2) entry.push(...delimited(ENTRY_VALUE, [encodeAscii(moved[key])]));
        else entry.push(bytes.subarray(g.start, g.end));
      }
      pieces.push(...delimited(TENSOR_EXTERNAL_DATA, entry));
    } else pieces.push(bytes.subarray(f.start, f.end));
  }
  return { pieces, count: length / 2 };
}

function widenTensor(bytes, from, to, layout) {
  const parts = fields(bytes, from, to);
  const typeField = parts.find((f) => f.number === TENSOR_DATA_TYPE && f.wire === 0);
  if (!typeField || readVarint(bytes, typeField.valueStart)[0] !== FLOAT16) return null;
  const raw = parts.filter((f) => f.number === TENSOR_RAW_DATA && f.wire === 2);
  const location = parts.find((f) => f.number === TENSOR_DATA_LOCATION && f.wire === 0);
  if (!raw.length && location && readVarint(bytes, location.valueStart)[0] === EXTERNAL) {
    if (!layout) fail('a FLOAT16 initializer in external data, and no widened layout for it');
    return widenExternal(bytes, parts, typeField, layout);
  }
  if (raw.length !== 1) fail('a FLOAT16 initializer without raw_data (not made by pack)');
  const halves = halfToFloatBits();
  const pieces = [];
  let count = 0;
  for (const f of parts) {
    if (f === typeField) pieces.push(varint(TENSOR_DATA_TYPE * 8), varint(FLOAT));
    else if (f.number === TENSOR_RAW_DATA && f.wire === 2) {
      const n = (f.end - f.valueStart) >> 1;
      // raw_data may sit at an odd offset: one aligned copy, then a table lookup per value
      const half = new Uint16Array(bytes.slice(f.valueStart, f.valueStart + 2 * n).buffer);
      const wide = new Uint32Array(n);
      for (let i = 0; i < n; i++) wide[i] = halves[half[i]];
      count += n;
      pieces.push(...delimited(TENSOR_RAW_DATA, [new Uint8Array(wide.buffer)]));
    } else pieces.push(bytes.subarray(f.start, f.end));
  }
  return { pieces, count };
}

function rewrite(bytes, from, to, wanted, inner) {
  const pieces = [];
  for (const f of fields(bytes, from, to)) {
    const replaced = f.number === wanted && f.wire === 2 ? inner(f.valueStart, f.end) : null;
    if (replaced) pieces.push(...delimited(f.number, replaced));
    else pieces.push(bytes.subarray(f.start, f.end));
  }
  return pieces;
}

/** Little-endian hosts only (typed arrays use the host's order); every browser onnxruntime-web runs in is one. */
const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/**
 * The model with every FLOAT16 initializer of its main graph widened to FLOAT:
 * { bytes: Uint8Array, tensors, values, ms }. With `layout` ({ path, offset, size }: a chunked
 * fp16w graph's externalData path, widened.offset and size), its FLOAT16 initializers in the
 * external data point at their float32 bytes in the widened external data (widenChunk).
 */
export function widenFp16Initializers(input, layout = null) {
  if (!LITTLE_ENDIAN) fail('widening needs a little-endian host');
  const started = globalThis.performance ? performance.now() : Date.now();
  const bytes = input instanceof Uint8Array ? input : new Uint8Array(input);
  const stats = { tensors: 0, values: 0 };
  const tensor = (from, to) => {
    const widened = widenTensor(bytes, from, to, layout);
    if (!widened) return null;
    stats.tensors += 1;
    stats.values += widened.count;
    return widened.pieces;
  };
  const graph = (from, to) => rewrite(bytes, from, to, GRAPH_INITIALIZER, tensor);
  const pieces = rewrite(bytes, 0, bytes.length, MODEL_GRAPH, graph);
  const out = new Uint8Array(size(pieces));
  let offset = 0;
  for (const piece of pieces) {
    out.set(piece, offset);
    offset += piece.byteLength;
  }
  const ms = (globalThis.performance ? performance.now() : Date.now()) - started;
  return { bytes: out, tensors: stats.tensors, values: stats.values, ms };
}

function checkChunk(coded, planes, out, outOffset) {
  if (coded.length % 2 || (out.byteOffset + outOffset) % 4 || outOffset + 2 * coded.length > out.length || (planes !== 1 && planes !== 2)) {
    fail(`a chunk of ${coded.length} bytes in ${planes} planes does not widen to byte ${outOffset} of ${out.length}`);
  }
}

/**
 * One chunk of fp16 values to widen, as shipped (`planes` 2: low bytes, then high bytes; 1: as
 * is), written as float32 into `out` at `outOffset` (a multiple of 4). Returns the value count.
 */
export function widenChunk(coded, planes, out, outOffset) {
  if (!LITTLE_ENDIAN) fail('widening needs a little-endian host');
  checkChunk(coded, planes, out, outOffset);
  const count = coded.length / 2;
  const table = halfToFloatBits();
  const wide = new Uint32Array(out.buffer, out.byteOffset + outOffset, count);
  if (planes === 2) for (let i = 0; i < count; i++) wide[i] = table[coded[i] | (coded[count + i] << 8)];
  else for (let i = 0, j = 0; i < count; i++, j += 2) wide[i] = table[coded[j] | (coded[j + 1] << 8)];
  return count;
}

const now = () => (globalThis.performance ? performance.now() : Date.now());

/** The worker could not start or died: the work is redone on this thread. */
class WorkerDown extends Error {}

/**
 * Widening for one load, off the main thread: the helper Worker (loader/worker.js) widens the
 * graph and every chunk sent to it. Where none can start (Node, a CSP that forbids it, a
 * cross-origin loader), or it dies, the same functions run on this thread. `where` says where the
 * work ran, `why` why not in a Worker; `ms` is the widening time (in the Worker, its own).
 */
export class Widener {
  constructor(signal = null) {
    this.where = 'worker';
    this.why = null;
    this.ms = 0;
    this.worker = null;
    this.pending = new Map();
    this.nextId = 0;
    this.signal = signal;
    this.decoderSent = false;
    if (typeof Worker !== 'function' || typeof window === 'undefined') {
      this.fallBack('no Worker here');
      return;
    }
    try {
      // This exact pattern (a literal relative URL inside `new Worker`) is what bundlers recognise
      // and emit as a worker chunk of its own; anything else would start the app's chunk.
      this.worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module', name: 'pack-widen' });
    } catch (error) {
      this.fallBack(error && error.message ? error.message : String(error));
      return;
    }
    this.worker.onmessage = ({ data }) => {
      const waiting = this.pending.get(data.id);
      this.pending.delete(data.id);
      if (data.error) waiting.reject(new PackLoadError(data.error));
      else waiting.resolve(data);
    };
    this.aborted = () => {
      for (const waiting of this.pending.values()) waiting.reject(signal.reason);
      this.pending.clear();
      this.close();
    };
    if (signal) signal.addEventListener('abort', this.aborted, { once: true });
    // A worker that cannot load (CSP, cross-origin script) fires 'error' before any message.
    this.worker.onerror = (event) => {
      if (event && event.preventDefault) event.preventDefault();
      const why = `worker failed to start${event && event.message ? `: ${event.message}` : ''}`;
      for (const waiting of this.pending.values()) waiting.reject(new WorkerDown(why));
      this.pending.clear();
      this.fallBack(why);
    };
  }

  fallBack(why) {
    if (this.worker) this.worker.terminate();
    this.worker = null;
    this.where = typeof window !== 'undefined' ? 'main thread' : 'this thread';
    this.why = this.why || why;
  }

  ask(message, transfer) {
    return new Promise((resolve, reject) => {
      if (this.signal && this.signal.aborted) {
        reject(this.signal.reason); // an aborted load stops widening too
        return;
      }
      const id = this.nextId++;
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, ...message }, transfer);
    });
  }

  /** widenChunk, in the Worker: the float32 bytes come back and are copied into place. */
  async chunk(coded, planes, out, outOffset) {
    checkChunk(coded, planes, out, outOffset);
    if (this.worker) {
      const copy = coded.slice(); // what goes over is moved: the fetched bytes may be shared with another caller of Files.get
      try {
        const { wide, ms } = await this.ask({ kind: 'chunk', coded: copy.buffer, planes }, [copy.buffer]);
        out.set(new Uint8Array(wide), outOffset);
        this.ms += ms;
        return;
      } catch (error) {
        if (!(error instanceof WorkerDown)) throw error;
      }
    }
    const started = now();
    widenChunk(coded, planes, out, outOffset);
    this.ms += now() - started;
  }

  /**
   * A brotli body decoded by the package's decoder (`decoder`: { module, wasm } bytes, sent to the
   * Worker once), in the Worker where it runs: the decoded bytes (Uint8Array).
   */
  async decode(body, decoder) {
    if (this.worker) {
      const copy = body.slice();
      const transfer = [copy.buffer];
      const message = { kind: 'brotli', body: copy.buffer };
      if (!this.decoderSent) {
        message.decoder = { module: decoder.module.slice().buffer, wasm: decoder.wasm.slice().buffer };
        transfer.push(message.decoder.module, message.decoder.wasm);
      }
      try {
        const promise = this.ask(message, transfer);
        this.decoderSent = true;
        const { bytes, ms } = await promise;
        this.ms += ms;
        return new Uint8Array(bytes);
      } catch (error) {
        this.decoderSent = false;
        if (!(error instanceof WorkerDown)) throw error;
      }
    }
    const started = now();
    const decompress = await wasmDecoder(decoder.module, decoder.wasm);
    const bytes = decompress(body);
    this.ms += now() - started;
    return bytes;
  }

  /** widenFp16Initializers(bytes, layout), in the Worker where it runs: { bytes, tensors, values, ms }. */
  async graph(bytes, layout = null) {
    if (this.worker) {
      const copy = bytes.slice();
      try {
        const result = await this.ask({ kind: 'graph', bytes: copy.buffer, layout }, [copy.buffer]);
        this.ms += result.ms;
        return { ...result, bytes: new Uint8Array(result.bytes) };
      } catch (error) {
        if (!(error instanceof WorkerDown)) throw error;
      }
    }
    const result = widenFp16Initializers(bytes, layout);
    this.ms += result.ms;
    return result;
  }

  close() {
    if (this.signal && this.aborted) this.signal.removeEventListener('abort', this.aborted);
    if (this.worker) this.worker.terminate();
    this.worker = null;
    for (const waiting of this.pending.values()) waiting.reject(new WorkerDown('closed'));
    this.pending.clear();
  }

  /** The 'widen' event's where, why and ms. */
  facts() {
    return { where: this.where, ...(this.why ? { why: this.why } : {}), ms: this.ms };
  }
}

/**
 * The bytes onnxruntime-web gets for `variant`: the package file, widened when the manifest says
 * so (in a Worker where one starts, else here). Emits { type: 'widen', variant, where, ms, tensors, bytes }.
 */
export async function variantBytes(files, manifest, variant, signal, emit = () => {}) {
  const spec = manifest.variants[variant];
  const bytes = await files.get(spec.model, signal);
  if (!spec.widen) return bytes;
  if (spec.widen !== WIDEN) throw new PackLoadError(`manifest.json variants.${variant}.widen "${spec.widen}" is unknown to this loader (it knows "${WIDEN}"); update loader.js`);
  const widener = new Widener(signal);
  try {
    const result = await widener.graph(bytes);
    emit({ type: 'widen', variant, ...widener.facts(), tensors: result.tensors, bytes: result.bytes.byteLength });
    return result.bytes;
  } finally {
    widener.close();
  }
}
