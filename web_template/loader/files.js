// Package files: download with progress (totals from the manifest's decoded sizes), sha256 before
// use, Cache Storage keyed by hash.

import { PackIntegrityError, PackLoadError, messageOf, throwIfAborted } from './errors.js';

export const CACHE_NAME = 'pack-files-v1';
// Cache keys are content hashes, so packages on one origin share identical runtime files.
export const CACHE_KEY_PREFIX = 'https://pack.invalid/sha256/';

export function hex(bytes) {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, '0')).join('');
}

export async function sha256Hex(bytes) {
  if (!globalThis.crypto || !crypto.subtle) {
    throw new PackLoadError('sha256 checks need crypto.subtle, which browsers give only to secure contexts: serve the page over https (or localhost)');
  }
  return hex(await crypto.subtle.digest('SHA-256', bytes));
}

/** Sums progress over every file a load fetches, against totals planned up front. */
export class ProgressTracker {
  constructor(onProgress) {
    this.onProgress = onProgress;
    this.total = 0;
    this.loaded = 0;
    this.planned = new Set();
  }

  plan(file, size) {
    if (this.planned.has(file)) return;
    this.planned.add(file);
    this.total += size;
  }

  /** A download that failed part-way: its bytes no longer count (a retry counts them again). */
  rewind(file, bytes, fileTotal) {
    if (bytes > 0) this.advance(file, -bytes, 0, fileTotal);
  }

  advance(file, bytes, fileLoaded, fileTotal) {
    this.loaded += bytes;
    if (!this.onProgress) return;
    try {
      this.onProgress({ file, loaded: this.loaded, total: this.total, fileLoaded, fileTotal });
    } catch (error) {
      console.error('[pack] onProgress threw:', error);
    }
  }
}

/** The manifest.json "files" entry of a package path; PackLoadError when it is missing. */
export function fileEntry(manifest, path) {
  const entry = manifest.files && manifest.files[path];
  if (!entry || typeof entry.sha256 !== 'string' || typeof entry.size !== 'number') {
    throw new PackLoadError(`manifest.json "files" has no sha256/size entry for "${path}"; rebuild the package`);
  }
  return entry;
}

export class Files {
  constructor({ baseUrl, manifest, cache, progress, emit, signal }) {
    Object.assign(this, { baseUrl, manifest, cache, progress, emit, signal });
    this.pending = new Map();
  }

  entry(path) {
    return fileEntry(this.manifest, path);
  }

  url(path) {
    return new URL(path, this.baseUrl).href;
  }

  plan(path) {
    this.progress.plan(path, this.entry(path).size);
  }

  /** The verified bytes of a package file (Uint8Array). */
  get(path, signal = this.signal) {
    if (!this.pending.has(path)) {
      const promise = this.fetchVerified(path, signal);
      this.pending.set(path, promise);
      // A failed download may be retried by a later call; verified bytes are not kept here.
      promise.then(
        () => this.pending.delete(path),
        () => this.pending.delete(path),
      );
    }
    return this.pending.get(path);
  }

  async fetchVerified(path, signal) {
    const entry = this.entry(path);
    this.progress.plan(path, entry.size);
    const key = CACHE_KEY_PREFIX + entry.sha256;
    if (this.cache) {
      const hit = await this.cache.match(key).catch(() => undefined);
      if (hit) {
        const bytes = new Uint8Array(await hit.arrayBuffer());
        if (bytes.byteLength === entry.size && (await sha256Hex(bytes)) === entry.sha256) {
          this.emit({ type: 'cache-hit', file: path, bytes: entry.size });
          this.progress.advance(path, entry.size, entry.size, entry.size);
          return bytes;
        }
        this.emit({ type: 'warning', message: `cached copy of ${path} is corrupt; downloading it again` });
        await this.cache.delete(key).catch(() => {});
      }
    }
    throwIfAborted(signal);
    const bytes = await this.download(path, entry, signal);
    const actual = await sha256Hex(bytes);
    if (actual !== entry.sha256) {
      throw new PackIntegrityError(
        `${path}: sha256 mismatch (manifest.json ${entry.sha256.slice(0, 16)}…, downloaded ${actual.slice(0, 16)}…): ` +
          'the file was changed or corrupted after the build; re-publish the package',
        { file: path, expected: entry.sha256, actual },
      );
    }
    this.emit({ type: 'download', file: path, bytes: entry.size });
    if (this.cache) {
      const response = new Response(bytes, {
        headers: { 'Content-Type': entry.mediaType || 'application/octet-stream', 'Content-Length': String(entry.size) },
      });
      await this.cache.put(key, response).catch((error) => {
        this.emit({ type: 'warning', message: `could not cache ${path} (${messageOf(error)}); the next visit downloads it again` });
      });
    }
    return bytes;
  }

  async download(path, entry, signal) {
    const url = this.url(path);
    const response = await fetch(url, { signal, credentials: 'same-origin' });
    if (!response.ok) {
      throw new PackLoadError(`${path}: HTTP ${response.status} ${response.statusText} from ${url}; is the whole package published?`);
    }
    // Content-Length is the encoded (brotli) size; the stream yields decoded bytes: count those
    // against the manifest's decoded size.
    const buffer = new Uint8Array(entry.size);
    let offset = 0;
    const take = (chunk) => {
      if (offset + chunk.byteLength > entry.size) {
        throw new PackIntegrityError(
          `${path}: more than the ${entry.size} bytes manifest.json lists; the file was changed after the build; re-publish the package`,
          { file: path },
        );
      }
      buffer.set(chunk, offset);
      offset += chunk.byteLength;
      this.progress.advance(path, chunk.byteLength, offset, entry.size);
    };
    try {
      if (response.body && response.body.getReader) {
        const reader = response.body.getReader();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          try {
            take(value);
          } catch (error) {
            reader.cancel().catch(() => {});
            throw error;
          }
        }
      } else {
        take(new Uint8Array(await response.arrayBuffer()));
      }
    } catch (error) {
      this.progress.rewind(path, offset, entry.size);
      throw error;
    }
    if (offset !== entry.size) {
      throw new PackIntegrityError(
        `${path}: ${offset} bytes downloaded, manifest.json lists ${entry.size}; the file was changed after the build; re-publish the package`,
        { file: path },
      );
    }
    return buffer;
  }
}

export async function openCache(enabled, emit) {
  if (!enabled) return null;
  if (typeof caches === 'undefined') {
    emit({ type: 'warning', message: 'Cache Storage is unavailable (not a secure context?); files are not cached' });
    return null;
  }
  try {
    return await caches.open(CACHE_NAME);
  } catch (error) {
    emit({ type: 'warning', message: `Cache Storage refused (${messageOf(error)}); files are not cached` });
    return null;
  }
}

/** manifest.json beside the loader, checked for the keys every load needs. */
export async function fetchManifest(baseUrl, signal) {
  const url = new URL('manifest.json', baseUrl).href;
  // no-cache: revalidate, so a re-published manifest is seen at once.
  const response = await fetch(url, { signal, cache: 'no-cache', credentials: 'same-origin' });
  if (!response.ok) throw new PackLoadError(`manifest.json: HTTP ${response.status} from ${url}; is the package published there?`);
  let manifest;
  try {
    manifest = await response.json();
  } catch (error) {
    throw new PackLoadError(`manifest.json at ${url} is not JSON (${messageOf(error)}); re-publish the package`);
  }
  return checkManifest(manifest, url);
}

export const SCHEMAS = Object.freeze([2]);

export function checkManifest(manifest, where = 'manifest.json') {
  if (!manifest || !SCHEMAS.includes(manifest.schema)) {
    throw new PackLoadError(
      `${where}: schema ${manifest && manifest.schema}, this loader reads schema ${SCHEMAS.join(' or ')}; rebuild the package`,
    );
  }
  for (const key of ['files', 'variants', 'runtime']) {
    if (!manifest[key]) throw new PackLoadError(`${where} has no "${key}"; rebuild the package`);
  }
  return manifest;
}
