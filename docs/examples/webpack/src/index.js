// A webpack app that runs a pack package: the loader comes from npm (`npm install <package folder>`)
// and is bundled with the app; the model and onnxruntime-web come from where the package is
// published (?package=URL, default below), fetched and sha256-checked by the loader at run time.
import { load } from 'gtcrn';

const baseUrl = new URLSearchParams(location.search).get('package') ?? 'https://cdn.example.com/models/gtcrn/';
const status = document.querySelector('#status');

async function main() {
  const started = performance.now();
  const decodedIn = new Set(); // where `.br` bodies were decoded on a host that serves them as they are
  const model = await load({ baseUrl, onEvent: (event) => event.type === 'download' && event.decodedIn && decodedIn.add(event.decodedIn) });
  const outputs = await model.run(await model.sampleFeeds());
  const firstResultMs = Math.round(performance.now() - started);
  const dims = Object.fromEntries(Object.entries(outputs).map(([name, tensor]) => [name, [...tensor.dims]]));
  status.textContent = `${model.info.ep}/${model.info.variant}: first result in ${firstResultMs} ms, outputs ${JSON.stringify(dims)}`;
  window.example = { ok: true, info: model.info, outputs: dims, firstResultMs, decodedIn: [...decodedIn] };
}

main().catch((error) => {
  status.textContent = String(error);
  window.example = { ok: false, error: String(error) };
});
