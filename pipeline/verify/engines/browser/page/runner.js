// The browser side of every browser run pack makes: served at /__pack__/page/runner.js (with
// runner.html) by pipeline/verify/engines/browser/pages.py, beside what runs.
//
// Two kinds of run:
// - 'package': a built package through its own loader.js (what ships is what is verified), fed
//   the package's sample inputs. Pass 'timed' uses production settings (the session options the
//   package ships, default logging, no profiling) and times session creation, the first run and
//   the median steady run; pass 'profile' is the separate, labelled pass with verbose logs (node
//   placement) and onnxruntime's profiler (kernel times), one run, never timed.
// - 'model': a raw ONNX model on one onnxruntime-web bundle and EP, outside any package (`pack
//   inspect`, `pack diagnose`), fed tensors sent from Python.
// Python starts a run with packRunner.start(kind, options) and polls window.__packResult, so a run
// that blocks the main thread still ends at the Python-side watchdog. Tensors cross as base64 of
// their little-endian bytes.
//
// Tensors (dtype -> typed array, the sample file's inputs) and the sample's download are the loader's own code
// (web_template/loader/tensors.js, files.js), served at /__pack__/loader/ beside this page for every run,
// a package's or a scratch folder's.

import { Files, ProgressTracker } from '../loader/files.js';
import { readSample, typedArrayFor } from '../loader/tensors.js';

const packageRoot = new URL('/', location.href);

async function fetchOk(path) {
  const response = await fetch(new URL(path, packageRoot), {cache: 'no-store'});
  if (!response.ok) throw new Error(`GET ${path}: HTTP ${response.status}`);
  return response;
}

// The package's files as the loader's readSample() reads them: pack's own files.js (not the
// package's copy), each checked against its sha256, a file in parts (manifest "split") joined; no cache.
function packageFiles(manifest) {
  return new Files({baseUrl: packageRoot, manifest, cache: null, progress: new ProgressTracker(null), emit: () => {}, signal: null});
}

function toBase64(view) {
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let binary = '';
  for (let start = 0; start < bytes.length; start += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(start, start + 0x8000));
  }
  return btoa(binary);
}

function fromBase64(text) {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
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

function gpuMemory() {
  const memory = window.__packGpuMemory;
  return memory ? {peak_bytes: memory.peak, live_bytes: memory.live, buffers: memory.buffers} : null;
}

const PROFILE_SESSION_OPTIONS = {logSeverityLevel: 0, logVerbosityLevel: 0, enableProfiling: true};

async function runPackage(options) {
  const timings = {};
  const events = [];
  let stage = 'manifest';
  let model = null;
  const now = () => performance.now();
  const profile = options.pass === 'profile';
  try {
    const manifest = await (await fetchOk('manifest.json')).json();
    stage = 'sample';
    // read here rather than through the package's loader so a loader fault cannot alter the inputs
    const {feeds} = await readSample(packageFiles(manifest), manifest);
    stage = 'session-create';
    const loadOptions = {
      executionProviders: [options.ep],
      variant: options.variant,
      select: 'chain', // one forced (EP, variant): no measured trials
      allowRefused: true, // verification re-runs pairs an earlier build refused
      runtime: options.runtime, // a shipped bundle key, or {module, wasm} URLs (another runtime)
      watchdogMs: options.watchdogMs,
      prewarm: false,
      cache: false,
      onEvent: (event) => events.push(JSON.parse(JSON.stringify(event ?? null))),
    };
    if (options.numThreads) loadOptions.numThreads = options.numThreads;
    // production settings leave sessionOptions alone: the loader's own are what users get
    if (profile) loadOptions.sessionOptions = PROFILE_SESSION_OPTIONS;
    const {load} = await import(new URL('loader.js', packageRoot).href);
    let start = now();
    // the loader allows 3 watchdogs for creation (download + compile + session); so do we
    model = await withWatchdog(load(loadOptions), 3 * options.watchdogMs, 'session creation');
    timings.session_create_ms = now() - start;
    stage = 'first-run';
    start = now();
    const outputs = await withWatchdog(model.run(feeds), options.watchdogMs, 'the first run');
    timings.first_run_ms = now() - start;
    if (!profile) {
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
      timings.steady_all_ms = steady;
      timings.steady_runs = steady.length;
    } else {
      stage = 'profiling';
      // the native WebGPU EP and the CPU EP print a Chrome trace to console.log here
      try { model.session?.endProfiling?.(); } catch (error) { events.push({type: 'endProfiling failed', message: String(error)}); }
    }
    const info = JSON.parse(JSON.stringify(model.info ?? {}));
    const memory = gpuMemory();
    stage = 'release';
    await model.release?.();
    model = null;
    return {ok: true, pass: options.pass, info, timings, events, gpuMemory: memory,
            outputs: profile ? {} : encodeOutputs(outputs), crossOriginIsolated};
  } catch (error) {
    try { await model?.release?.(); } catch { /* the session may be unusable after the failure */ }
    return {ok: false, pass: options.pass, stage, error: String(error?.message ?? error), timings, events,
            gpuMemory: gpuMemory(), crossOriginIsolated};
  }
}

const runtimes = new Map(); // module URL -> the imported onnxruntime-web (one per page and bundle)

async function runModel(options) {
  let stage = 'import';
  let session = null;
  try {
    if (!runtimes.has(options.module)) runtimes.set(options.module, import(options.module));
    const ort = await runtimes.get(options.module);
    ort.env.wasm.wasmPaths = options.glue ? {mjs: options.glue, wasm: options.wasm} : {wasm: options.wasm};
    ort.env.wasm.numThreads = 1;
    stage = 'session-create';
    session = await withWatchdog(ort.InferenceSession.create(options.model, {
      ...options.sessionOptions,
      executionProviders: [{name: options.ep, ...options.epOptions}],
    }), options.watchdogMs, 'session creation');
    if (!options.run) {
      await session.release();
      return {ok: true, stage: 'created', outputs: {}};
    }
    stage = 'run';
    const feeds = {};
    for (const [name, feed] of Object.entries(options.feeds)) {
      const TypedArray = typedArrayFor(feed.type);
      feeds[name] = new ort.Tensor(feed.type, new TypedArray(fromBase64(feed.bytes).buffer), feed.dims);
    }
    const results = await withWatchdog(session.run(feeds), options.watchdogMs, 'the run');
    const outputs = encodeOutputs(results);
    await session.release();
    return {ok: true, stage: 'done', outputs};
  } catch (error) {
    try { await session?.release(); } catch { /* unusable after the failure */ }
    return {ok: false, stage, error: String(error?.message ?? error)};
  }
}

const KINDS = {package: runPackage, model: runModel};

window.packRunner = {
  start(kind, options) {
    window.__packResult = null;
    const run = KINDS[kind];
    const done = run ? run(options) : Promise.resolve({ok: false, stage: 'start', error: `unknown run kind ${kind}`});
    done.then((result) => { window.__packResult = result; });
  },
};
window.__packRunnerReady = true;
