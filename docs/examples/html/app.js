// @ts-check
// A page with no build step: the loader is imported from where the package is published and
// finds the model and onnxruntime-web beside itself (no baseUrl needed). `tsc -p .` checks this
// file strictly against the package's loader.d.ts (tsconfig.json maps 'gtcrn' to it).

const params = new URLSearchParams(location.search);
const packageUrl = params.get('package') ?? 'https://cdn.example.com/models/gtcrn/';
const statusLine = /** @type {HTMLParagraphElement} */ (document.querySelector('#status'));

/** @type {{ ok: boolean, ep?: string | null, variant?: string | null, threads?: number, threadsWhy?: string | null, outputs?: Record<string, number[]>, firstResultMs?: number, error?: string }} */
let result;
try {
  const started = performance.now();
  /** @type {typeof import('gtcrn')} */
  const pack = await import(packageUrl + 'loader.js');
  const model = await pack.load();
  // The package's own sample input; a real page passes its data as { data, dims, type }.
  const outputs = await model.run(await model.sampleFeeds());
  const firstResultMs = Math.round(performance.now() - started);
  const dims = Object.fromEntries(Object.entries(outputs).map(([name, tensor]) => [name, [...tensor.dims]]));
  statusLine.textContent = `${model.info.ep}/${model.info.variant}: first result in ${firstResultMs} ms, outputs ${JSON.stringify(dims)}`;
  // wasm threads and why: one unless the server sends COOP/COEP (the loader also warns once in the console)
  result = { ok: true, ep: model.info.ep, variant: model.info.variant, threads: model.info.threads, threadsWhy: model.info.threadsWhy, outputs: dims, firstResultMs };
} catch (error) {
  const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  statusLine.textContent = message;
  result = { ok: false, error: message };
}
Object.assign(window, { example: result });
export {}; // a module: top-level await
