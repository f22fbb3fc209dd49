// Brotli bodies on any static host (brotli.js, files.js): the host probe, and a file fetched as its
// .br body and decoded here (the package's brotli-dec-wasm, or DecompressionStream) with its sha256
// checked on the decoded bytes. The decoder's files come from the npm package the build ships:
// tests/test_loader_js.py fetches them and names their folder in PACK_TEST_BROTLI_DECODER.

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, test } from 'node:test';
import { brotliCompressSync, brotliDecompressSync } from 'node:zlib';

import { brBody, forgetHosts, hostDecodes, nativeBrotli, probeHost, probePath, probeStoredBody, wasmDecoder } from '../../web_template/loader/brotli.js';
import { PackIntegrityError } from '../../web_template/loader/errors.js';
import { Files, ProgressTracker } from '../../web_template/loader/files.js';

const realFetch = globalThis.fetch;
const realStream = globalThis.DecompressionStream;
afterEach(() => {
  globalThis.fetch = realFetch;
  globalThis.DecompressionStream = realStream;
  forgetHosts();
});

const digest = (bytes) => createHash('sha256').update(bytes).digest('hex');
const DECODER_DIR = process.env.PACK_TEST_BROTLI_DECODER;
const decoderFiles = DECODER_DIR
  ? { 'decoder/dec.js': readFileSync(join(DECODER_DIR, 'brotli_dec_wasm.js')), 'decoder/dec.wasm': readFileSync(join(DECODER_DIR, 'brotli_dec_wasm_bg.wasm')) }
  : null;
const needsDecoder = DECODER_DIR ? {} : { skip: 'run through tests/test_loader_js.py, which fetches the decoder the build ships' };

// A model-like file that brotli shrinks, and its .br body.
const model = Uint8Array.from({ length: 60000 }, (_, i) => (i * 7) % 251 < 40 ? i % 13 : 0);
const modelBr = new Uint8Array(brotliCompressSync(model));

/**
 * A static host over `files` (path → bytes): `decodes` serves X from X.br with Content-Encoding
 * (as pack serve, and pack export's nginx, Apache and serve configurations, which mark X.br asked by
 * its own name too), else every file as it is (python's http.server). Records [method, path].
 */
function host(files, { decodes }) {
  const requests = [];
  globalThis.fetch = async (url, init = {}) => {
    const method = init.method || 'GET';
    const path = new URL(url).pathname.slice(1);
    requests.push([method, path]);
    let body = files[path];
    const headers = {};
    if (decodes && body === undefined && files[`${path}.br`]) {
      body = files[`${path}.br`];
      headers['Content-Encoding'] = 'br';
    } else if (decodes && path.endsWith('.br') && body !== undefined) {
      headers['Content-Encoding'] = 'br'; // X.br by its own name: marked, as the configured hosts do
    }
    if (body === undefined) return new Response('missing', { status: 404, statusText: 'Not Found' });
    headers['Content-Length'] = String(body.length);
    // fetch() hands the page decoded bytes where the host said Content-Encoding: br
    const delivered = headers['Content-Encoding'] ? new Uint8Array(brotliDecompressSync(body)) : body;
    return new Response(method === 'HEAD' ? null : delivered, { headers });
  };
  return requests;
}

function packageOf({ stored = false, decoder = true } = {}) {
  const files = {
    'pkg/model.onnx.br': modelBr,
    ...(stored ? {} : { 'pkg/model.onnx': model }),
    ...(decoder && decoderFiles ? Object.fromEntries(Object.entries(decoderFiles).map(([path, bytes]) => [`pkg/${path}`, bytes])) : {}),
  };
  const manifest = {
    files: {
      'model.onnx': { sha256: digest(model), size: model.length, encodings: { br: { path: 'model.onnx.br', size: modelBr.length } }, ...(stored ? { stored: 'br' } : {}) },
      ...(decoderFiles ? Object.fromEntries(Object.entries(decoderFiles).map(([path, bytes]) => [path, { sha256: digest(bytes), size: bytes.length, encodings: {} }])) : {}),
    },
    runtime: { bundles: {}, ...(decoder ? { decoder: { package: 'brotli-dec-wasm', version: '2.3.2', module: 'decoder/dec.js', wasm: 'decoder/dec.wasm' } } : {}) },
  };
  return { files, manifest };
}

function store(manifest) {
  const events = [];
  const progress = [];
  const files = new Files({ baseUrl: new URL('https://static.test/pkg/'), manifest, cache: null, progress: new ProgressTracker((p) => progress.push(p)), emit: (e) => events.push(e), signal: null });
  return { files, events, progress };
}

test('probeHost reads the HEAD answer: Content-Encoding or the .br size says the host decodes, the decoded size says it does not', async () => {
  const entry = { size: 1000, encodings: { br: { path: 'm.br', size: 300 } } };
  const answer = (status, headers) => async () => new Response(null, { status, headers });
  const ask = (fetchImpl, e = entry) => probeHost('https://h.test/m', e, { fetchImpl });
  assert.equal((await ask(answer(200, { 'Content-Encoding': 'br', 'Content-Length': '300' }))).decodes, true);
  assert.equal((await ask(answer(200, { 'Content-Length': '300' }))).decodes, true);
  const plain = await ask(answer(200, { 'Content-Length': '1000' }));
  assert.deepEqual(plain, { decodes: false, how: 'HEAD https://h.test/m: Content-Length 1000, its decoded size' });
  // gzip on the fly is more than the .br body
  assert.deepEqual(await ask(answer(200, { 'Content-Encoding': 'gzip' })), { decodes: false, how: 'HEAD https://h.test/m: Content-Encoding gzip, not its .br body' });
  // cannot say: a 404 where the file should be, no length, a failed request
  assert.equal((await ask(answer(404))).decodes, null);
  assert.match((await ask(answer(200, {}))).how, /Content-Length absent, neither its \.br size \(300\) nor its own \(1000\)/);
  assert.equal((await ask(async () => { throw new TypeError('network error'); })).decodes, null);
});

test('probeStoredBody asks for the .br body an export keeps: Content-Encoding br says the host answers X with it, the body as it is says it does not', async () => {
  const answer = (status, headers) => async () => new Response(null, { status, headers });
  const ask = (fetchImpl) => probeStoredBody('https://h.test/m.br', { fetchImpl });
  assert.deepEqual(await ask(answer(200, { 'Content-Encoding': 'br', 'Content-Length': '300' })), { decodes: true, how: 'HEAD https://h.test/m.br: Content-Encoding br, so this host answers X with X.br' });
  assert.deepEqual(await ask(answer(200, { 'Content-Length': '300' })), { decodes: false, how: 'HEAD https://h.test/m.br: no Content-Encoding, a .br file served as it is' });
  assert.equal((await ask(answer(200, { 'Content-Encoding': 'gzip' }))).decodes, false); // gzip on the fly over the .br file
  assert.equal((await ask(answer(404))).decodes, null);
  assert.equal((await ask(async () => { throw new TypeError('network error'); })).decodes, null);
});

test('probePath asks about the smallest file whose .br body differs; hostDecodes asks each origin once', async () => {
  const manifest = {
    files: {
      'big.bin': { size: 900, encodings: { br: { path: 'big.bin.br', size: 100 } } },
      'small.bin': { size: 50, encodings: { br: { path: 'small.bin.br', size: 20 } } },
      'raw.bin': { size: 10, encodings: {} },
    },
  };
  assert.equal(probePath(manifest), 'small.bin');
  assert.equal(probePath({ ...manifest, runtime: { bundles: { wasm: { module: 'big.bin', wasm: 'raw.bin' } } } }), 'big.bin');
  assert.equal(probePath({ files: { 'raw.bin': { size: 10, encodings: {} } } }), null);
  assert.equal(brBody(manifest.files['raw.bin']), null);
  const heads = [];
  const fetchImpl = async (url) => {
    heads.push(url);
    return new Response(null, { headers: { 'Content-Length': '50' } });
  };
  const first = await hostDecodes(new URL('https://h.test/a/'), manifest, { fetchImpl });
  const again = await hostDecodes(new URL('https://h.test/b/'), manifest, { fetchImpl });
  assert.deepEqual([first.decodes, again.decodes, heads], [false, false, ['https://h.test/a/small.bin']]);
});

test('on a host that serves .br files as they are, a file comes as its .br body, decoded by the package decoder, checked on the decoded bytes', needsDecoder, async () => {
  assert.equal(nativeBrotli(), false, 'Node has no DecompressionStream("brotli"): this test is the decoder path');
  const { files: served, manifest } = packageOf();
  const requests = host(served, { decodes: false });
  const { files, events, progress } = store(manifest);
  files.plan('model.onnx');
  assert.deepEqual(Array.from(await files.get('model.onnx')), Array.from(model));
  // one HEAD, then the .br body; the decoded name is never fetched; the decoder only on this host
  assert.deepEqual(requests, [['HEAD', 'pkg/model.onnx'], ['GET', 'pkg/model.onnx.br'], ['GET', 'pkg/decoder/dec.js'], ['GET', 'pkg/decoder/dec.wasm']]);
  const hostEvent = events.find((e) => e.type === 'host');
  assert.deepEqual([hostEvent.decodesBrotli, hostEvent.decoder], [false, 'brotli-dec-wasm']);
  const download = events.find((e) => e.type === 'download' && e.file === 'model.onnx');
  // Node has no page Worker: the decoder ran on this thread, and the event says so
  assert.deepEqual([download.wireBytes, download.decodedBy, download.decodedIn], [modelBr.length, 'brotli-dec-wasm', 'this thread']);
  const last = progress.filter((p) => p.file === 'model.onnx').at(-1);
  assert.deepEqual([last.fileLoaded, last.fileTotal], [model.length, model.length]);

  // a .br body that decodes to other bytes is an integrity failure, not a silent change
  forgetHosts();
  const other = model.slice();
  other[5] ^= 1;
  const tampered = new Uint8Array(brotliCompressSync(other));
  const listed = structuredClone(manifest);
  listed.files['model.onnx'].encodings.br.size = tampered.length;
  host({ ...served, 'pkg/model.onnx.br': tampered }, { decodes: false });
  const { files: changed } = store(listed);
  await assert.rejects(changed.get('model.onnx'), (e) => e instanceof PackIntegrityError && /^model\.onnx: sha256 mismatch/.test(e.message));
  // bytes that are not brotli are retried, then named
  forgetHosts();
  const garbage = Uint8Array.from(modelBr, (b, i) => (i < 8 ? 0xff : b));
  host({ ...served, 'pkg/model.onnx.br': garbage }, { decodes: false });
  const { files: broken, events: brokenEvents } = store(manifest);
  await assert.rejects(broken.get('model.onnx'), (e) => /download from https:\/\/static\.test\/pkg\/model\.onnx\.br failed 3 times \(.*does not decode/.test(e.message));
  assert.equal(brokenEvents.filter((e) => e.type === 'retry').length, 2);
});

test('an export that keeps only X.br loads on a plain host without asking for X (no 404 in the console)', needsDecoder, async () => {
  const { files: served, manifest } = packageOf({ stored: true });
  const requests = host(served, { decodes: false });
  const { files } = store(manifest);
  assert.deepEqual(Array.from(await files.get('model.onnx')), Array.from(model));
  assert.deepEqual(requests.slice(0, 2), [['HEAD', 'pkg/model.onnx.br'], ['GET', 'pkg/model.onnx.br']]);
  assert.ok(!requests.some(([, path]) => path === 'pkg/model.onnx'), requests);
});

test('on a host that decodes .br itself nothing changes: X is fetched and the decoder never is', async () => {
  const { files: served, manifest } = packageOf({ stored: true });
  const requests = host(served, { decodes: true });
  const { files, events } = store(manifest);
  assert.deepEqual(Array.from(await files.get('model.onnx')), Array.from(model));
  assert.deepEqual(requests, [['HEAD', 'pkg/model.onnx.br'], ['GET', 'pkg/model.onnx']]);
  assert.deepEqual(events.map((e) => e.type), ['host', 'download']);
  assert.equal(events[0].decodesBrotli, true);
  assert.equal(events[1].decodedBy, undefined);
});

test("DecompressionStream('brotli'), where the browser has it, decodes instead of the package's decoder", async () => {
  globalThis.DecompressionStream = class {
    constructor(format) {
      if (format !== 'brotli') throw new TypeError(`Unsupported compression format: '${format}'`);
      const chunks = [];
      const transform = new TransformStream({
        transform: (chunk) => chunks.push(chunk),
        flush: (controller) => controller.enqueue(new Uint8Array(brotliDecompressSync(Buffer.concat(chunks)))),
      });
      return transform;
    }
  };
  assert.equal(nativeBrotli(), true);
  const { files: served, manifest } = packageOf();
  const requests = host(served, { decodes: false });
  const { files, events } = store(manifest);
  assert.deepEqual(Array.from(await files.get('model.onnx')), Array.from(model));
  assert.deepEqual(requests, [['HEAD', 'pkg/model.onnx'], ['GET', 'pkg/model.onnx.br']]);
  assert.equal(events.find((e) => e.type === 'download').decodedBy, 'DecompressionStream');
});

test('a package without a decoder on a plain host still loads (the decoded files) and says why it is slow', async () => {
  const { files: served, manifest } = packageOf({ decoder: false });
  const requests = host(served, { decodes: false });
  const { files, events } = store(manifest);
  assert.deepEqual(Array.from(await files.get('model.onnx')), Array.from(model));
  assert.deepEqual(requests, [['HEAD', 'pkg/model.onnx'], ['GET', 'pkg/model.onnx']]);
  assert.match(events.find((e) => e.type === 'warning').message, /serves \.br files without Content-Encoding.*files move decoded; rebuild the package/);
});

test('the package decoder decodes what brotli encoded, once instantiated per thread', needsDecoder, async () => {
  const decompress = await wasmDecoder(decoderFiles['decoder/dec.js'], decoderFiles['decoder/dec.wasm']);
  assert.equal(await wasmDecoder(decoderFiles['decoder/dec.js'], decoderFiles['decoder/dec.wasm']), decompress);
  const text = new TextEncoder().encode('pack '.repeat(5000));
  assert.deepEqual(Buffer.from(decompress(new Uint8Array(brotliCompressSync(text)))), Buffer.from(text));
});
