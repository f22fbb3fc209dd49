// Nothing pack-specific: the loader is an ordinary ES module dependency. webpack 5 sees the
// loader's `new Worker(new URL('./worker.js', import.meta.url))` and emits its helper Worker as a
// chunk of its own; onnxruntime-web is imported by the loader at run time (webpackIgnore).
import { fileURLToPath } from 'node:url';

export default {
  mode: 'production',
  entry: './src/index.js',
  output: { path: fileURLToPath(new URL('./dist', import.meta.url)), filename: 'app.[contenthash].js', chunkFilename: 'chunk.[name].[contenthash].js', clean: true },
};
