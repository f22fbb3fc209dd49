import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { afterEach, test } from 'node:test';

import { PackIntegrityError, PackLoadError } from '../../web_template/loader/errors.js';
import { CACHE_KEY_PREFIX, Files, ProgressTracker, checkManifest, fetchManifest, packageBase, sha256Hex } from '../../web_template/loader/files.js';
import { manifest } from './helpers.mjs';

const realFetch = globalThis.fetch;
afterEach(() => {
  globalThis.fetch = realFetch;
});

const digest = (bytes) => createHash('sha256').update(bytes).digest('hex');

function serve(files) {
  const requests = [];
  globalThis.fetch = async (url) => {
    requests.push(url);
    const path = new URL(url).pathname.slice(1);
    if (!(path in files)) return new Response('missing', { status: 404, statusText: 'Not Found' });
    return new Response(files[path]);
  };
  return requests;
}

function fakeCache() {
  const entries = new Map();
  return {
    entries,
    match: async (key) => (entries.has(key) ? new Response(entries.get(key)) : undefined),
    put: async (key, response) => entries.set(key, new Uint8Array(await response.arrayBuffer())),
    delete: async (key) => entries.delete(key),
  };
}

function setup(files, listed, cache = null) {
  const manifest = { files: Object.fromEntries(Object.entries(listed).map(([path, bytes]) => [path, { sha256: digest(bytes), size: bytes.length }])) };
  const events = [];
  const progress = [];
  const tracker = new ProgressTracker((p) => progress.push(p), { clock: () => 7, started: 0 });
  const store = new Files({ baseUrl: new URL('https://cdn.test/pkg/'), manifest, cache, progress: tracker, emit: (e) => events.push(e), signal: null });
  return { store, events, progress, tracker, requests: serve(files) };
}

test('sha256Hex is the hex sha256', async () => {
  assert.equal(await sha256Hex(new TextEncoder().encode('abc')), digest('abc'));
});

test('a file is downloaded, checked, counted against the manifest size and cached by hash', async () => {
  const bytes = new Uint8Array([1, 2, 3, 4, 5]);
  const cache = fakeCache();
  const { store, events, progress, requests } = setup({ 'pkg/m.onnx': bytes }, { 'm.onnx': bytes }, cache);
  store.plan('m.onnx');
  assert.deepEqual(Array.from(await store.get('m.onnx')), [1, 2, 3, 4, 5]);
  assert.deepEqual(progress.at(-1), { phase: 'download', file: 'm.onnx', loaded: 5, total: 5, fileLoaded: 5, fileTotal: 5, elapsedMs: 7 });
  assert.deepEqual(events.map((e) => e.type), ['download']);
  assert.ok(cache.entries.has(CACHE_KEY_PREFIX + digest(bytes)));
  // The second time it comes from the cache, checked again, without a request.
  assert.deepEqual(Array.from(await store.get('m.onnx')), [1, 2, 3, 4, 5]);
  assert.equal(requests.length, 1);
  assert.equal(events.at(-1).type, 'cache-hit');
});

test('a corrupt cached copy is dropped and downloaded again', async () => {
  const bytes = new Uint8Array([9, 9, 9]);
  const cache = fakeCache();
  cache.entries.set(CACHE_KEY_PREFIX + digest(bytes), new Uint8Array([9, 9, 8]));
  const { store, events, requests } = setup({ 'pkg/m.onnx': bytes }, { 'm.onnx': bytes }, cache);
  assert.deepEqual(Array.from(await store.get('m.onnx')), [9, 9, 9]);
  assert.equal(requests.length, 1);
  assert.match(events[0].message, /cached copy of m.onnx is corrupt/);
});

test('changed bytes, a longer file and a missing file are clear errors', async () => {
  const listed = new Uint8Array([1, 2, 3]);
  const changed = setup({ 'pkg/m.onnx': new Uint8Array([1, 2, 4]) }, { 'm.onnx': listed });
  await assert.rejects(changed.store.get('m.onnx'), (e) => e instanceof PackIntegrityError && /m.onnx: sha256 mismatch .*re-publish/.test(e.message) && e.file === 'm.onnx');
  const longer = setup({ 'pkg/m.onnx': new Uint8Array([1, 2, 3, 4]) }, { 'm.onnx': listed });
  await assert.rejects(longer.store.get('m.onnx'), /more than the 3 bytes manifest.json lists/);
  const shorter = setup({ 'pkg/m.onnx': new Uint8Array([1, 2]) }, { 'm.onnx': listed });
  await assert.rejects(shorter.store.get('m.onnx'), /2 bytes downloaded, manifest.json lists 3/);
  const missing = setup({}, { 'm.onnx': listed });
  await assert.rejects(missing.store.get('m.onnx'), (e) => !(e instanceof PackIntegrityError) && /HTTP 404 Not Found .*is the whole package published/.test(e.message));
  assert.throws(() => missing.store.entry('other.onnx'), /"files" has no sha256\/size entry for "other.onnx"/);
});

test('a split file is fetched as its parts, each checked and cached, joined and checked whole', async () => {
  const whole = Uint8Array.from({ length: 10 }, (_, i) => i + 1);
  const parts = { 'sample.part0.bin': whole.slice(0, 4), 'sample.part1.bin': whole.slice(4, 8), 'sample.part2.bin': whole.slice(8) };
  const cache = fakeCache();
  const { store, events, progress, requests } = setup(Object.fromEntries(Object.entries(parts).map(([p, b]) => [`pkg/${p}`, b])), parts, cache);
  store.manifest.split = { 'sample.bin': { sha256: digest(whole), size: 10, mediaType: 'application/octet-stream', parts: Object.keys(parts) } };
  store.plan('sample.bin');
  assert.deepEqual(Array.from(await store.get('sample.bin')), Array.from(whole));
  assert.deepEqual(requests.map((u) => new URL(u).pathname).sort(), ['/pkg/sample.part0.bin', '/pkg/sample.part1.bin', '/pkg/sample.part2.bin']);
  assert.deepEqual(events.filter((e) => e.type === 'download').map((e) => e.file).sort(), Object.keys(parts));
  assert.deepEqual([progress.at(-1).loaded, progress.at(-1).total], [10, 10]); // the parts, planned once each
  assert.equal(cache.entries.size, 3);
  assert.equal(store.entry('sample.bin').size, 10);

  // parts that join to other bytes than the whole's sha256: an integrity error naming the whole
  store.manifest.split['sample.bin'].sha256 = digest(new Uint8Array(10));
  await assert.rejects(store.get('sample.bin'), (e) => e instanceof PackIntegrityError && /^sample\.bin: its parts join to sha256 .*re-publish/.test(e.message));
  // sizes that disagree, and a split entry without parts, are refused before any download
  store.manifest.split['sample.bin'].size = 11;
  await assert.rejects(store.get('sample.bin'), (e) => e instanceof PackLoadError && /split\["sample\.bin"\]: its parts hold 10 bytes, not 11/.test(e.message));
  store.manifest.split['sample.bin'].parts = [];
  assert.throws(() => store.plan('sample.bin'), (e) => e instanceof PackLoadError && /needs sha256, size and a non-empty parts list/.test(e.message));
});

test('progress sums every planned file once; a throwing listener is logged, not thrown', (t) => {
  const logged = t.mock.method(console, 'error', () => {});
  const seen = [];
  const tracker = new ProgressTracker((p) => seen.push(p.total));
  tracker.plan('a', 10);
  tracker.plan('a', 10);
  tracker.plan('b', 5);
  tracker.advance('a', 4, 4, 10);
  assert.deepEqual(seen, [15]);
  assert.doesNotThrow(() => new ProgressTracker(() => { throw new Error('app bug'); }).advance('a', 1, 1, 1));
  assert.equal(logged.mock.callCount(), 1);
});

test('checkManifest reads schema 2 and names what is missing', () => {
  const ok = manifest();
  assert.equal(checkManifest(ok), ok);
  assert.throws(() => checkManifest({ ...ok, schema: 1 }), (e) => e instanceof PackLoadError && /schema 1, this loader reads schema 2; rebuild the package/.test(e.message));
  const { variants, ...noVariants } = ok;
  assert.throws(() => checkManifest(noVariants), /manifest\.json has no "variants"; rebuild the package/);
  // every key the schema requires, where it sits: inside each variant and the required sections too
  const { model, ...noModel } = ok.variants.fp16;
  assert.throws(() => checkManifest({ ...ok, variants: { ...ok.variants, fp16: noModel } }), /has no "variants\.fp16\.model"/);
  const { bundles, ...noBundles } = ok.runtime;
  assert.throws(() => checkManifest({ ...ok, runtime: noBundles }), /has no "runtime\.bundles"/);
  assert.throws(() => checkManifest({ ...ok, sample: null }), /has no "sample\.file"/);
});

// A body that yields `first` bytes and then fails as a cut connection does in a browser.
function cutBody(bytes, first) {
  return new ReadableStream({
    start(controller) {
      controller.enqueue(bytes.slice(0, first));
      controller.error(new TypeError('network error'));
    },
  });
}

test('a cut download is retried with backoff, then a PackLoadError names the file, the URL and the cause', async () => {
  const bytes = new Uint8Array([1, 2, 3, 4, 5, 6]);
  const { store, events, tracker } = setup({}, { 'm.onnx': bytes });
  let calls = 0;
  globalThis.fetch = async () => {
    calls += 1;
    return new Response(cutBody(bytes, 3));
  };
  store.plan('m.onnx');
  const started = Date.now();
  await assert.rejects(store.get('m.onnx'), (e) =>
    e instanceof PackLoadError && !(e instanceof PackIntegrityError) && e.file === 'm.onnx' && e.url === 'https://cdn.test/pkg/m.onnx' &&
    e.cause instanceof TypeError && e.attempts === 3 &&
    /^m\.onnx: download from https:\/\/cdn\.test\/pkg\/m\.onnx failed 3 times \(TypeError: network error\)/.test(e.message));
  assert.equal(calls, 3);
  assert.deepEqual(events.filter((e) => e.type === 'retry').map((e) => [e.attempt, e.delayMs]), [[1, 250], [2, 500]]);
  assert.ok(Date.now() - started >= 700);
  assert.equal(tracker.loaded, 0); // the cut attempts' bytes are not counted
});

test('a transient failure (network error, 503) is retried and the download then succeeds; a 404 is not retried', async () => {
  const bytes = new Uint8Array([7, 8, 9]);
  const { store, events, progress } = setup({}, { 'm.onnx': bytes });
  const answers = [() => Promise.reject(new TypeError('Failed to fetch')), () => new Response('busy', { status: 503 }), () => new Response(bytes)];
  globalThis.fetch = async () => answers.shift()();
  store.plan('m.onnx');
  assert.deepEqual(Array.from(await store.get('m.onnx')), [7, 8, 9]);
  assert.deepEqual(events.filter((e) => e.type === 'retry').map((e) => e.error), ['TypeError: Failed to fetch', 'HTTP 503']);
  assert.deepEqual(progress.at(-1), { phase: 'download', file: 'm.onnx', loaded: 3, total: 3, fileLoaded: 3, fileTotal: 3, elapsedMs: 7 });
  const missing = setup({}, { 'm.onnx': bytes });
  await assert.rejects(missing.store.get('m.onnx'), (e) => e.status === 404 && e.file === 'm.onnx' && e.url === 'https://cdn.test/pkg/m.onnx');
  assert.equal(missing.requests.length, 1);
});

test('an HTML page where manifest.json should be names baseUrl and where it came from', async () => {
  globalThis.fetch = async () => new Response('<!doctype html><title>app</title>', { headers: { 'Content-Type': 'text/html' } });
  await assert.rejects(fetchManifest(new URL('https://app.test/'), null, { how: "this module's own URL" }), (e) =>
    e instanceof PackLoadError && e.url === 'https://app.test/manifest.json' &&
    /manifest\.json at https:\/\/app\.test\/manifest\.json is an HTML page, not the package's manifest: baseUrl https:\/\/app\.test\/ \(this module's own URL\) is not where the package is; pass load\(\{ baseUrl \}\)/.test(e.message));
  globalThis.fetch = async () => new Response(JSON.stringify(manifest()), { headers: { 'Content-Type': 'application/json' } });
  assert.equal((await fetchManifest(new URL('https://cdn.test/pkg/'), null)).schema, 2);
  globalThis.fetch = async () => new Response('nope', { status: 404 });
  await assert.rejects(fetchManifest(new URL('https://cdn.test/pkg/'), null), /manifest\.json: HTTP 404 from https:\/\/cdn\.test\/pkg\/manifest\.json: is the package published there\? baseUrl https:\/\/cdn\.test\/pkg\/ comes from the baseUrl option/);
});

test('packageBase: the baseUrl option, else the package folder of an unbundled loader, else an error naming baseUrl', () => {
  const shipped = 'https://cdn.test/models/gtcrn/loader/files.js';
  assert.deepEqual(packageBase(undefined, shipped), { url: new URL('https://cdn.test/models/gtcrn/'), how: "the loader's own URL" });
  assert.equal(packageBase(undefined, 'http://localhost:5173/@fs/app/node_modules/gtcrn/loader/files.js?v=1').url.href, 'http://localhost:5173/@fs/app/node_modules/gtcrn/');
  assert.deepEqual(packageBase('https://r2.example/gtcrn', shipped), { url: new URL('https://r2.example/gtcrn/'), how: 'the baseUrl option' });
  // Bundled: a Vite build chunk, Vite's pre-bundled dependency in dev, webpack's file: URL of the source.
  for (const bundled of ['https://app.test/assets/index-Bx1.js', 'http://localhost:5173/node_modules/.vite/deps/gtcrn.js?v=9', 'file:///src/node_modules/gtcrn/loader/files.js']) {
    assert.throws(() => packageBase(undefined, bundled), (e) => e instanceof PackLoadError && e.message.includes(`the loader runs from ${bundled}, not from its package`) && e.message.includes('pass load({ baseUrl:'));
  }
});
