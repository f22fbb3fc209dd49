// The loader's helper Worker: widens fp16w graphs and chunks (widen.js) and decodes `.br` bodies
// with the package's brotli decoder (brotli.js), off the page's main thread. widen.js's Widener
// starts it as `new Worker(new URL('./worker.js', import.meta.url), { type: 'module' })`: a file
// of its own, so a bundler (Vite, webpack) that sees that pattern emits this module and what it
// imports as a worker chunk, never the app's entry chunk; unbundled, it is the package's own
// loader/worker.js. Messages: { id, kind: 'brotli' | 'chunk' | 'graph', ... } → { id, ..., ms } or
// { id, error }.

import { wasmDecoder } from './brotli.js';
import { widenChunk, widenFp16Initializers } from './widen.js';

const now = () => performance.now();
// The decoder's module and wasm bytes come with the first brotli body and serve every later one.
let decoderBytes = null;

globalThis.onmessage = async ({ data }) => {
  const { id, kind } = data;
  try {
    if (kind === 'brotli') {
      if (data.decoder) decoderBytes = data.decoder;
      const started = now();
      const decompress = await wasmDecoder(new Uint8Array(decoderBytes.module), new Uint8Array(decoderBytes.wasm));
      const bytes = decompress(new Uint8Array(data.body));
      globalThis.postMessage({ id, bytes: bytes.buffer, ms: now() - started }, [bytes.buffer]);
    } else if (kind === 'chunk') {
      const started = now();
      const coded = new Uint8Array(data.coded);
      const wide = new Uint8Array(2 * coded.length);
      widenChunk(coded, data.planes, wide, 0);
      globalThis.postMessage({ id, wide: wide.buffer, ms: now() - started }, [wide.buffer]);
    } else {
      const result = widenFp16Initializers(new Uint8Array(data.bytes), data.layout);
      globalThis.postMessage({ id, bytes: result.bytes.buffer, tensors: result.tensors, values: result.values, ms: result.ms }, [result.bytes.buffer]);
    }
  } catch (error) {
    globalThis.postMessage({ id, error: error && error.message ? error.message : String(error) });
  }
};
