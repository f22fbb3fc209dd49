// The page: it starts the app's model Worker (model.worker.js) and only sends and receives
// messages; the loader, onnxruntime-web and the model live in the Worker, so a long session
// creation or run never blocks this thread (its longest task is reported below).

const params = new URLSearchParams(location.search);
const packageUrl = params.get('package') ?? 'https://cdn.example.com/models/gtcrn/';
const statusLine = /** @type {HTMLParagraphElement} */ (document.querySelector('#status'));

// the main thread's longest task (Chromium's Long Tasks API lists those over 50 ms)
let longestMainTaskMs = 0;
if (typeof PerformanceObserver === 'function' && PerformanceObserver.supportedEntryTypes.includes('longtask')) {
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) longestMainTaskMs = Math.max(longestMainTaskMs, Math.round(entry.duration));
  }).observe({ type: 'longtask', buffered: true });
}

const worker = new Worker(new URL('./model.worker.js', import.meta.url), { type: 'module' });
/** @type {Map<number, (message: any) => void>} */
const waiting = new Map();
let nextId = 0;
/** @param {Record<string, { data: ArrayBufferView, dims: number[], type: string }>} feeds */
const run = (feeds) => new Promise((resolve, reject) => {
  const id = nextId++;
  waiting.set(id, (message) => (message.type === 'error' ? reject(new Error(message.message)) : resolve(message.outputs)));
  worker.postMessage({ type: 'run', id, feeds });
});

const started = performance.now();
worker.onmessage = async ({ data }) => {
  if (data.type === 'progress') {
    const { phase, state, loaded, total } = data.event;
    statusLine.textContent = phase === 'download' ? `downloading ${Math.round((100 * loaded) / total)}%` : `${phase} ${state}`;
  } else if (data.type === 'ready') {
    try {
      const outputs = await run(data.sample);
      const firstResultMs = Math.round(performance.now() - started);
      const dims = Object.fromEntries(Object.entries(outputs).map(([name, t]) => [name, t.dims]));
      statusLine.textContent = `${data.info.ep}/${data.info.variant} in a Worker: first result in ${firstResultMs} ms, outputs ${JSON.stringify(dims)}`;
      Object.assign(window, { example: { ok: true, inWorker: data.inWorker, info: data.info, outputs: dims, firstResultMs, longestMainTaskMs } });
    } catch (error) {
      Object.assign(window, { example: { ok: false, error: String(error) } });
    }
  } else if (data.type === 'result' || (data.type === 'error' && waiting.has(data.id))) {
    const answer = waiting.get(data.id);
    waiting.delete(data.id);
    answer(data);
  } else if (data.type === 'error') {
    statusLine.textContent = data.message;
    Object.assign(window, { example: { ok: false, error: data.message } });
  }
};
worker.postMessage({ type: 'load', packageUrl });
