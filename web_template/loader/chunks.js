// Chunked weights (manifest.json variants[v].externalData): the model file is the graph without
// its weights; the weights are ONNX external data cut into chunk files. Chunks download in
// parallel (bounded), each checked against its sha256 and cached in Cache Storage on its own
// (Files); a chunk whose download fails is retried alone, the others are kept. Chunks coded as
// byte planes (byte k of every element together; pipeline/assets/chunks.py) are re-interleaved
// after the browser's native brotli decoding, into the one buffer onnxruntime-web receives as
// session option `externalData: [{ path, data }]`.
//
// An fp16w variant in chunks (`widen` and externalData.widened): the chunks from widened.offset on
// hold fp16 values; each is widened to float32 straight into its place in the widened buffer as
// it arrives (in widen.js's Worker where the page has one; nothing before that offset moves), and the graph is widened
// with that layout. The bytes are those pipeline/precision/fp16w.py gives the host checks.

import { PackLoadError } from './errors.js';
import { WIDEN, Widener, variantBytes } from './widen.js';

// Chromium opens 6 connections per origin over HTTP/1.1; leave some for the runtime files.
export const CHUNK_CONCURRENCY = 4;

/** Interleave `planes` byte planes of `planar` into elements, written to `out` at `outOffset`. */
export function interleave(planar, planes, out = new Uint8Array(planar.length), outOffset = 0) {
  const length = planar.length;
  if (planes === 1) {
    out.set(planar, outOffset);
    return out;
  }
  if (length % planes) throw new PackLoadError(`${length} bytes do not split into ${planes} byte planes`);
  const count = length / planes;
  for (let plane = 0; plane < planes; plane++) {
    const base = plane * count;
    let at = outOffset + plane;
    for (let i = 0; i < count; i++, at += planes) out[at] = planar[base + i];
  }
  return out;
}

/** The inverse of interleave: byte k of every `planes`-byte element, for k = 0 .. planes-1. */
export function deinterleave(bytes, planes) {
  if (planes === 1) return Uint8Array.from(bytes);
  if (bytes.length % planes) throw new PackLoadError(`${bytes.length} bytes are not whole ${planes}-byte elements`);
  const count = bytes.length / planes;
  const out = new Uint8Array(bytes.length);
  for (let plane = 0; plane < planes; plane++) {
    for (let i = 0; i < count; i++) out[plane * count + i] = bytes[i * planes + plane];
  }
  return out;
}

/**
 * The checked chunk list of a variant, or null when its model is one file. Every chunk must name a
 * listed file of its own size, lie inside the external data, not overlap the one before, and hold
 * whole elements of its plane count; a manifest that breaks this is rejected before any download.
 */
export function chunkPlan(manifest, variant) {
  const entry = manifest.variants && manifest.variants[variant];
  const external = entry && entry.externalData;
  if (!external) return null;
  const where = `manifest.json variants.${variant}.externalData`;
  const bad = (what) => new PackLoadError(`${where}: ${what}; rebuild the package`);
  if (typeof external.path !== 'string' || !Number.isSafeInteger(external.size) || !Array.isArray(external.chunks) || !external.chunks.length) {
    throw bad('needs path, size and a non-empty chunks list');
  }
  let end = 0;
  const chunks = external.chunks.map((chunk, index) => {
    const planes = chunk.coding && chunk.coding.planes;
    const file = manifest.files && manifest.files[chunk.file];
    if (![1, 2, 4, 8].includes(planes)) throw bad(`chunks[${index}].coding.planes is ${planes}, not 1, 2, 4 or 8`);
    if (!file) throw bad(`chunks[${index}].file "${chunk.file}" is not listed in files`);
    if (!Number.isSafeInteger(chunk.offset) || !Number.isSafeInteger(chunk.size) || chunk.offset < end || chunk.offset + chunk.size > external.size) {
      throw bad(`chunks[${index}] (offset ${chunk.offset}, size ${chunk.size}) overlaps another or lies outside ${external.size} bytes`);
    }
    if (file.size !== chunk.size || chunk.size % planes) throw bad(`chunks[${index}] size ${chunk.size} does not match its file (${file.size}) or its ${planes} planes`);
    end = chunk.offset + chunk.size;
    return { file: chunk.file, offset: chunk.offset, size: chunk.size, planes };
  });
  const widened = external.widened;
  if (!widened !== !entry.widen) throw bad(widened ? 'widened is given, but the variant has no widen' : `the variant has widen "${entry.widen}" but no widened layout`);
  if (!widened) return { path: external.path, size: external.size, chunks };
  const start = widened.offset;
  if (!Number.isSafeInteger(start) || start % 4 || start > external.size || widened.size !== start + 2 * (external.size - start)) {
    throw bad(`widened (offset ${start}, size ${widened.size}) is not a multiple of 4 within ${external.size} bytes, widened to offset + 2 × the rest`);
  }
  chunks.forEach((chunk, index) => {
    if (chunk.offset >= start ? (chunk.offset - start) % 2 || chunk.size % 2 || chunk.planes > 2 : chunk.offset + chunk.size > start) {
      throw bad(`chunks[${index}] (offset ${chunk.offset}, size ${chunk.size}, ${chunk.planes} planes) is not whole fp16 values on one side of widened.offset ${start}`);
    }
  });
  return { path: external.path, size: external.size, chunks, widened: { offset: start, size: widened.size } };
}

/** Plans the download sizes of a variant: its model file and any chunk files. */
export function planVariant(files, manifest, variant) {
  files.plan(manifest.variants[variant].model);
  const plan = chunkPlan(manifest, variant);
  if (plan) for (const chunk of plan.chunks) files.plan(chunk.file);
}

/** Runs `task(item)` over `items`, at most `limit` at a time; rejects with the first failure. */
export async function mapLimit(items, limit, task) {
  const results = new Array(items.length);
  let next = 0;
  let failed = null;
  const worker = async () => {
    while (next < items.length && !failed) {
      const index = next++;
      try {
        results[index] = await task(items[index], index);
      } catch (error) {
        failed = failed || { error };
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, items.length)) }, worker));
  if (failed) throw failed.error;
  return results;
}

/**
 * What onnxruntime-web needs to open a variant: { bytes } for a one-file model, { bytes,
 * externalData: [{ path, data }] } for a chunked one (chunks fetched in parallel, verified,
 * re-interleaved into place; fp16w: widened into place, and the graph widened).
 */
export async function variantModel(files, manifest, variant, signal, { concurrency = CHUNK_CONCURRENCY } = {}) {
  const plan = chunkPlan(manifest, variant);
  if (!plan) return { bytes: await variantBytes(files, manifest, variant, signal, files.emit) }; // widened where fp16w
  const spec = manifest.variants[variant];
  if (plan.widened && spec.widen !== WIDEN) throw new PackLoadError(`manifest.json variants.${variant}.widen "${spec.widen}" is unknown to this loader (it knows "${WIDEN}"); update loader.js`);
  const graph = files.get(spec.model, signal);
  graph.catch(() => {}); // awaited below, after the chunks
  const widened = plan.widened;
  const data = new Uint8Array(widened ? widened.size : plan.size);
  const widener = widened ? new Widener(signal) : null; // one Worker for the whole variant
  try {
    await mapLimit(plan.chunks, concurrency, async (chunk) => {
      // Files.get retries a transient failure of this chunk alone (files.js) and checks its sha256.
      const coded = await files.get(chunk.file, signal);
      if (widened && chunk.offset >= widened.offset) await widener.chunk(coded, chunk.planes, data, widened.offset + 2 * (chunk.offset - widened.offset));
      else interleave(coded, chunk.planes, data, chunk.offset);
    });
    if (!widened) return { bytes: await graph, externalData: [{ path: plan.path, data }] };
    const result = await widener.graph(await graph, { path: plan.path, offset: widened.offset, size: plan.size });
    const emit = files.emit || (() => {});
    emit({ type: 'widen', variant, ...widener.facts(), chunked: 'each chunk widened as it arrives', tensors: result.tensors, bytes: result.bytes.byteLength + data.byteLength });
    return { bytes: result.bytes, externalData: [{ path: plan.path, data }] };
  } finally {
    if (widener) widener.close();
  }
}
