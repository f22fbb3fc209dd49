// The package as an app loads it (pipeline/verify/engines/browser/default_load.py): import the
// package's own loader.js, call load() with nothing but its base URL (the manifest's defaults:
// pre-warm, the platform chain, the selection mode), run the sample, and hand back the outputs
// (base64, little-endian) with model.info. A failure comes back as { ok: false, message, fallbacks }.
// Every answer carries the page's facts (isolation, SharedArrayBuffer, navigator.gpu) and the
// console warnings the page heard itself: WebDriver classic (WebKit) gives the driver no console.
//
// A visit is { platform, cold }. `platform` (the test hook of the build's default loads per
// platform chain): before the loader is imported, the page presents navigator's userAgent,
// platform and maxTouchPoints of a device of that platform, the only facts the loader's
// detectPlatform reads, so load() takes that platform's chain and thread rule as on the device;
// the engine stays what it is. `cold`: Cache Storage and localStorage are emptied first, as on a
// first visit; a visit without it (the reload) finds what the one before it cached.

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

// What detectPlatform (web_template/loader/policy.js) reads, per platform; desktop: the engine's own.
const DEVICES = {
  'apple-mobile': {
    userAgent: 'Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1',
    platform: 'iPhone',
    maxTouchPoints: 5,
  },
  android: {
    userAgent: 'Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0.0.0 Mobile Safari/537.36',
    platform: 'Linux armv8l',
    maxTouchPoints: 5,
  },
};

function presentAs(platform) {
  for (const [key, value] of Object.entries(DEVICES[platform] || {})) {
    Object.defineProperty(navigator, key, { get: () => value, configurable: true });
  }
}

async function emptyStorage() {
  if (typeof caches !== 'undefined') for (const key of await caches.keys()) await caches.delete(key);
  try {
    localStorage.clear(); // the measured selection's stored decisions
  } catch {
    // no localStorage on this page: nothing stored either
  }
}

const toBase64 = (view) => {
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(binary);
};

// The package files this page fetched over the network (Resource Timing: Cache Storage reads are
// not fetches), relative to the package: a reload from Cache Storage fetches none of the hashed ones.
const fetchedFiles = (base) =>
  performance
    .getEntriesByType('resource')
    .filter((entry) => entry.initiatorType === 'fetch' && entry.name.startsWith(base))
    .map((entry) => entry.name.slice(base.length).split('?')[0]);

const plain = (value) => JSON.parse(JSON.stringify(value ?? null));

async function defaultLoad(base, { platform = null, cold = false } = {}) {
  if (platform) presentAs(platform);
  if (cold) await emptyStorage();
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
    return { ok: true, info, outputs: encoded, loadMs, totalMs: performance.now() - started, page: pageFacts(), warnings: [...warnings], fetched: fetchedFiles(base) };
  } catch (error) {
    return { ok: false, name: error && error.name, message: String((error && error.message) || error), fallbacks: plain(error && error.fallbacks) || [],
             totalMs: performance.now() - started, page: pageFacts(), warnings: [...warnings] };
  }
}

window.__packDefaultLoad = defaultLoad;
// For a driver that polls rather than awaits one long call (webkit.py: WebDriver classic): start
// the load; its answer lands in window.__packDefaultLoadAnswer.
window.__packStartDefaultLoad = (base, visit) => {
  window.__packDefaultLoadAnswer = null;
  defaultLoad(base, visit).then((answer) => { window.__packDefaultLoadAnswer = answer; });
};
