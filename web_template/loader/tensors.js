// Tensors: dtype → typed array, feeds checked against the manifest, the sample file's inputs and
// reference outputs, and values as plain numbers.

import { PackLoadError } from './errors.js';

const TYPED_ARRAYS = {
  float32: Float32Array,
  float64: Float64Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
};

export function typedArrayFor(dtype) {
  if (dtype === 'float16') return globalThis.Float16Array || Uint16Array;
  const array = TYPED_ARRAYS[dtype];
  if (!array) throw new PackLoadError(`dtype "${dtype}" has no typed array in this loader`);
  return array;
}

/** Dims with symbolic (string/negative) entries replaced by 1. */
export function concreteDims(shape) {
  return (shape || []).map((d) => (typeof d === 'number' && d >= 0 ? d : 1));
}

export const count = (dims) => dims.reduce((a, b) => a * b, 1);

export function shapesOf(tensors) {
  return Object.fromEntries(Object.entries(tensors).map(([name, t]) => [name, Array.from(t.dims)]));
}

export function declaredShapes(specs) {
  return Object.fromEntries((specs || []).map((s) => [s.name, s.shape || null]));
}

function tensorFrom(ort, name, value, spec) {
  if (value instanceof ort.Tensor) return value;
  if (value && typeof value === 'object' && 'data' in value && 'dims' in value) {
    const type = value.type || (spec && spec.dtype);
    return new ort.Tensor(type, value.data, Array.from(value.dims, Number));
  }
  throw new TypeError(`run(): feed "${name}" must be { data, dims, type } or an onnxruntime Tensor`);
}

/** Tensors keyed by input name; TypeError (no fallback) for a caller's mistake. */
export function prepareFeeds(ort, manifest, feeds) {
  if (!feeds || typeof feeds !== 'object') throw new TypeError('run(feeds): feeds must be an object keyed by input name');
  const specs = manifest.inputs || [];
  const names = specs.map((s) => s.name);
  const tensors = {};
  for (const spec of specs) {
    if (!(spec.name in feeds)) throw new TypeError(`run(): missing input "${spec.name}" (inputs: ${names.join(', ')})`);
    const tensor = tensorFrom(ort, spec.name, feeds[spec.name], spec);
    if (spec.dtype && tensor.type !== spec.dtype) {
      throw new TypeError(`run(): input "${spec.name}" is ${tensor.type}, the model takes ${spec.dtype}`);
    }
    const shape = spec.shape || [];
    const fixedMismatch = shape.some((d, i) => typeof d === 'number' && d >= 0 && tensor.dims[i] !== d);
    if (spec.shape && (tensor.dims.length !== shape.length || fixedMismatch)) {
      throw new TypeError(`run(): input "${spec.name}" has dims [${tensor.dims}], the model takes [${shape}]`);
    }
    tensors[spec.name] = tensor;
  }
  for (const name of Object.keys(feeds)) {
    if (!names.includes(name)) throw new TypeError(`run(): unknown input "${name}" (inputs: ${names.join(', ')})`);
  }
  return tensors;
}

/** float32 → IEEE half bits (round to nearest even), for float16 inputs without Float16Array. */
export function floatToHalf(value) {
  const f32 = new Float32Array([value]);
  const bits = new Uint32Array(f32.buffer)[0];
  const sign = (bits >>> 16) & 0x8000;
  const exponent = ((bits >>> 23) & 0xff) - 127 + 15;
  let mantissa = bits & 0x7fffff;
  if (exponent >= 31) return sign | 0x7c00;
  if (exponent <= 0) {
    if (exponent < -10) return sign;
    mantissa |= 0x800000;
    const shift = 14 - exponent;
    let half = mantissa >> shift;
    if ((mantissa >> (shift - 1)) & 1 && (mantissa & ((1 << (shift - 1)) - 1) || half & 1)) half += 1;
    return sign | half;
  }
  let half = sign | (exponent << 10) | (mantissa >> 13);
  if (mantissa & 0x1000 && (mantissa & 0x2fff)) half += 1;
  return half;
}

/**
 * Where the pre-warm run's value for one input comes from: 'sample' when the manifest carries the
 * sample's values for it (small inputs: scalars, selectors such as a sample rate, small vectors;
 * pipeline/sample_file.py PREWARM_VALUES_MAX_ELEMENTS) and they fit the dims the run uses, else
 * 'zeros' (big tensors: signal, images, states, where zeros are a valid input).
 */
export function prewarmSource(sampleTensor, dims) {
  const values = sampleTensor && sampleTensor.values;
  return Array.isArray(values) && values.length === count(dims) ? 'sample' : 'zeros';
}

function filled(dtype, values) {
  const Array_ = typedArrayFor(dtype);
  if (Array_ === BigInt64Array || Array_ === BigUint64Array) return Array_.from(values, (v) => BigInt(Math.trunc(v)));
  if (dtype === 'float16' && Array_ === Uint16Array) return Uint16Array.from(values, floatToHalf);
  if (dtype === 'bool') return Uint8Array.from(values, (v) => (v ? 1 : 0));
  return Array_.from(values);
}

/**
 * Feeds for the pre-warm run, without fetching the sample file: each input in the sample's dims
 * when described (else its declared shape), holding the sample's own values where the manifest
 * carries them (prewarmSource) and zeros elsewhere.
 */
export function prewarmFeeds(ort, manifest) {
  const sampleTensors = (manifest.sample && manifest.sample.tensors) || {};
  const feeds = {};
  for (const spec of manifest.inputs || []) {
    const described = sampleTensors[spec.name];
    const dims = described ? Array.from(described.dims) : concreteDims(spec.shape);
    const dtype = spec.dtype || 'float32';
    const data = prewarmSource(described, dims) === 'sample' ? filled(dtype, described.values) : new (typedArrayFor(dtype))(count(dims));
    feeds[spec.name] = new ort.Tensor(dtype, data, dims);
  }
  return feeds;
}

/**
 * { name: { data, dims, type } } for `specs` ({ name: { dtype, dims, offset, length } }) read out
 * of `bytes` (the sample file); PackLoadError when a tensor lies outside the file.
 */
export function decodeTensors(bytes, specs, file = 'sample') {
  const tensors = {};
  for (const [name, t] of Object.entries(specs || {})) {
    if (!(t.offset >= 0 && t.length >= 0 && t.offset + t.length <= bytes.byteLength)) {
      throw new PackLoadError(`manifest.json sample "${name}": bytes ${t.offset}+${t.length} lie beyond ${file} (${bytes.byteLength} bytes); rebuild the package`);
    }
    // slice() copies, so every typed array starts aligned.
    const buffer = bytes.slice(t.offset, t.offset + t.length).buffer;
    const Array_ = typedArrayFor(t.dtype);
    tensors[name] = { data: new Array_(buffer), dims: Array.from(t.dims), type: t.dtype };
  }
  return tensors;
}

/** Whether the manifest lists the build's fp32 reference outputs for the sample. */
export function hasReference(manifest) {
  const outputs = manifest.sample && manifest.sample.outputs;
  return Boolean(outputs && Object.keys(outputs).length > 0);
}

/**
 * The sample's input feeds and, when the manifest lists them, the build's fp32 reference outputs
 * (else null). The file may be stored in parts (manifest "split"): `files` joins them.
 */
export async function readSample(files, manifest, signal) {
  const sample = manifest.sample;
  if (!sample || !sample.file) throw new PackLoadError('manifest.json has no "sample"; rebuild the package with a sample input');
  const bytes = await files.get(sample.file, signal);
  const feeds = decodeTensors(bytes, sample.tensors, sample.file);
  return { feeds, reference: hasReference(manifest) ? decodeTensors(bytes, sample.outputs, sample.file) : null };
}

export function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

/** A tensor's values as plain numbers (float16 stored as Uint16Array decoded; 64-bit ints as Number). */
export function numbers(tensor) {
  const { data, type } = tensor;
  if (type === 'float16' && data instanceof Uint16Array) return Float32Array.from(data, halfToFloat);
  if (data instanceof BigInt64Array || data instanceof BigUint64Array) return Float64Array.from(data, Number);
  return data;
}
