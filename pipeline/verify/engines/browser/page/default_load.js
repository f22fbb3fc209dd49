// The package as an app loads it (pipeline/verify/engines/browser/default_load.py): import the
// package's own loader.js, call load() with nothing but its base URL (the manifest's defaults:
// pre-warm, the platform chain, the selection mode), run the sample, and hand back the outputs
// (base64, little-endian) with model.info. A failure comes back as { ok: false, message, fallbacks }.
// Every answer carries the page's facts (isolation, SharedArrayBuffer, navigator.gpu) and the
// console warnings the page heard itself: WebDriver classic (WebKit) gives the driver no console.

const warnings = [];
for (const level of ['warn', 'error']) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    if (warnings.length < 20) warnings.push(args.map(String).join(' ').slice(0, 400));
    original(...args);
  };
}

const pageFacts = () => ({
  userAgent: navigator.userAgent,
  crossOriginIsolated: self.crossOriginIsolated === true,
  sharedArrayBuffer: typeof SharedArrayBuffer !== 'undefined',
  webgpu: Boolean(navigator.gpu),
  cores: navigator.hardwareConcurrency || null,
});

const toBase64 = (view) => {
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(binary);
};

const plain = (value) => JSON.parse(JSON.stringify(value ?? null));

async function defaultLoad(base) {
  const started = performance.now();
  try {
    const { load } = await import(base + 'loader.js');
    const model = await load({ baseUrl: base });
    const loadMs = performance.now() - started;
    const outputs = await model.run(await model.sampleFeeds());
    const info = plain(model.info);
    await model.release();
    const encoded = {};
    for (const [name, tensor] of Object.entries(outputs)) {
      // float16 outputs where the browser has Float16Array: as float32
      const wide = tensor.type === 'float16' && !(tensor.data instanceof Uint16Array);
      encoded[name] = { type: wide ? 'float32' : tensor.type, dims: Array.from(tensor.dims), bytes: toBase64(wide ? Float32Array.from(tensor.data) : tensor.data) };
    }
    return { ok: true, info, outputs: encoded, loadMs, totalMs: performance.now() - started, page: pageFacts(), warnings: [...warnings] };
  } catch (error) {
    return { ok: false, name: error && error.name, message: String((error && error.message) || error), fallbacks: plain(error && error.fallbacks) || [],
             totalMs: performance.now() - started, page: pageFacts(), warnings: [...warnings] };
  }
}

window.__packDefaultLoad = defaultLoad;
// For a driver that polls rather than awaits one long call (webkit.py: WebDriver classic): start
// the load; its answer lands in window.__packDefaultLoadAnswer.
window.__packStartDefaultLoad = (base) => {
  window.__packDefaultLoadAnswer = null;
  defaultLoad(base).then((answer) => { window.__packDefaultLoadAnswer = answer; });
};
