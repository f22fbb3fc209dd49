// Cache Storage over time (cache.js): a package's index, the files of an earlier version removed
// after a newer one loads (unless another package still uses them), cacheStatus/isCached/clearCache.

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { INDEX_PREFIX, cacheStatus, clearCache, isCached, manifestFiles, settlePackage } from '../../web_template/loader/cache.js';
import { CACHE_KEY_PREFIX } from '../../web_template/loader/files.js';

/** A Cache with the methods the loader uses, keyed by URL strings as Cache Storage keys are. */
function fakeCache() {
  const entries = new Map();
  return {
    entries,
    keys: async () => [...entries.keys()].map((url) => new Request(url)),
    match: async (key) => (entries.has(String(key)) ? new Response(entries.get(String(key))) : undefined),
    put: async (key, response) => entries.set(String(key), new Uint8Array(await response.arrayBuffer())),
    delete: async (key) => entries.delete(String(key)),
  };
}

const sha = (c) => c.repeat(64);
const version = (files, split = undefined) => ({ files: Object.fromEntries(files.map(([name, c, size]) => [name, { sha256: sha(c), size }])), ...(split ? { split } : {}) });
const cacheFiles = (cache, ...letters) => Promise.all(letters.map((c) => cache.put(CACHE_KEY_PREFIX + sha(c), new Response(new Uint8Array(1)))));
const held = (cache) => [...cache.entries.keys()].filter((k) => k.startsWith(CACHE_KEY_PREFIX)).map((k) => k.slice(CACHE_KEY_PREFIX.length, CACHE_KEY_PREFIX.length + 1)).sort();

const A = 'https://cdn.example/a/';
const B = 'https://cdn.example/b/';

test('a newer version of a package evicts the files only the older one listed; files it still lists stay', async () => {
  const cache = fakeCache();
  const v1 = version([['ort.mjs', 'r', 100], ['model.1.onnx', 'm', 1000], ['sample.bin', 's', 10]]);
  await cacheFiles(cache, 'r', 'm'); // the first load fetched the runtime and the model (no sample)
  assert.deepEqual(await settlePackage(cache, A, v1), { held: { files: 2, bytes: 1100 }, evicted: { files: 0, bytes: 0 } });
  assert.equal(await isCached({ baseUrl: A, cache }), true);

  const v2 = version([['ort.mjs', 'r', 100], ['model.2.onnx', 'n', 900], ['sample.bin', 's', 10]]);
  await cacheFiles(cache, 'n'); // the second load fetched the new model; the runtime came from the cache
  assert.deepEqual(await settlePackage(cache, A, v2), { held: { files: 2, bytes: 1000 }, evicted: { files: 1, bytes: 1000 } });
  assert.deepEqual(held(cache), ['n', 'r']);
  assert.deepEqual(await cacheStatus({ baseUrl: A, cache }), { cached: true, files: 2, bytes: 1000 });
});

test("a file another package's index holds stays when one package moves on or is cleared", async () => {
  const cache = fakeCache();
  await cacheFiles(cache, 'r', 'm', 'x');
  await settlePackage(cache, A, version([['ort.mjs', 'r', 100], ['model.onnx', 'm', 1000]]));
  await settlePackage(cache, B, version([['ort.mjs', 'r', 100], ['other.onnx', 'x', 50]]));
  // A drops the runtime it shares with B: B still uses it
  await settlePackage(cache, A, version([['model.onnx', 'm', 1000]]));
  assert.deepEqual(held(cache), ['m', 'r', 'x']);
  // clearing B frees its own file and leaves A's
  assert.deepEqual(await clearCache({ baseUrl: B, cache }), { files: 2, bytes: 150 });
  assert.deepEqual(held(cache), ['m']);
  assert.equal(await isCached({ baseUrl: B, cache }), false);
  assert.deepEqual(await cacheStatus({ baseUrl: B, cache }), { cached: false, files: 0, bytes: 0 });
  assert.ok(![...cache.entries.keys()].some((k) => k === INDEX_PREFIX + encodeURIComponent(B)));
  assert.equal(await isCached({ baseUrl: A, cache }), true);
  assert.deepEqual(await clearCache({ baseUrl: A, cache }), { files: 1, bytes: 1000 });
  assert.deepEqual(held(cache), []);
});

test('a file gone from the cache (storage pressure, a corrupt copy dropped) makes the package not cached', async () => {
  const cache = fakeCache();
  await cacheFiles(cache, 'r', 'm');
  await settlePackage(cache, A, version([['ort.mjs', 'r', 100], ['model.onnx', 'm', 1000]]));
  await cache.delete(CACHE_KEY_PREFIX + sha('m'));
  assert.deepEqual(await cacheStatus({ baseUrl: A, cache }), { cached: false, files: 1, bytes: 100 });
  // a damaged index is as none
  await cache.put(INDEX_PREFIX + encodeURIComponent(A), new Response('{not json'));
  assert.deepEqual(await cacheStatus({ baseUrl: A, cache }), { cached: false, files: 0, bytes: 0 });
});

test('a split file is indexed by its parts (each cached on its own), never by the whole', () => {
  const manifest = version([['w.part0.wasm', 'p', 5], ['w.part1.wasm', 'q', 4]], { 'w.wasm': { sha256: sha('w'), size: 9, parts: ['w.part0.wasm', 'w.part1.wasm'] } });
  manifest.files['w.wasm'] = { sha256: sha('w'), size: 9 };
  assert.deepEqual(Object.keys(manifestFiles(manifest)).map((k) => k[0]).sort(), ['p', 'q']);
});

test('without Cache Storage (not a secure context) nothing is cached and nothing is cleared', async () => {
  assert.equal(typeof caches, 'undefined');
  assert.deepEqual(await cacheStatus({ baseUrl: A }), { cached: false, files: 0, bytes: 0 });
  assert.deepEqual(await clearCache({ baseUrl: A }), { files: 0, bytes: 0 });
});
