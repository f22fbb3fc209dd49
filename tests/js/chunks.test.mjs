import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { afterEach, test } from 'node:test';

import { CHUNK_CONCURRENCY, chunkPlan, deinterleave, interleave, mapLimit, planVariant, variantModel } from '../../web_template/loader/chunks.js';
import { PackIntegrityError, PackLoadError } from '../../web_template/loader/errors.js';
import { CACHE_KEY_PREFIX, Files, ProgressTracker } from '../../web_template/loader/files.js';

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
});

const digest = (bytes) => createHash('sha256').update(bytes).digest('hex');

test('byte planes: fp32 elements split into 4 planes, low byte first, and back', () => {
  const values = new Float32Array([1, -2, 0.5]);
  const bytes = new Uint8Array(values.buffer);
  const planar = deinterleave(bytes, 4);
  // plane 0 holds byte 0 of each element, plane 3 (sign and exponent) byte 3 of each.
  assert.deepEqual(Array.from(planar.subarray(0, 3)), [bytes[0], bytes[4], bytes[8]]);
  assert.deepEqual(Array.from(planar.subarray(9, 12)), [0x3f, 0xc0, 0x3f]);
  assert.deepEqual(new Float32Array(interleave(planar, 4).buffer), values);
});

test('interleave writes into a larger buffer at an offset, for every plane count', () => {
  for (const planes of [1, 2, 4, 8]) {
    const bytes = Uint8Array.from({ length: planes * 5 }, (_, i) => (i * 37 + planes) & 255);
    const out = new Uint8Array(bytes.length + 16).fill(7);
    interleave(deinterleave(bytes, planes), planes, out, 8);
    assert.deepEqual(Array.from(out.subarray(8, 8 + bytes.length)), Array.from(bytes), `planes ${planes}`);
    assert.deepEqual([out[7], out[8 + bytes.length]], [7, 7]);
  }
  assert.throws(() => interleave(new Uint8Array(6), 4), /do not split into 4 byte planes/);
});

function chunkedManifest(chunks, size = 24) {
  const files = { 'g.onnx': { sha256: 'a'.repeat(64), size: 3 } };
  for (const c of chunks) if (!c.unlisted) files[c.file] = { sha256: c.sha256 || 'b'.repeat(64), size: c.fileSize ?? c.size };
  return {
    files,
    variants: { fp32: { precision: 'fp32', model: 'g.onnx', requires: [], externalData: { path: 'w.weights', size, sha256: 'c'.repeat(64), chunks } } },
  };
}

test('the chunk plan: offsets, sizes and planes checked against the manifest before any download', () => {
  const chunks = [
    { file: 'p0.bin', offset: 0, size: 16, coding: { planes: 4 } },
    { file: 'p1.bin', offset: 16, size: 8, coding: { planes: 2 } },
  ];
  assert.deepEqual(chunkPlan(chunkedManifest(chunks), 'fp32'), {
    path: 'w.weights',
    size: 24,
    chunks: [
      { file: 'p0.bin', offset: 0, size: 16, planes: 4 },
      { file: 'p1.bin', offset: 16, size: 8, planes: 2 },
    ],
  });
  assert.equal(chunkPlan({ variants: { fp32: { model: 'g.onnx' } } }, 'fp32'), null);
  const broken = (change, pattern) => {
    const copy = chunks.map((c) => ({ ...c, coding: { ...c.coding } }));
    change(copy);
    assert.throws(() => chunkPlan(chunkedManifest(copy), 'fp32'), (e) => e instanceof PackLoadError && pattern.test(e.message));
  };
  broken((c) => (c[1].offset = 8), /chunks\[1\].*overlaps/);
  broken((c) => (c[1].size = 16), /chunks\[1\].*outside 24 bytes/);
  broken((c) => (c[0].coding.planes = 3), /chunks\[0\].coding.planes is 3/);
  broken((c) => Object.assign(c[1], { file: 'nope.bin', unlisted: true }), /"nope.bin" is not listed/);
  broken((c) => (c[1].fileSize = 7), /does not match its file/);
});

test('mapLimit runs at most `limit` tasks at once and keeps the order of results', async () => {
  let running = 0;
  let peak = 0;
  const results = await mapLimit([5, 1, 4, 2, 3, 0], 3, async (ms) => {
    running++;
    peak = Math.max(peak, running);
    await new Promise((r) => setTimeout(r, ms));
    running--;
    return ms * 10;
  });
  assert.equal(peak, 3);
  assert.deepEqual(results, [50, 10, 40, 20, 30, 0]);
});

/** A package of one chunked variant: weights of fp32 then fp16 elements, coded as the build does. */
function chunkedPackage() {
  const fp32 = new Uint8Array(new Float32Array([1.5, -2.25, 3, 4, 5, 6]).buffer);
  const fp16 = new Uint8Array(new Uint16Array([0x3c00, 0xc000, 0x3800, 0x4400]).buffer);
  const weights = new Uint8Array([...fp32, ...fp16]);
  const parts = [
    { file: 'p0.bin', offset: 0, size: 16, planes: 4 },
    { file: 'p1.bin', offset: 16, size: 8, planes: 4 },
    { file: 'p2.bin', offset: 24, size: 8, planes: 2 },
  ];
  const served = { 'g.onnx': new Uint8Array([8, 9, 10]) };
  const chunks = parts.map((p) => {
    served[p.file] = deinterleave(weights.subarray(p.offset, p.offset + p.size), p.planes);
    return { file: p.file, offset: p.offset, size: p.size, sha256: digest(weights.subarray(p.offset, p.offset + p.size)), coding: { planes: p.planes } };
  });
  const manifest = {
    files: Object.fromEntries(Object.entries(served).map(([path, bytes]) => [path, { sha256: digest(bytes), size: bytes.length }])),
    variants: { fp32: { precision: 'fp32', model: 'g.onnx', requires: [], externalData: { path: 'w.weights', size: weights.length, sha256: digest(weights), chunks } } },
  };
  return { manifest, served, weights };
}

function serve(served, { failOnce = new Set(), corrupt = new Set() } = {}) {
  const requests = [];
  globalThis.fetch = async (url) => {
    const path = new URL(url).pathname.slice(1);
    requests.push(path);
    if (failOnce.has(path)) {
      failOnce.delete(path);
      throw new TypeError('Failed to fetch');
    }
    const bytes = Uint8Array.from(served[path]);
    if (corrupt.has(path)) bytes[0] ^= 1;
    return new Response(bytes);
  };
  return requests;
}

function store(manifest, cache = null) {
  const events = [];
  const progress = [];
  const files = new Files({ baseUrl: new URL('https://cdn.test/'), manifest, cache, progress: new ProgressTracker((p) => progress.push(p)), emit: (e) => events.push(e), signal: null });
  return { files, events, progress };
}

test('a chunked variant: chunks fetched, checked, re-interleaved into the external data onnxruntime-web gets', async () => {
  const { manifest, served, weights } = chunkedPackage();
  const requests = serve(served);
  const { files, progress } = store(manifest);
  planVariant(files, manifest, 'fp32');
  const model = await variantModel(files, manifest, 'fp32', null);
  assert.deepEqual(Array.from(model.bytes), [8, 9, 10]);
  assert.equal(model.externalData.length, 1);
  assert.equal(model.externalData[0].path, 'w.weights');
  assert.deepEqual(Array.from(model.externalData[0].data), Array.from(weights));
  assert.deepEqual(requests.sort(), ['g.onnx', 'p0.bin', 'p1.bin', 'p2.bin']);
  // Progress in bytes, against the planned total of the graph and every chunk.
  assert.deepEqual([progress.at(-1).loaded, progress.at(-1).total], [3 + 32, 3 + 32]);
});

test('a failed chunk is fetched again alone; the others are not refetched', async () => {
  const { manifest, served, weights } = chunkedPackage();
  const requests = serve(served, { failOnce: new Set(['p1.bin']) });
  const { files, events } = store(manifest);
  const model = await variantModel(files, manifest, 'fp32', null, { retryMs: 1 });
  assert.deepEqual(Array.from(model.externalData[0].data), Array.from(weights));
  assert.deepEqual(requests.filter((p) => p === 'p1.bin').length, 2);
  for (const other of ['p0.bin', 'p2.bin', 'g.onnx']) assert.equal(requests.filter((p) => p === other).length, 1, other);
  assert.deepEqual(events.filter((e) => e.type === 'retry').map((e) => [e.file, e.attempt]), [['p1.bin', 1]]);
});

test('a corrupted chunk is caught by its hash, names its file and is not retried', async () => {
  const { manifest, served } = chunkedPackage();
  const requests = serve(served, { corrupt: new Set(['p2.bin']) });
  const { files } = store(manifest);
  await assert.rejects(
    variantModel(files, manifest, 'fp32', null, { retryMs: 1 }),
    (e) => e instanceof PackIntegrityError && e.file === 'p2.bin' && /p2.bin: sha256 mismatch/.test(e.message),
  );
  assert.equal(requests.filter((p) => p === 'p2.bin').length, 1);
});

test('a chunk that keeps failing gives up after its attempts with the network error', async () => {
  const { manifest, served } = chunkedPackage();
  const requests = [];
  globalThis.fetch = async (url) => {
    const path = new URL(url).pathname.slice(1);
    requests.push(path);
    if (path === 'p0.bin') throw new TypeError('Failed to fetch');
    return new Response(served[path]);
  };
  const { files } = store(manifest);
  await assert.rejects(variantModel(files, manifest, 'fp32', null, { retryMs: 1, attempts: 3 }), /Failed to fetch/);
  assert.equal(requests.filter((p) => p === 'p0.bin').length, 3);
});

test('a one-file variant is just its bytes', async () => {
  const served = { 'm.onnx': new Uint8Array([1, 2]) };
  serve(served);
  const manifest = { files: { 'm.onnx': { sha256: digest(served['m.onnx']), size: 2 } }, variants: { fp32: { model: 'm.onnx' } } };
  const { files } = store(manifest);
  const model = await variantModel(files, manifest, 'fp32', null);
  assert.deepEqual(Array.from(model.bytes), [1, 2]);
  assert.equal(model.externalData, undefined);
});

test('each chunk is cached on its own: a load after a failed one fetches only what is missing', async () => {
  const { manifest, served, weights } = chunkedPackage();
  const entries = new Map();
  const cache = {
    match: async (key) => (entries.has(key) ? new Response(entries.get(key)) : undefined),
    put: async (key, response) => entries.set(key, new Uint8Array(await response.arrayBuffer())),
    delete: async (key) => entries.delete(key),
  };
  // First load: p2.bin keeps failing, the load fails, the other chunks stay cached.
  const requests = [];
  globalThis.fetch = async (url) => {
    const path = new URL(url).pathname.slice(1);
    requests.push(path);
    if (path === 'p2.bin') throw new TypeError('Failed to fetch');
    return new Response(served[path]);
  };
  await assert.rejects(variantModel(store(manifest, cache).files, manifest, 'fp32', null, { retryMs: 1, attempts: 2 }), /Failed to fetch/);
  for (const file of ['p0.bin', 'p1.bin']) assert.ok(entries.has(CACHE_KEY_PREFIX + manifest.files[file].sha256), file);
  // Second load: only the missing chunk goes to the network.
  const again = serve(served);
  const model = await variantModel(store(manifest, cache).files, manifest, 'fp32', null);
  assert.deepEqual(again, ['p2.bin']);
  assert.deepEqual(Array.from(model.externalData[0].data), Array.from(weights));
});

test('from Cache Storage a chunked variant holds at most CHUNK_CONCURRENCY chunks at once beside its weights, and keeps none', async () => {
  // Ten chunks, every one cached: each is read, checked and copied into the one weights buffer
  // before the next read starts in its slot, so the weights never sit beside all of their chunks.
  const count = 10;
  const weights = Uint8Array.from({ length: count * 8 }, (_, i) => (i * 29) & 255);
  const served = { 'g.onnx': new Uint8Array([1, 2, 3]) };
  const chunks = [];
  for (let i = 0; i < count; i++) {
    served[`p${i}.bin`] = weights.slice(i * 8, i * 8 + 8);
    chunks.push({ file: `p${i}.bin`, offset: i * 8, size: 8, sha256: digest(served[`p${i}.bin`]), coding: { planes: 1 } });
  }
  const manifest = {
    files: Object.fromEntries(Object.entries(served).map(([path, bytes]) => [path, { sha256: digest(bytes), size: bytes.length }])),
    variants: { fp32: { precision: 'fp32', model: 'g.onnx', requires: [], externalData: { path: 'w.weights', size: weights.length, sha256: digest(weights), chunks } } },
  };
  const bySha = Object.fromEntries(Object.entries(served).map(([path, bytes]) => [CACHE_KEY_PREFIX + manifest.files[path].sha256, { path, bytes }]));
  const cache = {
    match: async (key) => {
      await new Promise((resolve) => setTimeout(resolve, 2)); // reads overlap, as Cache Storage's do
      return new Response(bySha[key].bytes);
    },
    put: async () => assert.fail('nothing is downloaded, so nothing is cached again'),
    delete: async () => assert.fail('no cached chunk is corrupt'),
  };
  globalThis.fetch = async (url) => assert.fail(`fetched ${url}: every file is in Cache Storage`);
  const { files, events } = store(manifest, cache);
  // A chunk's bytes live from its read until the task that read it has copied them into place;
  // that task then reads the next: at any moment at most the chunks being read are held.
  let reading = 0;
  let peak = 0;
  const get = files.get.bind(files);
  files.get = (path, signal) => {
    if (path === 'g.onnx') return get(path, signal);
    reading++;
    peak = Math.max(peak, reading);
    const bytes = get(path, signal);
    bytes.finally(() => reading--);
    return bytes;
  };
  const model = await variantModel(files, manifest, 'fp32', null);
  assert.deepEqual(Array.from(model.externalData[0].data), Array.from(weights));
  assert.equal(events.filter((e) => e.type === 'cache-hit').length, count + 1);
  assert.ok(peak <= CHUNK_CONCURRENCY && CHUNK_CONCURRENCY < count, `at most ${CHUNK_CONCURRENCY} of ${count} chunks at once, saw ${peak}`);
  assert.equal(files.pending.size, 0); // Files keeps no chunk's bytes after it is placed
});

// --- fp16w in chunks: fp16 values at the end of the external data, widened into place ---------

const text = (s) => Array.from(s, (c) => c.charCodeAt(0));
const field = (number, bytes) => [number * 8 + 2, bytes.length, ...bytes]; // lengths < 128 here
const entry = (key, value) => field(13, [...field(1, text(key)), ...field(2, text(value))]);

/** ModelProto { graph { initializer w: FLOAT16 [4], external data at `offset`, 8 bytes } } */
function fp16wGraph(offset, location = 'w.weights') {
  const tensor = [0x08, 4, 0x10, 10, ...field(8, text('w')), ...entry('location', location), ...entry('offset', String(offset)), ...entry('length', '8'), 0x70, 1];
  return Uint8Array.from(field(7, field(5, tensor)));
}

/** The same graph widened: FLOAT, offset 24 + 2 × 0, length 2 × 8; every other byte as it was. */
function expectedWidenedGraph() {
  const tensor = [0x08, 4, 0x10, 1, ...field(8, text('w')), ...entry('location', 'w.weights'), ...entry('offset', '24'), ...entry('length', '16'), 0x70, 1];
  return Uint8Array.from(field(7, field(5, tensor)));
}

function widenedPackage() {
  const { manifest, served, weights } = chunkedPackage(); // fp32 [0, 24), fp16 [24, 32)
  served['g.onnx'] = fp16wGraph(24);
  manifest.files['g.onnx'] = { sha256: digest(served['g.onnx']), size: served['g.onnx'].length };
  const spec = manifest.variants.fp32;
  spec.precision = 'fp16w';
  spec.widen = 'fp16-initializers';
  spec.externalData.widened = { offset: 24, size: 40, sha256: 'd'.repeat(64) };
  manifest.variants = { fp16w: spec };
  return { manifest, served, weights };
}

test('fp16w in chunks: fp16 chunks widened into place, the graph pointed at their float32 bytes', async () => {
  const { manifest, served, weights } = widenedPackage();
  serve(served);
  const { files, events } = store(manifest);
  const model = await variantModel(files, manifest, 'fp16w', null);
  const data = model.externalData[0].data;
  assert.equal(data.byteLength, 40);
  assert.deepEqual(Array.from(data.subarray(0, 24)), Array.from(weights.subarray(0, 24))); // before the offset: as shipped
  assert.deepEqual(Array.from(new Float32Array(data.buffer, 24, 4)), [1, -2, 0.5, 4]);
  assert.deepEqual(Array.from(model.bytes), Array.from(expectedWidenedGraph()));
  const widen = events.filter((e) => e.type === 'widen');
  assert.deepEqual(widen.map(({ variant, where, tensors, bytes }) => ({ variant, where, tensors, bytes })), [{ variant: 'fp16w', where: 'this thread', tensors: 1, bytes: model.bytes.byteLength + 40 }]);
});

test('fp16w in chunks: a corrupted fp16 chunk is caught by its hash before widening', async () => {
  const { manifest, served } = widenedPackage();
  serve(served, { corrupt: new Set(['p2.bin']) });
  const { files } = store(manifest);
  await assert.rejects(variantModel(files, manifest, 'fp16w', null, { retryMs: 1 }), (e) => e instanceof PackIntegrityError && e.file === 'p2.bin');
});

test('fp16w in chunks: the widened layout is checked against the manifest and the graph', async () => {
  const broken = (change, pattern) => {
    const { manifest } = widenedPackage();
    change(manifest.variants.fp16w);
    assert.throws(() => chunkPlan(manifest, 'fp16w'), (e) => e instanceof PackLoadError && pattern.test(e.message));
  };
  broken((v) => delete v.widen, /widened is given, but the variant has no widen/);
  broken((v) => delete v.externalData.widened, /has widen "fp16-initializers" but no widened layout/);
  broken((v) => (v.externalData.widened.size = 42), /widened \(offset 24, size 42\)/);
  broken((v) => Object.assign(v.externalData.widened, { offset: 20, size: 44 }), /chunks\[1\].*one side of widened.offset 20/);
  broken((v) => (v.externalData.chunks[2].coding.planes = 4), /chunks\[2\].*4 planes/);
  const { manifest } = widenedPackage();
  assert.deepEqual(chunkPlan(manifest, 'fp16w').widened, { offset: 24, size: 40 });
  // a graph whose FLOAT16 initializer lies before the fp16 values, or names other data, is refused
  for (const [graph, pattern] of [[fp16wGraph(16), /bytes 16-24 of the external data, outside its fp16 values \(24-32\)/], [fp16wGraph(24, 'x.weights'), /external data other than 'w.weights'/]]) {
    const { manifest: m, served } = widenedPackage();
    served['g.onnx'] = graph;
    m.files['g.onnx'] = { sha256: digest(graph), size: graph.length };
    serve(served);
    await assert.rejects(variantModel(store(m).files, m, 'fp16w', null), (e) => e instanceof PackLoadError && pattern.test(e.message));
  }
});
