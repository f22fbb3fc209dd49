// The package's own onnxruntime-web build, imported from sha256-checked bytes; the WebGPU adapter
// probe; the thread count.

import { PackLoadError, messageOf, sleep, throwIfAborted } from './errors.js';

const MAX_THREADS = 4;

// One ort module per build per page: its wasm instance and env are global to it.
const runtimes = new Map();

function moduleBlobUrl(bytes) {
  // A blob: URL keeps the bytes that were checked as the bytes that run. It is never revoked:
  // the wasm threads start their workers from it (import.meta.url).
  return URL.createObjectURL(new Blob([bytes], { type: 'text/javascript' }));
}

async function importVerifiedModule(bytes, url, emit) {
  const blobUrl = moduleBlobUrl(bytes);
  try {
    return await import(/* webpackIgnore: true */ /* @vite-ignore */ blobUrl);
  } catch (error) {
    URL.revokeObjectURL(blobUrl);
    emit({
      type: 'warning',
      message: `importing the runtime from a blob: URL failed (${messageOf(error)}; a Content-Security-Policy without blob:?); importing ${url} directly`,
    });
    return await import(/* webpackIgnore: true */ /* @vite-ignore */ url);
  }
}

function configureOrt(ort, { threads, wasmUrl, wasmBytes, glueUrl, adapter }) {
  ort.env.wasm.numThreads = threads;
  ort.env.wasm.proxy = false;
  // Never a third-party CDN: the .wasm is the package's own, as a blob: URL of the verified bytes
  // when we have them (`wasmBinary` would be simpler, but releases before 1.24 then resolve a file
  // name against the blob: module URL and fail with "Invalid URL"); releases up to 1.22 import
  // emscripten's glue module apart from the bundle (`mjs`).
  const wasm = wasmBytes ? URL.createObjectURL(new Blob([wasmBytes], { type: 'application/wasm' })) : wasmUrl;
  ort.env.wasm.wasmPaths = glueUrl ? { mjs: glueUrl, wasm } : { wasm };
  if (adapter && ort.env.webgpu) ort.env.webgpu.adapter = adapter;
}

/** The shipped bundle key whose module and wasm URLs are `override`'s, else null. */
export function shippedBundleAt(manifest, baseUrl, override) {
  const at = (path) => new URL(path, baseUrl).href;
  for (const [key, bundle] of Object.entries(manifest.runtime.bundles || {})) {
    if (at(bundle.module) === at(String(override.module)) && at(bundle.wasm) === at(String(override.wasm))) return key;
  }
  return null;
}

/** The ort module for a bundle key (or an override), downloading its files when needed. */
export function loadRuntime({ files, manifest, bundleKey, override, threads, adapter, emit }) {
  if (override) {
    const moduleUrl = new URL(override.module, files.baseUrl).href;
    const wasmUrl = new URL(override.wasm, files.baseUrl).href;
    const key = `url:${moduleUrl}`;
    if (!runtimes.has(key)) {
      runtimes.set(
        key,
        import(/* webpackIgnore: true */ /* @vite-ignore */ moduleUrl).then((ort) => {
          configureOrt(ort, { threads, wasmUrl, glueUrl: override.glue ? new URL(override.glue, files.baseUrl).href : null, adapter });
          return ort;
        }),
      );
    }
    return { planned: [], ort: () => runtimes.get(key) };
  }
  const bundle = manifest.runtime.bundles[bundleKey];
  if (!bundle || !bundle.module || !bundle.wasm) {
    throw new PackLoadError(`manifest.json runtime.bundles.${bundleKey} needs "module" and "wasm"; rebuild the package`);
  }
  const key = `sha256:${files.entry(bundle.module).sha256}`;
  const planned = runtimes.has(key) ? [] : [bundle.module, bundle.wasm, ...(bundle.glue ? [bundle.glue] : [])];
  planned.forEach((path) => files.plan(path));
  const ort = () => {
    if (!runtimes.has(key)) {
      const promise = (async () => {
        const [moduleBytes, wasmBytes, glueBytes] = await Promise.all([files.get(bundle.module), files.get(bundle.wasm), bundle.glue ? files.get(bundle.glue) : null]);
        const ort = await importVerifiedModule(moduleBytes, files.url(bundle.module), emit);
        const glueUrl = glueBytes ? moduleBlobUrl(glueBytes) : null;
        configureOrt(ort, { threads, wasmUrl: files.url(bundle.wasm), wasmBytes, glueUrl, adapter });
        return ort;
      })();
      runtimes.set(key, promise);
      promise.catch(() => runtimes.delete(key));
    }
    return runtimes.get(key);
  };
  return { planned, ort };
}

/** { vendor, architecture, description } of a GPUAdapter (adapter.info, or the older requestAdapterInfo()). */
export async function adapterInfo(adapter) {
  if (!adapter) return null;
  let info = adapter.info;
  if (!info && typeof adapter.requestAdapterInfo === 'function') info = await adapter.requestAdapterInfo().catch(() => null);
  info = info || {};
  return { vendor: info.vendor || '', architecture: info.architecture || '', description: info.description || '' };
}

// requestAdapter() has returned null on a first call in a fresh browser on real GPUs (an H200,
// docs/gpu.md: found on the second), so a null is asked once more; and each request that finds no
// adapter prints "No available adapters." in Chromium's console, so no more than that (four tries
// printed it four times per load). A page found without an adapter keeps that answer for every later
// load(); a found adapter is asked for again per load (onnxruntime takes its device).
const ADAPTER_ATTEMPTS = 2;
const ADAPTER_RETRY_MS = 150;
let noAdapter = null; // why this page has no adapter, once its requests found none

/** { adapter, attempts, reason }: the page's WebGPU adapter, else why there is none. */
export async function probeWebGpu(signal) {
  const gpu = globalThis.navigator && navigator.gpu;
  if (!gpu) return { adapter: null, attempts: 0, reason: 'WebGPU is unavailable: navigator.gpu is undefined in this browser' };
  if (noAdapter) return { adapter: null, attempts: 0, reason: noAdapter };
  let lastError = null;
  for (let attempt = 1; attempt <= ADAPTER_ATTEMPTS; attempt++) {
    throwIfAborted(signal);
    try {
      const adapter = await gpu.requestAdapter();
      if (adapter) return { adapter, attempts: attempt, reason: null };
    } catch (error) {
      lastError = error;
    }
    if (attempt < ADAPTER_ATTEMPTS) await sleep(ADAPTER_RETRY_MS);
  }
  const why = lastError ? `threw ${messageOf(lastError)}` : 'returned null';
  noAdapter = `WebGPU is unavailable: requestAdapter() ${why} ${ADAPTER_ATTEMPTS} times`;
  return { adapter: null, attempts: ADAPTER_ATTEMPTS, reason: noAdapter };
}

/** Forget that the page has no adapter (tests). */
export function forgetAdapter() {
  noAdapter = null;
}

const NOT_ISOLATED =
  'the page is not cross-origin isolated (crossOriginIsolated false: serve it with Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp)';

const NO_SHARED_MEMORY =
  'this browser has no SharedArrayBuffer although the page is cross-origin isolated (typeof SharedArrayBuffer is "undefined", as in WebKitGTK): onnxruntime-web runs one thread';

/**
 * What wasm threads need, as this page has it: { isolated: crossOriginIsolated is true, shared:
 * SharedArrayBuffer exists }. Both are needed: WebKit has been seen isolated without
 * SharedArrayBuffer, where onnxruntime-web runs one thread whatever numThreads says.
 */
export function threadFacts(env = globalThis) {
  return { isolated: env.crossOriginIsolated === true, shared: typeof env.SharedArrayBuffer !== 'undefined' };
}

/**
 * { threads, why } for the wasm EP: the thread count that really runs and, in words, why it is
 * that. `shared`: SharedArrayBuffer exists (threadFacts). `emit` hears why a requested count was
 * lowered.
 */
export function threadPlan({ numThreads, isolated, shared = true, platform, cores }, emit = () => {}) {
  if (numThreads !== undefined) {
    if (!(Number(numThreads) >= 1)) throw new PackLoadError(`numThreads must be a number >= 1, got ${numThreads}`);
    if (numThreads > 1 && !isolated) {
      emit({ type: 'warning', message: 'numThreads > 1 needs a cross-origin isolated page (COOP/COEP); using 1' });
      return { threads: 1, why: `numThreads ${numThreads} asked, but ${NOT_ISOLATED}` };
    }
    if (numThreads > 1 && !shared) {
      emit({ type: 'warning', message: 'numThreads > 1 needs SharedArrayBuffer, which this browser lacks; using 1' });
      return { threads: 1, why: `numThreads ${numThreads} asked, but ${NO_SHARED_MEMORY}` };
    }
    return { threads: Math.max(1, Math.floor(numThreads)), why: 'the numThreads option' };
  }
  // iOS has hung with threads under cross-origin isolation. Elsewhere set it explicitly:
  // onnxruntime-web's own default is 1 thread on 2 cores even when isolated.
  if (platform === 'apple-mobile') return { threads: 1, why: 'Apple mobile: one thread (iOS has hung with wasm threads under cross-origin isolation)' };
  if (!isolated) return { threads: 1, why: NOT_ISOLATED };
  if (!shared) return { threads: 1, why: NO_SHARED_MEMORY };
  const threads = Math.max(1, Math.min(cores || 1, MAX_THREADS));
  return { threads, why: `cross-origin isolated: ${threads} of ${cores || 1} cores (at most ${MAX_THREADS})` };
}

let warnedSingleThread = false;

/**
 * Once per page, a console warning when wasm runs on one thread only because the page is not
 * cross-origin isolated, on a device with cores to spare (not Apple mobile, where one is chosen).
 * Returns whether it warned.
 */
export function warnSingleThread({ threads, isolated, platform, cores, chain }, warn = (text) => console.warn(text)) {
  if (warnedSingleThread || threads > 1 || isolated || platform === 'apple-mobile' || !(cores > 1) || !chain.includes('wasm')) return false;
  warnedSingleThread = true;
  warn(
    `[pack] wasm runs on 1 thread: ${NOT_ISOLATED}. With those headers it would use up to ${Math.min(cores, MAX_THREADS)} of this device's ${cores} cores.`,
  );
  return true;
}
