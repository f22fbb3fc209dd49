import { defineConfig } from 'vite';

// Nothing pack-specific but the two headers: the loader is an ordinary ES module dependency, and it
// imports onnxruntime-web from the package's URL at run time, so the bundler never sees the runtime.
// COOP + COEP make the page cross-origin isolated, which wasm threads need: without them
// onnxruntime-web runs on one thread (the loader says so once in the console and in info.threadsWhy).
// Files from another origin (the CDN) then need CORS, which `pack publish --cors` sets.
const crossOriginIsolation = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
};

export default defineConfig({
  server: { headers: crossOriginIsolation },
  preview: { headers: crossOriginIsolation },
});
