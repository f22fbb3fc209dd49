// Package files: download with progress (totals from the manifest's decoded sizes), sha256 before
// use, Cache Storage keyed by hash. A file over the build's [assets] max_file_mib (manifest.json
// "split": the sample, a runtime .wasm) is fetched as its parts, each checked and cached on its
// own, and joined; the whole is checked against its own sha256. On a host that serves `.br` bodies
// as they are, a file with one is fetched as its `.br` body and decoded here (brotli.js); the
// sha256 is checked on the decoded bytes all the same.

import { brBody, decodeNative, hostDecodes, nativeBrotli } from './brotli.js';
import { CHUNK_CONCURRENCY, mapLimit } from './chunks.js';
import { PackIntegrityError, PackLoadError, isAbort, messageOf, throwIfAborted } from './errors.js';
import { REQUIRED_KEYS } from './manifest_keys.js';
import { Widener } from './widen.js';

export const CACHE_NAME = 'pack-files-v1';
// Cache keys are content hashes, so packages on one origin share identical runtime files.
export const CACHE_KEY_PREFIX = 'https://pack.invalid/sha256/';

// Transient failures (a cut connection, a broken brotli body, a busy server) are retried this many
// times in all, RETRY_BASE_MS × 2^(n-1) apart; anything else fails at once.
export const FETCH_ATTEMPTS = 3;
export const RETRY_BASE_MS = 250;
const TRANSIENT_STATUSES = new Set([408, 425, 429, 500, 502, 503, 504]);

/** A failure worth another try: network errors and the statuses above. Internal to fetchRetrying. */
class Transient extends Error {}

function abortableSleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(done, ms);
    function done() {
      if (signal) signal.removeEventListener('abort', stop);
      resolve();
    }
    function stop() {
      clearTimeout(timer);
      try {
        throwIfAborted(signal);
      } catch (error) {
        reject(error);
      }
    }
    if (signal) signal.addEventListener('abort', stop, { once: true });
  });
}

/**
 * fetch(url) and read(response), retried with backoff on transient failures; `read` may throw
 * `retryable(message)` for a body it should fetch again. Gives up with a PackLoadError that names
 * `file`, the URL and the cause (`error.file`, `error.url`, `error.cause`, `error.attempts`).
 */
export async function fetchRetrying({ file, url, init, read, signal, emit = () => {}, attempts = FETCH_ATTEMPTS, baseMs = RETRY_BASE_MS }) {
  for (let attempt = 1; ; attempt++) {
    throwIfAborted(signal);
    let cause;
    try {
      const response = await fetch(url, { ...init, signal });
      if (!response.ok) {
        const status = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`;
        if (!TRANSIENT_STATUSES.has(response.status)) throw new PackLoadError(`${file}: ${status} from ${url}`, { file, url, status: response.status });
        throw new Transient(status);
      }
      return await read(response);
    } catch (error) {
      if (isAbort(error, signal) || (error instanceof PackLoadError && !(error instanceof Transient))) throw error;
      // fetch() and body reads reject with a TypeError for network failures, CORS refusals and
      // undecodable (e.g. cut brotli) bodies; the browser says which only in the console.
      cause = error;
    }
    const why = cause instanceof Transient ? cause.message : `${cause && cause.name ? `${cause.name}: ` : ''}${messageOf(cause)}`;
    if (attempt >= attempts) {
      throw new PackLoadError(
        `${file}: download from ${url} failed ${attempt} time${attempt > 1 ? 's' : ''} (${why}): ` +
          'a cut connection, a broken brotli body, a server error, or a CORS refusal (the console says which)',
        { file, url, cause, attempts: attempt },
      );
    }
    const delayMs = baseMs * 2 ** (attempt - 1);
    emit({ type: 'retry', file, url, attempt, error: why, delayMs });
    await abortableSleep(delayMs, signal);
  }
}

/** Thrown by a `read` of fetchRetrying for a body that should be fetched again (e.g. cut short). */
export function retryable(message, details = {}) {
  return Object.assign(new Transient(message), details);
}

export function hex(bytes) {
  return Array.from(new Uint8Array(bytes), (b) => b.toString(16).padStart(2, '0')).join('');
}

export async function sha256Hex(bytes) {
  if (!globalThis.crypto || !crypto.subtle) {
    throw new PackLoadError('sha256 checks need crypto.subtle, which browsers give only to secure contexts: serve the page over https (or localhost)');
  }
  return hex(await crypto.subtle.digest('SHA-256', bytes));
}

const clockMs = () => (globalThis.performance ? performance.now() : Date.now());

/**
 * The load's progress events: bytes over every file a load fetches, against totals planned up
 * front (phase 'download'), and the waits after them, each as it starts and ends with its time
 * (phases 'decode', 'create', 'prewarm', 'run': the first run), so a page can say what the wait is
 * for until the first result. Every event carries the bytes so far and `elapsedMs` since load().
 */
export class ProgressTracker {
  constructor(onProgress, { clock = clockMs, started = clock() } = {}) {
    this.onProgress = onProgress;
    this.clock = clock;
    this.started = started;
    this.total = 0;
    this.loaded = 0;
    this.planned = new Set();
  }

  plan(file, size) {
    if (this.planned.has(file)) return;
    this.planned.add(file);
    this.total += size;
  }

  /** A failed attempt's bytes no longer count (the file is downloaded again). */
  rollback(bytes) {
    this.loaded -= bytes;
  }

  advance(file, bytes, fileLoaded, fileTotal) {
    this.loaded += bytes;
    this.send({ phase: 'download', file, loaded: this.loaded, total: this.total, fileLoaded, fileTotal });
  }

  /**
   * A phase begins (`state` 'start') or ends ('done': `details.ms`, or the time since its start).
   * Returns the function that ends it, for `const done = progress.begin(...); ...; done()`.
   */
  begin(phase, details = {}) {
    const started = this.clock();
    this.send({ phase, state: 'start', ...details, loaded: this.loaded, total: this.total });
    return (more = {}) => this.send({ phase, state: 'done', ...details, ms: Math.round(this.clock() - started), ...more, loaded: this.loaded, total: this.total });
  }

  send(event) {
    if (!this.onProgress) return;
    try {
      this.onProgress({ ...event, elapsedMs: Math.round(this.clock() - this.started) });
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

/** The manifest.json "split" entry of a file stored in parts ({ sha256, size, mediaType, parts }), else null. */
export function splitEntry(manifest, path) {
  const split = manifest.split && Object.prototype.hasOwnProperty.call(manifest.split, path) ? manifest.split[path] : null;
  if (!split) return null;
  if (!Array.isArray(split.parts) || split.parts.length === 0 || typeof split.sha256 !== 'string' || typeof split.size !== 'number') {
    throw new PackLoadError(`manifest.json split["${path}"] needs sha256, size and a non-empty parts list; rebuild the package`);
  }
  return split;
}

// The brotli decoder's Worker closes when no body has come for this long.
const DECODER_IDLE_MS = 2000;

export class Files {
  constructor({ baseUrl, manifest, cache, progress, emit, signal }) {
    Object.assign(this, { baseUrl, manifest, cache, progress, emit, signal });
    this.pending = new Map();
    this.decoder = null; // Promise of brotli(): how files with a .br body are fetched here
    this.decoding = null; // the Worker decoding brotli bodies: { widener, busy, timer }
  }

  /**
   * How this load gets the files that have a `.br` body, decided once (the host probe in
   * brotli.js): null where the host decodes (fetch `X`, the browser decodes), else the decoder
   * ('DecompressionStream' or the package's) with which the loader decodes `X.br` itself.
   */
  brotli() {
    if (!this.decoder) {
      this.decoder = (async () => {
        const host = await hostDecodes(this.baseUrl, this.manifest, { signal: this.signal });
        const by = host.decodes === false ? this.ownDecoder() : null;
        this.emit({ type: 'host', origin: new URL(this.baseUrl).origin, decodesBrotli: host.decodes, how: host.how, decoder: by });
        if (host.decodes === false && !by) {
          this.emit({
            type: 'warning',
            message: `${host.how}: this host serves .br files without Content-Encoding, and this browser has no DecompressionStream('brotli') nor the package a brotli decoder: files move decoded; rebuild the package with this pack`,
          });
        }
        return by;
      })();
      this.decoder.catch(() => {
        this.decoder = null;
      });
    }
    return this.decoder;
  }

  /** The decoder the loader has here: 'DecompressionStream', the package's decoder (its npm name), or null. */
  ownDecoder() {
    const shipped = this.manifest.runtime && this.manifest.runtime.decoder;
    return nativeBrotli() ? 'DecompressionStream' : shipped ? shipped.package : null;
  }

  /**
   * { bytes, where } of a brotli body decoded by `by` (see brotli()); `where` the package decoder
   * ran: 'worker', or the loader's thread where the helper Worker could not start.
   */
  async decode(body, by) {
    if (by === 'DecompressionStream') return { bytes: await decodeNative(body), where: null };
    const shipped = this.manifest.runtime && this.manifest.runtime.decoder;
    if (!shipped) throw new PackLoadError('manifest.json has no runtime.decoder to decode .br bodies with; rebuild the package with this pack');
    const [module, wasm] = await Promise.all([this.get(shipped.module), this.get(shipped.wasm)]);
    if (!this.decoding) this.decoding = { widener: new Widener(this.signal), busy: 0, timer: null };
    const decoding = this.decoding;
    clearTimeout(decoding.timer);
    decoding.busy += 1;
    try {
      const bytes = await decoding.widener.decode(body, { module, wasm });
      return { bytes, where: decoding.widener.where };
    } finally {
      decoding.busy -= 1;
      if (decoding.busy === 0) {
        decoding.timer = setTimeout(() => {
          if (this.decoding === decoding && decoding.busy === 0) {
            this.decoding = null;
            decoding.widener.close();
          }
        }, DECODER_IDLE_MS);
        if (decoding.timer && decoding.timer.unref) decoding.timer.unref();
      }
    }
  }

  /** The files entry of a package path, or the split entry of a file stored in parts. */
  entry(path) {
    return splitEntry(this.manifest, path) || fileEntry(this.manifest, path);
  }

  url(path) {
    return new URL(path, this.baseUrl).href;
  }

  plan(path) {
    const split = splitEntry(this.manifest, path);
    for (const part of split ? split.parts : [path]) this.progress.plan(part, fileEntry(this.manifest, part).size);
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
    const split = splitEntry(this.manifest, path);
    if (split) return this.join(path, split, signal);
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
    const { buffer: bytes, wireBytes, decodedBy, decodedIn } = await this.download(path, entry, signal);
    const actual = await sha256Hex(bytes);
    if (actual !== entry.sha256) {
      throw new PackIntegrityError(
        `${path}: sha256 mismatch (manifest.json ${entry.sha256.slice(0, 16)}…, downloaded ${actual.slice(0, 16)}…): ` +
          'the file was changed or corrupted after the build; re-publish the package',
        { file: path, expected: entry.sha256, actual },
      );
    }
    this.emit({ type: 'download', file: path, bytes: entry.size, wireBytes, ...(decodedBy ? { decodedBy } : {}), ...(decodedIn ? { decodedIn } : {}) });
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

  /** The bytes of a split file: its parts fetched in parallel (each verified), joined, the whole verified. */
  async join(path, split, signal) {
    const offsets = [];
    let size = 0;
    for (const part of split.parts) {
      offsets.push(size);
      size += fileEntry(this.manifest, part).size;
    }
    if (size !== split.size) throw new PackLoadError(`manifest.json split["${path}"]: its parts hold ${size} bytes, not ${split.size}; rebuild the package`);
    const bytes = new Uint8Array(size);
    await mapLimit(split.parts, CHUNK_CONCURRENCY, async (part, index) => bytes.set(await this.get(part, signal), offsets[index]));
    const actual = await sha256Hex(bytes);
    if (actual !== split.sha256) {
      throw new PackIntegrityError(
        `${path}: its parts join to sha256 ${actual.slice(0, 16)}…, manifest.json says ${split.sha256.slice(0, 16)}…; re-publish the package`,
        { file: path, expected: split.sha256, actual },
      );
    }
    return bytes;
  }

  /**
   * { buffer, wireBytes } of a listed file: under its own name (the host decodes a brotli body),
   * or as its `.br` body decoded here where the host serves `.br` files as they are; a 404 under
   * one name is asked under the other.
   */
  async download(path, entry, signal) {
    const br = brBody(entry);
    if (!br) return this.fetchBody(path, entry, signal);
    const by = await this.brotli();
    try {
      return by ? await this.fetchBrotli(path, entry, br, by, signal) : await this.fetchBody(path, entry, signal);
    } catch (error) {
      if (!(error instanceof PackLoadError && error.status === 404)) throw error;
      if (by) {
        const found = await this.fetchBody(path, entry, signal);
        // the host holds the decoded files and no .br bodies (an npm package on a CDN): ask for
        // those from now on, not for a .br body per file
        this.decoder = Promise.resolve(null);
        return found;
      }
      const other = this.ownDecoder();
      if (!other) throw error;
      return this.fetchBrotli(path, entry, br, other, signal);
    }
  }

  /** The `.br` body of `path`, fetched as it is and decoded by `by`; progress counts decoded bytes as the body arrives. */
  async fetchBrotli(path, entry, br, by, signal) {
    const url = this.url(br.path);
    const scale = entry.size / br.size;
    const read = async (response) => {
      let body = new Uint8Array(br.size);
      let received = 0;
      let counted = 0; // decoded bytes advanced on the progress
      const advance = (to) => {
        this.progress.advance(path, to - counted, to, entry.size);
        counted = to;
      };
      try {
        const reader = response.body && response.body.getReader ? response.body.getReader() : null;
        const chunks = reader ? null : [new Uint8Array(await response.arrayBuffer())];
        for (let i = 0; ; i++) {
          const { done, value } = reader ? await reader.read() : { done: i >= chunks.length, value: chunks[i] };
          if (done) break;
          if (received + value.byteLength > Math.max(br.size, entry.size)) {
            if (reader) reader.cancel().catch(() => {});
            throw new PackIntegrityError(`${br.path}: more than the ${br.size} bytes manifest.json lists; the file was changed after the build; re-publish the package`, { file: path, url });
          }
          if (received + value.byteLength > body.length) {
            const grown = new Uint8Array(entry.size); // the host decoded it after all: the body is the file
            grown.set(body.subarray(0, received));
            body = grown;
          }
          body.set(value, received);
          received += value.byteLength;
          advance(Math.min(entry.size, Math.floor(received * scale)));
        }
        // A host that decodes `.br` files itself sends the file (its size): nothing left to decode.
        if (received === entry.size && received !== br.size) {
          advance(entry.size);
          return { buffer: body.subarray(0, received), wireBytes: received };
        }
        if (received !== br.size) throw retryable(`the body ended after ${received} of ${br.size} bytes`, { received });
        let decoded;
        const decodeDone = this.progress.begin('decode', { file: path });
        try {
          decoded = await this.decode(body, by);
        } catch (error) {
          if (error instanceof PackLoadError) throw error;
          throw retryable(`its brotli body does not decode (${messageOf(error)})`);
        }
        decodeDone();
        advance(entry.size);
        return { buffer: decoded.bytes, wireBytes: received, decodedBy: by, decodedIn: decoded.where };
      } catch (error) {
        this.progress.rollback(counted);
        throw error;
      }
    };
    return this.fetchNamed(path, br.size, url, read, signal);
  }

  /** The body of `path` under its own name, the host decoding any brotli body. */
  async fetchBody(path, entry, signal) {
    const url = this.url(path);
    // Content-Length is the encoded (brotli) size; the stream yields decoded bytes: count those
    // against the manifest's decoded size.
    const read = async (response) => {
      const buffer = new Uint8Array(entry.size);
      let offset = 0;
      const take = (chunk) => {
        if (offset + chunk.byteLength > entry.size) {
          throw new PackIntegrityError(
            `${path}: more than the ${entry.size} bytes manifest.json lists; the file was changed after the build; re-publish the package`,
            { file: path, url },
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
        if (offset !== entry.size) throw retryable(`the body ended after ${offset} of ${entry.size} bytes`, { received: offset });
      } catch (error) {
        this.progress.rollback(offset);
        throw error;
      }
      const wire = Number(response.headers && response.headers.get('Content-Length'));
      // Content-Length when the server says (brotli bodies: the encoded size), else the decoded size.
      return { buffer, wireBytes: Number.isFinite(wire) && wire > 0 ? wire : entry.size };
    };
    return this.fetchNamed(path, entry.size, url, read, signal);
  }

  /** fetchRetrying of `url` (a body of `listed` bytes) for the listed file `path`, its failures named for what they mean. */
  async fetchNamed(path, listed, url, read, signal) {
    try {
      return await fetchRetrying({ file: path, url, init: { credentials: 'same-origin' }, read, signal, emit: this.emit });
    } catch (error) {
      if (error instanceof PackLoadError && error.status) {
        throw new PackLoadError(`${error.message}; is the whole package published there?`, { file: path, url, status: error.status });
      }
      // Short every time: the file itself is shorter than the build made it.
      if (error instanceof PackLoadError && error.cause instanceof Transient && error.cause.received !== undefined) {
        throw new PackIntegrityError(
          `${path}: ${error.cause.received} bytes downloaded, manifest.json lists ${listed}; the file was changed after the build; re-publish the package`,
          { file: path, url },
        );
      }
      throw error;
    }
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

// This file's path inside the package: a module URL that ends otherwise was bundled into an app.
const OWN_PATH = 'loader/files.js';
const MODULE_URL = import.meta.url; // never `new URL('…', import.meta.url)`: bundlers rewrite that pattern into an asset

/**
 * { url, how }: where the package's files are. The app's `baseUrl` (resolved against the page),
 * else the folder this module sits in when it is served as shipped (…/loader/files.js over http(s));
 * a bundled copy (an app chunk, a pre-bundled dependency, a file: URL) cannot know where the
 * package is published, and says so naming `baseUrl`.
 */
export function packageBase(baseUrl, moduleUrl = MODULE_URL) {
  if (baseUrl) {
    const url = new URL(String(baseUrl), globalThis.location ? location.href : moduleUrl);
    if (!url.pathname.endsWith('/')) url.pathname += '/';
    return { url, how: 'the baseUrl option' };
  }
  const own = new URL(moduleUrl);
  if (/^https?:$/.test(own.protocol) && own.pathname.endsWith(`/${OWN_PATH}`)) {
    own.pathname = own.pathname.slice(0, -OWN_PATH.length);
    own.search = '';
    own.hash = '';
    return { url: own, how: "the loader's own URL" };
  }
  throw new PackLoadError(
    `the loader runs from ${moduleUrl}, not from its package (bundled into an app?), so it cannot find manifest.json beside itself: ` +
      "pass load({ baseUrl: 'https://cdn.example/<name>/' }), the URL the package is published at",
    { url: moduleUrl },
  );
}

/**
 * manifest.json at `baseUrl`, checked for the keys every load needs. `how` says where baseUrl came
 * from, for the error when what answers there is not the package (an app's HTML fallback page).
 */
export async function fetchManifest(baseUrl, signal, { how = 'the baseUrl option', emit } = {}) {
  const url = new URL('manifest.json', baseUrl).href;
  const fix = `pass load({ baseUrl }) the URL the package is published at (the folder of its manifest.json)`;
  const read = async (response) => {
    const text = await response.text();
    const type = (response.headers && response.headers.get('Content-Type')) || '';
    if (/html/i.test(type) || /^\s*</.test(text)) {
      throw new PackLoadError(
        `manifest.json at ${url} is an HTML page, not the package's manifest: baseUrl ${baseUrl} (${how}) is not where the package is; ${fix}`,
        { file: 'manifest.json', url },
      );
    }
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new PackLoadError(`manifest.json at ${url} is not JSON (${messageOf(error)}); re-publish the package, or ${fix}`, { file: 'manifest.json', url });
    }
  };
  let manifest;
  try {
    // no-cache: revalidate, so a re-published manifest is seen at once.
    manifest = await fetchRetrying({ file: 'manifest.json', url, init: { cache: 'no-cache', credentials: 'same-origin' }, read, signal, emit });
  } catch (error) {
    if (error instanceof PackLoadError && error.status) {
      throw new PackLoadError(`${error.message}: is the package published there? baseUrl ${baseUrl} comes from ${how}; ${fix}`, { file: 'manifest.json', url, status: error.status });
    }
    throw error;
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
  // every key the schema requires, where it sits (manifest_keys.js is generated from the schema)
  for (const [place, keys] of Object.entries(REQUIRED_KEYS)) {
    const [top, each] = place.split('.');
    const holders = !top ? [['', manifest]] : each ? Object.entries(manifest[top] || {}).map(([name, value]) => [`${top}.${name}.`, value]) : [[`${top}.`, manifest[top]]];
    for (const [prefix, holder] of holders) {
      for (const key of keys) {
        if (!holder || typeof holder !== 'object' || !(key in holder)) throw new PackLoadError(`${where} has no "${prefix}${key}"; rebuild the package`);
      }
    }
  }
  return manifest;
}
