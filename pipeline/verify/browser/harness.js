// Browser side of `pack verify`: served at /__pack__/harness.js next to the package under test.
// It drives the package's own loader.js (what ships is what is verified), feeds the package's
// sample inputs, times session creation and runs, and hands outputs back as raw bytes (base64).
// Python starts a run with packHarness.start(options) and polls window.__packResult, so a run that
// blocks the main thread still ends at the Python-side watchdog.

const packageRoot = new URL('../', import.meta.url);

const TYPED_ARRAYS = {
  float32: Float32Array, float64: Float64Array,
  float16: globalThis.Float16Array ?? Uint16Array,
  int8: Int8Array, uint8: Uint8Array, int16: Int16Array, uint16: Uint16Array,
  int32: Int32Array, uint32: Uint32Array, int64: BigInt64Array, uint64: BigUint64Array,
  bool: Uint8Array,
};

async function fetchOk(path) {
  const response = await fetch(new URL(path, packageRoot), {cache: 'no-store'});
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return response;
}

async function sampleFeeds(manifest) {
  const sample = manifest.sample;
  const bytes = await (await fetchOk(sample.file)).arrayBuffer();
  const feeds = {};
  for (const [name, tensor] of Object.entries(sample.tensors)) {
    const TypedArray = TYPED_ARRAYS[tensor.dtype];
    if (!TypedArray) throw new Error(`sample tensor ${name}: dtype ${tensor.dtype} is not supported`);
    if (tensor.offset + tensor.length > bytes.byteLength) {
      throw new Error(`sample tensor ${name}: bytes ${tensor.offset}+${tensor.length} beyond ${sample.file} (${bytes.byteLength} bytes)`);
    }
    // slice() copies, so every tensor starts at offset 0 with its own alignment
    const data = new TypedArray(bytes.slice(tensor.offset, tensor.offset + tensor.length));
    feeds[name] = {data, dims: tensor.dims, type: tensor.dtype};
  }
  return feeds;
}

function toBase64(view) {
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let binary = '';
  for (let start = 0; start < bytes.length; start += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(start, start + 0x8000));
  }
  return btoa(binary);
}

function encodeOutputs(outputs) {
  const encoded = {};
  for (const [name, tensor] of Object.entries(outputs)) {
    const data = tensor.data;
    if (!ArrayBuffer.isView(data)) {
      encoded[name] = {type: tensor.type, dims: Array.from(tensor.dims), error: `output data is ${typeof data}, not a typed array`};
      continue;
    }
    encoded[name] = {type: tensor.type, dims: Array.from(tensor.dims), bytes: toBase64(data)};
  }
  return encoded;
}

function withWatchdog(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`watchdog: ${what} did not finish within ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function loadThroughLoader(options) {
  const {load} = await import(new URL('loader.js', packageRoot).href);
  return load(options);
}

async function run(options) {
  const timings = {};
  const events = [];
  let stage = 'manifest';
  let model = null;
  const now = () => performance.now();
  try {
    const manifest = await (await fetchOk('manifest.json')).json();
    stage = 'sample';
    // read here rather than through the loader's sampleFeeds so a loader fault cannot alter the inputs
    const feeds = await sampleFeeds(manifest);
    stage = 'session-create';
    const loadOptions = {
      executionProviders: [options.ep],
      variant: options.variant,
      allowRefused: true, // verification re-runs pairs an earlier build refused
      runtime: options.runtime, // a shipped bundle key, or {module, wasm} URLs (diagnostic --bundle)
      sessionOptions: {logSeverityLevel: 0, logVerbosityLevel: 0, enableProfiling: true},
      watchdogMs: options.watchdogMs,
      prewarm: false,
      cache: false,
      onEvent: (event) => events.push(JSON.parse(JSON.stringify(event ?? null))),
    };
    let start = now();
    // the loader allows 3 watchdogs for creation (download + compile + session); so do we
    model = await withWatchdog(loadThroughLoader(loadOptions), 3 * options.watchdogMs, 'session creation');
    timings.session_create_ms = now() - start;
    stage = 'first-run';
    start = now();
    const outputs = await withWatchdog(model.run(feeds), options.watchdogMs, 'the first run');
    timings.first_run_ms = now() - start;
    stage = 'steady-run';
    const steady = [];
    const budgetEnd = now() + options.steadyBudgetMs;
    while (steady.length < options.steadyRuns && (steady.length === 0 || now() < budgetEnd)) {
      start = now();
      await withWatchdog(model.run(feeds), options.watchdogMs, 'a steady run');
      steady.push(now() - start);
    }
    steady.sort((a, b) => a - b);
    timings.steady_run_ms = steady.length ? steady[Math.floor(steady.length / 2)] : null;
    timings.steady_runs = steady.length;
    stage = 'profiling';
    // the native WebGPU EP and the CPU EP print a Chrome trace to console.log here
    try { model.session?.endProfiling?.(); } catch (error) { events.push({type: 'endProfiling failed', message: String(error)}); }
    const info = JSON.parse(JSON.stringify(model.info ?? {}));
    stage = 'release';
    await model.release?.();
    model = null;
    return {ok: true, info, timings, events, outputs: encodeOutputs(outputs), crossOriginIsolated};
  } catch (error) {
    try { await model?.release?.(); } catch { /* the session may be unusable after the failure */ }
    return {ok: false, stage, error: String(error?.message ?? error), timings, events, crossOriginIsolated};
  }
}

window.packHarness = {
  start(options) {
    window.__packResult = null;
    run(options).then((result) => { window.__packResult = result; });
  },
};
window.__packHarnessReady = true;
