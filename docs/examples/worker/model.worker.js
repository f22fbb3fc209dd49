// The app's own module Worker: it imports the package's loader, loads the model and runs it, so
// downloads, decoding, session creation (WebGPU compiles here) and every run happen off the page's
// main thread. The page talks to it by messages: { type: 'load', packageUrl } once, then
// { type: 'run', id, feeds } (feeds as { data, dims, type }); it answers 'progress', 'ready',
// { type: 'result', id, outputs } or { type: 'error', id?, message }.

/** @type {any} */
let model = null;

globalThis.onmessage = async ({ data }) => {
  try {
    if (data.type === 'load') {
      const pack = await import(data.packageUrl + 'loader.js');
      model = await pack.load({ onProgress: (/** @type {any} */ event) => postMessage({ type: 'progress', event }) });
      // The sample is the package's own input; a real app sends its data in 'run'.
      const sample = await model.sampleFeeds();
      const feeds = Object.fromEntries(Object.entries(sample).map(([name, t]) => [name, { data: t.data, dims: [...t.dims], type: t.type }]));
      postMessage({ type: 'ready', info: model.info, inWorker: typeof window === 'undefined', sample: feeds });
    } else if (data.type === 'run') {
      const outputs = await model.run(data.feeds);
      const plain = Object.fromEntries(Object.entries(outputs).map(([name, t]) => [name, { data: t.data, dims: [...t.dims], type: t.type }]));
      // the output arrays move to the page without a copy
      postMessage({ type: 'result', id: data.id, outputs: plain }, Object.values(plain).map((t) => t.data.buffer));
    }
  } catch (error) {
    postMessage({ type: 'error', id: data.id, message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
  }
};
