// Fakes for the loader's node tests: a manifest, an onnxruntime-like module, a Storage.

export function manifest(overrides = {}) {
  return {
    schema: 2,
    name: 'demo',
    files: {
      'model.fp32.aaaaaaaaaaaaaaaa.onnx': { sha256: 'a'.repeat(64), size: 10 },
      'model.fp16.bbbbbbbbbbbbbbbb.onnx': { sha256: 'b'.repeat(64), size: 6 },
    },
    variants: {
      fp16: { precision: 'fp16', model: 'model.fp16.bbbbbbbbbbbbbbbb.onnx', requires: ['shader-f16'] },
      fp32: { precision: 'fp32', model: 'model.fp32.aaaaaaaaaaaaaaaa.onnx', requires: [] },
    },
    variantFor: { webgpu: ['fp16', 'fp32'], wasm: ['fp32'] },
    runtime: { package: 'onnxruntime-web', version: '1.30.0', bundles: { webgpu: { module: 'w.mjs', wasm: 'w.wasm' }, wasm: { module: 'm.mjs', wasm: 'm.wasm' } } },
    epOptions: {},
    sample: { file: 'sample.cccccccccccccccc.bin', tensors: {}, outputs: {} },
    loader: { watchdogMs: 30000, prewarm: true, select: 'chain' },
    thresholds: {},
    license: 'MIT',
    executionProviders: { desktop: ['webgpu', 'wasm'], 'apple-mobile': ['wasm'], android: ['webgpu', 'wasm'] },
    inputs: [{ name: 'x', dtype: 'float32', shape: [1, 4] }],
    outputs: [{ name: 'y', dtype: 'float32', shape: [1, 4], kind: 'tensor' }],
    verification: { browser: true, passed: true, runs: [] },
    measurements: [],
    ...overrides,
  };
}

export const run = (bundle, ep, variant, status, extra = {}) => ({ stage: 'browser', bundle, ep, variant, status, ...extra });

export class Tensor {
  constructor(type, data, dims) {
    Object.assign(this, { type, data, dims: Array.from(dims) });
  }
}

/**
 * An ort whose sessions compute y = f(x) for each (ep, variant): behaviours[`${ep}/${variant}`] =
 * { delayMs, scale (output = x * scale), createError, runError }.
 */
export function fakeOrt(behaviours, log = []) {
  return {
    Tensor,
    InferenceSession: {
      async create(bytes, options) {
        const spec = options.executionProviders[0];
        const ep = typeof spec === 'string' ? spec : spec.name;
        const variant = new TextDecoder().decode(bytes);
        const behaviour = behaviours[`${ep}/${variant}`] || {};
        log.push(['create', ep, variant]);
        if (behaviour.createError) throw new Error(behaviour.createError);
        let released = false;
        return {
          async run(feeds) {
            log.push(['run', ep, variant]);
            if (behaviour.runError) throw new Error(behaviour.runError);
            const start = performance.now();
            while (performance.now() - start < (behaviour.delayMs || 0)) {
              // busy wait: the trial measures wall time
            }
            const x = feeds.x.data;
            return { y: new Tensor('float32', Float32Array.from(x, (v) => v * (behaviour.scale ?? 1)), feeds.x.dims) };
          },
          async release() {
            released = true;
            log.push(['release', ep, variant]);
          },
          get released() {
            return released;
          },
        };
      },
    },
  };
}

export function memoryStorage() {
  const items = new Map();
  return {
    getItem: (key) => (items.has(key) ? items.get(key) : null),
    setItem: (key, value) => items.set(key, String(value)),
    removeItem: (key) => items.delete(key),
    items,
  };
}
