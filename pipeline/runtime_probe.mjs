// Which ONNX IR versions an onnxruntime-web package loads: under Node, creates a wasm session on a
// one-node model (y = Relu(x), opset 17) stamped with each IR version from 3 to 14, and prints
// JSON {"version", "loads": {ir: true|false}}. pipeline/runtime.py runs it once per release.
import { readFileSync, existsSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [packageDir] = process.argv.slice(2);
const { version } = JSON.parse(readFileSync(`${packageDir}/package.json`, 'utf8'));
// The wasm-only entry where the release has one, else the default one.
const entry = ['dist/ort.wasm.min.mjs', 'dist/ort.min.mjs'].find((name) => existsSync(`${packageDir}/${name}`));
const ort = await import(pathToFileURL(`${packageDir}/${entry}`).href);
ort.env.wasm.numThreads = 1;
// The model serialized by onnx: ir_version is its first field (0x08, then the version as one byte).
const model = Buffer.from('CAg6NQoOCgF4EgF5IgRSZWx1OgASAWdaDwoBeBIKCggIARIECgIIAmIPCgF5EgoKCAgBEgQKAggCQgQKABAR', 'base64');
const loads = {};
for (let ir = 3; ir <= 14; ir++) {
  const stamped = Uint8Array.from(model);
  stamped[1] = ir;
  try {
    const session = await ort.InferenceSession.create(stamped, { executionProviders: ['wasm'] });
    await session.release();
    loads[ir] = true;
  } catch {
    loads[ir] = false;
  }
}
console.log(JSON.stringify({ version, loads }));
