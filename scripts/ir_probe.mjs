// Which ONNX IR versions an installed onnxruntime-web loads: creates a wasm session under Node on
// each model given (the same one-node graph stamped with different IR versions) and prints JSON
// {"version", "loads": {ir: true|false}}. Used by scripts/measure_ir_versions.py.
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [packageDir, ...models] = process.argv.slice(2);
const { version } = JSON.parse(readFileSync(`${packageDir}/package.json`, 'utf8'));
// The wasm-only bundle where the release has one, else the default one.
const ort = await import(pathToFileURL(`${packageDir}/dist/ort.wasm.min.mjs`).href)
  .catch(() => import(pathToFileURL(`${packageDir}/dist/ort.min.mjs`).href));
ort.env.wasm.numThreads = 1;
const loads = {};
for (const model of models) {
  const ir = model.match(/ir(\d+)\.onnx$/)[1];
  try {
    await ort.InferenceSession.create(readFileSync(model), { executionProviders: ['wasm'] });
    loads[ir] = true;
  } catch {
    loads[ir] = false;
  }
}
console.log(JSON.stringify({ version, loads }));
