// A Vite app that runs a pack package: the loader comes from npm (`npm install ../../../dist/gtcrn`)
// and is bundled with the app; the model and onnxruntime-web come from where the package is
// published (VITE_PACK_BASE_URL), fetched and sha256-checked by the loader at run time.
import { load, PackLoadError, type LoaderEvent, type ModelInfo } from 'gtcrn';

declare global {
  interface Window {
    example?: { ok: boolean; info?: ModelInfo; outputs?: Record<string, number[]>; firstResultMs?: number; decodedIn?: string[]; error?: string };
  }
}

const baseUrl: string = import.meta.env.VITE_PACK_BASE_URL ?? 'https://cdn.example.com/models/gtcrn/';
const status = document.querySelector<HTMLParagraphElement>('#status')!;

async function main(): Promise<void> {
  const started = performance.now();
  // Where the loader decoded `.br` bodies itself (a host that serves them as they are): its own
  // helper Worker, or the main thread where that Worker could not start.
  const decodedIn = new Set<string>();
  const onEvent = (event: LoaderEvent): void => {
    if (event.type === 'download' && event.decodedIn) decodedIn.add(event.decodedIn);
  };
  const model = await load({ baseUrl, onEvent });
  // The package's own sample input; a real app passes its data as { data, dims, type }.
  const outputs = await model.run(await model.sampleFeeds());
  const firstResultMs = Math.round(performance.now() - started);
  const dims = Object.fromEntries(Object.entries(outputs).map(([name, tensor]) => [name, [...tensor.dims]]));
  status.textContent = `${model.info.ep}/${model.info.variant}: first result in ${firstResultMs} ms, outputs ${JSON.stringify(dims)}`;
  window.example = { ok: true, info: model.info, outputs: dims, firstResultMs, decodedIn: [...decodedIn] };
}

main().catch((error: unknown) => {
  const message = error instanceof PackLoadError ? `${error.name}: ${error.message}` : String(error);
  status.textContent = message;
  window.example = { ok: false, error: message };
});
