// Brotli bodies on any static host. A host that serves `X.br` under `X` with
// `Content-Encoding: br` (pack serve, S3/R2 through pack publish, a configured nginx or Apache)
// lets the browser decode. One that serves files as they are (python's http.server, GitHub
// Pages-style hosting) would send the decoded files instead (5.7x the bytes for GTCRN), or, in an
// export that keeps only `X.br`, nothing at `X`. On such a host the loader fetches the `.br`
// bodies itself and decodes them: DecompressionStream('brotli') where the browser has it, else the
// package's brotli decoder (manifest runtime.decoder, loaded only then, run in widen.js's Worker).
//
// Which kind of host: one HEAD request per origin for a file with a `.br` body. Its Content-Length
// is the size of the body the host would send: the `.br` size (it decodes), the decoded size (it
// serves files as they are). HEAD and not Resource Timing on a first download: it decides before
// any body moves, and Content-Length is readable cross-origin (a CORS-safelisted header) where
// Resource Timing's sizes read 0 without Timing-Allow-Origin. A host that compresses on the fly
// (gzip) sends more than the `.br` body: the loader fetches that. Any other answer (no length, HEAD
// refused) keeps the browser's own decoding; either way a file missing under one name is fetched
// under the other.
//
// Where an export keeps only `X.br` (`stored: 'br'`), X exists only on a host configured to answer
// it, and asking for X on any other host is a 404 the browser logs in red on every first visit. The
// probe asks for `X.br` there instead, which every host has: the hosts that answer X with it
// (pack export's nginx, Apache and serve configurations) mark it `Content-Encoding: br`, the others
// serve it as it is.

import { PackLoadError, messageOf } from './errors.js';

/** origin → Promise<{ decodes, how }>: a host is asked once per page. */
const hosts = new Map();

/** The `.br` body of a files entry ({ path, size }), or null. */
export function brBody(entry) {
  const br = entry && entry.encodings && entry.encodings.br;
  return br && typeof br.path === 'string' && typeof br.size === 'number' ? br : null;
}

/**
 * The package path the probe asks about: a runtime module with a `.br` body (every first visit
 * fetches one), else the smallest file whose `.br` body differs in size from its own, else null.
 */
export function probePath(manifest) {
  const bundles = (manifest.runtime && manifest.runtime.bundles) || {};
  for (const bundle of Object.values(bundles)) {
    const entry = manifest.files && manifest.files[bundle.module];
    const br = brBody(entry);
    if (br && br.size !== entry.size) return bundle.module;
  }
  let best = null;
  for (const [path, entry] of Object.entries(manifest.files || {})) {
    const br = brBody(entry);
    if (br && br.size !== entry.size && (!best || entry.size < best.size)) best = { path, size: entry.size };
  }
  return best && best.path;
}

/** A HEAD for a probe: { response } or, when the request itself failed, { failed: the probe's answer }. */
async function head(url, signal, fetchImpl) {
  try {
    return { response: await fetchImpl(url, { method: 'HEAD', cache: 'no-store', credentials: 'same-origin', signal }) };
  } catch (error) {
    if (signal && signal.aborted) throw error;
    return { failed: { decodes: null, how: `HEAD ${url} failed (${messageOf(error)})` } };
  }
}

/**
 * { decodes: true | false | null, how }: whether the host at `url` (a file with a `.br` body and
 * its decoded self, `entry` its files entry) sends brotli bodies under their decoded names. null:
 * it cannot say.
 */
export async function probeHost(url, entry, { signal, fetchImpl = globalThis.fetch } = {}) {
  const br = brBody(entry);
  const { response, failed } = await head(url, signal, fetchImpl);
  if (failed) return failed;
  const encoding = response.headers.get('Content-Encoding');
  if (response.ok && encoding && /\bbr\b/i.test(encoding)) return { decodes: true, how: `HEAD ${url}: Content-Encoding ${encoding}` };
  const length = Number(response.headers.get('Content-Length'));
  if (!response.ok) return { decodes: null, how: `HEAD ${url}: HTTP ${response.status}` };
  // compressed on the fly (gzip, say): not from its .br body, which is smaller; a 404 for X.br goes back to X
  if (encoding && !/^\s*identity\s*$/i.test(encoding)) return { decodes: false, how: `HEAD ${url}: Content-Encoding ${encoding}, not its .br body` };
  if (length === br.size) return { decodes: true, how: `HEAD ${url}: Content-Length ${length}, its .br size` };
  if (length === entry.size) return { decodes: false, how: `HEAD ${url}: Content-Length ${length}, its decoded size` };
  return { decodes: null, how: `HEAD ${url}: Content-Length ${response.headers.get('Content-Length') ?? 'absent'}, neither its .br size (${br.size}) nor its own (${entry.size})` };
}

/**
 * { decodes, how } from a HEAD for the `.br` body itself (`url`), of an export that keeps only that
 * body: `Content-Encoding: br` says the host marks brotli bodies, as the configurations that answer
 * X with X.br do; the body as it is says the host serves `.br` files as files. A client that cannot
 * read Content-Encoding (cross-origin without Access-Control-Expose-Headers) counts it as the latter:
 * the loader then decodes, at the same bytes on the wire.
 */
export async function probeStoredBody(url, { signal, fetchImpl = globalThis.fetch } = {}) {
  const { response, failed } = await head(url, signal, fetchImpl);
  if (failed) return failed;
  if (!response.ok) return { decodes: null, how: `HEAD ${url}: HTTP ${response.status}` };
  const encoding = response.headers.get('Content-Encoding');
  if (encoding && /\bbr\b/i.test(encoding)) return { decodes: true, how: `HEAD ${url}: Content-Encoding ${encoding}, so this host answers X with X.br` };
  return { decodes: false, how: `HEAD ${url}: ${encoding ? `Content-Encoding ${encoding}` : 'no Content-Encoding'}, a .br file served as it is` };
}

/** The host probe once per origin (the answer is the host's, whichever package asks). */
export function hostDecodes(baseUrl, manifest, options = {}) {
  const path = probePath(manifest);
  if (!path) return Promise.resolve({ decodes: null, how: 'no file has a .br body' });
  const origin = new URL(baseUrl).origin;
  if (!hosts.has(origin)) {
    const entry = manifest.files[path];
    const asked = entry.stored === 'br' ? probeStoredBody(new URL(brBody(entry).path, baseUrl).href, options) : probeHost(new URL(path, baseUrl).href, entry, options);
    hosts.set(origin, asked);
    asked.catch(() => hosts.delete(origin)); // an aborted probe is asked again by the next load
  }
  return hosts.get(origin);
}

/** Forget what hosts said (tests). */
export function forgetHosts() {
  hosts.clear();
}

/** Whether this browser decodes brotli itself (Firefox does; Chromium 150 does not). */
export function nativeBrotli() {
  if (typeof DecompressionStream !== 'function') return false;
  try {
    new DecompressionStream('brotli');
    return true;
  } catch {
    return false;
  }
}

/** The bytes of a brotli body, decoded by the browser's DecompressionStream. */
export async function decodeNative(body) {
  const stream = new Blob([body]).stream().pipeThrough(new DecompressionStream('brotli'));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** An ES module from its bytes: a blob: URL, else (Node) a data: URL. */
async function importBytes(bytes) {
  const blobUrl = URL.createObjectURL(new Blob([bytes], { type: 'text/javascript' }));
  try {
    return await import(/* webpackIgnore: true */ /* @vite-ignore */ blobUrl);
  } catch (error) {
    if (typeof process === 'undefined') throw error;
    return await import(/* webpackIgnore: true */ /* @vite-ignore */ `data:text/javascript;base64,${Buffer.from(bytes).toString('base64')}`);
  } finally {
    URL.revokeObjectURL(blobUrl);
  }
}

let decoder = null;

/**
 * The shipped decoder's decompress(bytes) from its module and wasm bytes (brotli-dec-wasm: a
 * wasm-bindgen module whose default export instantiates the wasm it is given). One per thread.
 */
export function wasmDecoder(moduleBytes, wasmBytes) {
  if (!decoder) {
    decoder = (async () => {
      const module = await importBytes(moduleBytes);
      await module.default({ module_or_path: wasmBytes });
      if (typeof module.decompress !== 'function') throw new PackLoadError('the brotli decoder in manifest.json runtime.decoder has no decompress(); rebuild the package');
      return (bytes) => module.decompress(bytes);
    })();
    decoder.catch(() => {
      decoder = null;
    });
  }
  return decoder;
}
