import { defineConfig } from 'vite';

// Nothing pack-specific: the loader is an ordinary ES module dependency, and it imports
// onnxruntime-web from the package's URL at run time, so the bundler never sees the runtime.
export default defineConfig({});
