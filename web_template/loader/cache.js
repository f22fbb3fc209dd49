// Cache Storage over time. files.js caches every checked file under its sha256, so packages on one
// origin share identical files (the runtime); this module keeps, per package URL, an index of the
// files of its manifest that are cached, and after a load removes the files an earlier version of
// that package cached and the new manifest no longer lists, unless another package's index still
// holds them. isCached(), cacheStatus() and clearCache() read and clear one package's files.

import { messageOf } from './errors.js';
import { CACHE_KEY_PREFIX, CACHE_NAME, packageBase, splitEntry } from './files.js';

// One entry per package URL: { files: { <sha256>: <bytes> } }, beside the files' own entries.
export const INDEX_PREFIX = 'https://pack.invalid/package/';

const indexKey = (baseUrl) => INDEX_PREFIX + encodeURIComponent(String(baseUrl));

async function readIndex(cache, key) {
  const response = await cache.match(key).catch(() => undefined);
  if (!response) return null;
  try {
    const index = await response.json();
    return index && typeof index.files === 'object' && index.files ? index : null;
  } catch {
    return null; // a damaged index is as none: rewritten by the next load
  }
}

/** sha256 → bytes of every file the manifest lists (a split file: its parts, each cached on its own). */
export function manifestFiles(manifest) {
  const files = {};
  for (const entry of Object.values(manifest.files || {})) {
    if (entry && typeof entry.sha256 === 'string' && typeof entry.size === 'number') files[entry.sha256] = entry.size;
  }
  for (const path of Object.keys(manifest.split || {})) delete files[splitEntry(manifest, path).sha256];
  return files;
}

/** sha256 → bytes held by every other package's index on this origin. */
async function heldByOthers(cache, ownKey) {
  const held = new Set();
  for (const request of await cache.keys()) {
    const key = typeof request === 'string' ? request : request.url;
    if (!key.startsWith(INDEX_PREFIX) || key === ownKey) continue;
    const index = await readIndex(cache, key);
    if (index) for (const sha256 of Object.keys(index.files)) held.add(sha256);
  }
  return held;
}

const isCachedFile = async (cache, sha256) => Boolean(await cache.match(CACHE_KEY_PREFIX + sha256).catch(() => undefined));

/**
 * After a load of the package at `baseUrl`: its index becomes the files of `manifest` that are
 * cached now, and the files of its previous index that `manifest` no longer lists are deleted,
 * unless another package's index holds them. Returns { held: { files, bytes }, evicted: { files, bytes } }.
 */
export async function settlePackage(cache, baseUrl, manifest) {
  const key = indexKey(baseUrl);
  const listed = manifestFiles(manifest);
  const before = (await readIndex(cache, key)) || { files: {} };
  const files = {};
  for (const [sha256, bytes] of Object.entries(listed)) if (await isCachedFile(cache, sha256)) files[sha256] = bytes;
  await cache.put(key, new Response(JSON.stringify({ files }), { headers: { 'Content-Type': 'application/json' } }));
  const stale = Object.entries(before.files).filter(([sha256]) => !(sha256 in listed));
  const evicted = { files: 0, bytes: 0 };
  if (stale.length) {
    const others = await heldByOthers(cache, key);
    for (const [sha256, bytes] of stale) {
      if (others.has(sha256)) continue;
      if (await cache.delete(CACHE_KEY_PREFIX + sha256)) {
        evicted.files += 1;
        evicted.bytes += bytes;
      }
    }
  }
  return { held: sum(files), evicted };
}

function sum(files) {
  const sizes = Object.values(files);
  return { files: sizes.length, bytes: sizes.reduce((a, b) => a + b, 0) };
}

async function openOrNull() {
  if (typeof caches === 'undefined') return null;
  return caches.open(CACHE_NAME).catch(() => null);
}

/**
 * What Cache Storage holds of the package at `baseUrl` (the load() option; default: where the
 * loader is served from): { cached, files, bytes }. `cached`: a load on this origin indexed the
 * package and every file of that index is still there, so the next load downloads none of them
 * (a re-published manifest may list new ones).
 */
export async function cacheStatus({ baseUrl, cache } = {}) {
  const store = cache || (await openOrNull());
  if (!store) return { cached: false, files: 0, bytes: 0 };
  const index = await readIndex(store, indexKey(packageBase(baseUrl).url));
  if (!index) return { cached: false, files: 0, bytes: 0 };
  const present = {};
  for (const [sha256, bytes] of Object.entries(index.files)) if (await isCachedFile(store, sha256)) present[sha256] = bytes;
  const held = sum(present);
  return { cached: held.files > 0 && held.files === Object.keys(index.files).length, ...held };
}

/** Whether the package's files are in Cache Storage (cacheStatus().cached). */
export async function isCached(options = {}) {
  return (await cacheStatus(options)).cached;
}

/**
 * Removes the package's files from Cache Storage (those another package's index holds stay) and
 * its index: resolves to { files, bytes } freed.
 */
export async function clearCache({ baseUrl, cache } = {}) {
  const store = cache || (await openOrNull());
  const freed = { files: 0, bytes: 0 };
  if (!store) return freed;
  const key = indexKey(packageBase(baseUrl).url);
  const index = await readIndex(store, key);
  if (!index) return freed;
  const others = await heldByOthers(store, key);
  for (const [sha256, bytes] of Object.entries(index.files)) {
    if (others.has(sha256)) continue;
    if (await store.delete(CACHE_KEY_PREFIX + sha256)) {
      freed.files += 1;
      freed.bytes += bytes;
    }
  }
  await store.delete(key);
  return freed;
}

/** settlePackage for load(): its outcome as a 'cache' event; a failure is a warning, never the load's. */
export async function settleAfterLoad(cache, baseUrl, manifest, emit) {
  if (!cache) return;
  try {
    emit({ type: 'cache', ...(await settlePackage(cache, baseUrl, manifest)) });
  } catch (error) {
    emit({ type: 'warning', message: `Cache Storage: could not drop an earlier version's files (${messageOf(error)}); they stay until the next load` });
  }
}
