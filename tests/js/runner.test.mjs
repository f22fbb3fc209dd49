import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PackIntegrityError, WatchdogError } from '../../web_template/loader/errors.js';
import { ProgressTracker } from '../../web_template/loader/files.js';
import { Runner, epSpec, lock, withWatchdog } from '../../web_template/loader/runner.js';
import { threadFacts, threadPlan, warnSingleThread } from '../../web_template/loader/runtime.js';
import { fakeOrt, manifest } from './helpers.mjs';

test('withWatchdog: the promise when it settles in time, a WatchdogError naming the step otherwise', async () => {
  assert.equal(await withWatchdog(Promise.resolve(7), 50, 'x'), 7);
  await assert.rejects(withWatchdog(new Promise(() => {}), 20, 'webgpu/fp32 run'), (e) => e instanceof WatchdogError && e.message === 'webgpu/fp32 run took longer than 20 ms (watchdog)');
  await assert.rejects(withWatchdog(Promise.reject(new Error('own')), 50, 'x'), /own/);
  assert.equal(await withWatchdog(Promise.resolve(1), 0, 'no limit'), 1);
});

test('lock runs tasks one after another; a failed one does not stop the next', async () => {
  const queue = lock();
  const order = [];
  const slow = queue(async () => { await new Promise((r) => setTimeout(r, 20)); order.push('slow'); throw new Error('x'); });
  const fast = queue(async () => order.push('fast'));
  await assert.rejects(slow);
  await fast;
  assert.deepEqual(order, ['slow', 'fast']);
});

test('epSpec passes the webgpu layout option', () => {
  assert.deepEqual(epSpec(manifest({ epOptions: { webgpu: { preferredLayout: 'NCHW' } } }), 'webgpu'), { name: 'webgpu', preferredLayout: 'NCHW' });
  assert.equal(epSpec(manifest(), 'wasm'), 'wasm');
});

function runner(behaviours, attempts, extra = {}) {
  const log = [];
  const events = [];
  const ort = fakeOrt(behaviours, log);
  // The sample: x = 1, 2, 3, 4 (read when a pre-warm fails).
  const sample = { file: 'sample.cccccccccccccccc.bin', tensors: { x: { dtype: 'float32', dims: [1, 4], offset: 0, length: 16 } }, outputs: {} };
  const files = { get: async (path) => (path === sample.file ? new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer) : new TextEncoder().encode(path.includes('fp16') ? 'fp16' : 'fp32')) };
  const r = new Runner({
    ort, manifest: manifest({ sample }), files, attempts, fallbacks: [], skipped: [], options: { watchdogMs: 1000, ...extra }, emit: (e) => events.push(e),
    bundle: 'webgpu', platform: 'desktop', chain: ['webgpu', 'wasm'], threads: 1, selection: null,
  });
  return { r, log, events };
}

test('Runner falls back on a failed creation, or a pre-warm whose sample run fails too, once per failure, and says why', async (t) => {
  t.mock.method(console, 'warn', () => {});
  const { r, events } = runner({ 'webgpu/fp16': { createError: 'requires f16' }, 'webgpu/fp32': { runError: 'device lost' } }, [
    { ep: 'webgpu', variant: 'fp16' }, { ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' },
  ]);
  const current = await r.openNext({ prewarm: true, signal: null });
  assert.deepEqual([current.ep, current.variant], ['wasm', 'fp32']);
  assert.deepEqual(r.fallbacks.map((f) => [f.ep, f.variant, f.phase]), [['webgpu', 'fp16', 'create'], ['webgpu', 'fp32', 'prewarm']]);
  assert.equal(r.fallbacks[0].error, 'requires f16');
  assert.equal(r.fallbacks[1].error, 'pre-warm run failed (device lost) and so did the sample run (device lost)');
  assert.deepEqual(r.fallbacks[1].inputShapes, { x: [1, 4] });
  assert.deepEqual(events.filter((e) => e.type === 'fallback').map((e) => e.to), [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  const info = r.info();
  assert.equal(info.ep, 'wasm');
  assert.equal(info.verified, 'unverified');
  assert.equal(info.prewarmError, null);
});

test('a pre-warm error is not a provider failure when the sample runs', async (t) => {
  t.mock.method(console, 'warn', () => {});
  const log = [];
  const events = [];
  // The session rejects the pre-warm's zeros (x all 0) and runs the sample (x = 1, 2, 3, 4).
  const ort = fakeOrt({}, log);
  const create = ort.InferenceSession.create;
  ort.InferenceSession.create = async (bytes, options) => {
    const session = await create(bytes, options);
    const run = session.run;
    session.run = (feeds) => (feeds.x.data.every((v) => v === 0) ? Promise.reject(new Error('sr = 0: LSTM rejects the input')) : run(feeds));
    return session;
  };
  const sampleBytes = new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer);
  const m = manifest({ sample: { file: 'sample.cccccccccccccccc.bin', tensors: { x: { dtype: 'float32', dims: [1, 4], offset: 0, length: 16 } }, outputs: {} } });
  const fetched = [];
  const files = { get: async (path) => (fetched.push(path), path.startsWith('sample') ? sampleBytes : new TextEncoder().encode(path.includes('fp16') ? 'fp16' : 'fp32')) };
  const r = new Runner({
    ort, manifest: m, files, attempts: [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }], fallbacks: [], skipped: [],
    options: { watchdogMs: 1000 }, emit: (e) => events.push(e), bundle: 'webgpu', platform: 'desktop', chain: ['webgpu', 'wasm'], threads: 1, selection: null,
  });
  const current = await r.openNext({ prewarm: true, signal: null });
  assert.deepEqual([current.ep, current.variant], ['webgpu', 'fp32']);
  assert.deepEqual(r.fallbacks, []);
  assert.deepEqual(r.info().prewarmError, { ep: 'webgpu', variant: 'fp32', error: 'sr = 0: LSTM rejects the input', verdict: 'the sample ran: not a provider failure' });
  assert.ok(fetched.includes('sample.cccccccccccccccc.bin'));
  assert.ok(events.some((e) => e.type === 'warning' && /pre-warm run failed/.test(e.message)));
});

test('Runner.run re-runs on the next provider after a run failure; bad feeds never fall back', async (t) => {
  t.mock.method(console, 'warn', () => {});
  const { r } = runner({ 'webgpu/fp32': { runError: 'hung' } }, [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  await r.openNext({ prewarm: false, signal: null });
  const outputs = await r.run({ x: { data: Float32Array.from([1, 2, 3, 4]), dims: [1, 4], type: 'float32' } });
  assert.deepEqual(Array.from(outputs.y.data), [1, 2, 3, 4]);
  assert.equal(r.info().ep, 'wasm');
  await assert.rejects(r.run({}), TypeError);
  assert.equal(r.fallbacks.length, 1);
});

test('Runner: an integrity error stops at once; nothing left is a PackLoadError listing each failure', async (t) => {
  t.mock.method(console, 'warn', () => {});
  const { r } = runner({}, [{ ep: 'webgpu', variant: 'fp32' }]);
  r.files.get = async () => { throw new PackIntegrityError('m: sha256 mismatch'); };
  await assert.rejects(r.openNext({ prewarm: false, signal: null }), PackIntegrityError);
  const empty = runner({ 'wasm/fp32': { createError: 'no wasm' } }, [{ ep: 'wasm', variant: 'fp32' }]);
  await assert.rejects(empty.r.openNext({ prewarm: false, signal: null }), /no execution provider worked \(wasm\/fp32: no wasm\)/);
});

test('Runner.adopt makes a trial session current, with the rest as fallbacks', () => {
  const { r } = runner({}, [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  const session = { release() {} };
  r.adopt({ ep: 'wasm', variant: 'fp32', session });
  assert.deepEqual(r.attempts, [{ ep: 'wasm', variant: 'fp32' }, { ep: 'webgpu', variant: 'fp32' }]);
  assert.equal(r.next, 1);
  assert.equal(r.current.session, session);
});

test('threadPlan: explicit, isolated (up to 4), never on Apple mobile, 1 without isolation, and why', () => {
  const warnings = [];
  const count = (facts, emit) => threadPlan(facts, emit).threads;
  assert.equal(count({ isolated: true, platform: 'desktop', cores: 16 }), 4);
  assert.equal(count({ isolated: true, platform: 'desktop', cores: 2 }), 2);
  assert.equal(count({ isolated: true, platform: 'apple-mobile', cores: 8 }), 1);
  assert.equal(count({ isolated: false, platform: 'desktop', cores: 8 }), 1);
  assert.equal(count({ numThreads: 3, isolated: false }, (e) => warnings.push(e)), 1);
  assert.match(warnings[0].message, /needs a cross-origin isolated page/);
  assert.equal(count({ numThreads: 2.7, isolated: true }), 2);
  assert.throws(() => count({ numThreads: 0 }), /numThreads must be a number >= 1/);
  assert.equal(threadPlan({ isolated: true, platform: 'desktop', cores: 16 }).why, 'cross-origin isolated: 4 of 16 cores (at most 4)');
  assert.match(threadPlan({ isolated: false, platform: 'desktop', cores: 8 }).why, /^the page is not cross-origin isolated \(crossOriginIsolated false: serve it with Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: require-corp\)$/);
  assert.match(threadPlan({ isolated: true, platform: 'apple-mobile', cores: 8 }).why, /^Apple mobile: one thread/);
  assert.equal(threadPlan({ numThreads: 2, isolated: true }).why, 'the numThreads option');
  assert.match(threadPlan({ numThreads: 3, isolated: false }).why, /^numThreads 3 asked, but the page is not cross-origin isolated/);
});

test('threads only with crossOriginIsolated and SharedArrayBuffer; WebKit isolated without it runs 1 and says why', () => {
  // the two globals, faked: Chromium/Firefox isolated, WebKitGTK isolated without SharedArrayBuffer, a plain page
  const chromium = threadFacts({ crossOriginIsolated: true, SharedArrayBuffer: class {} });
  const webkit = threadFacts({ crossOriginIsolated: true });
  const plain = threadFacts({ crossOriginIsolated: false, SharedArrayBuffer: class {} });
  assert.deepEqual(chromium, { isolated: true, shared: true });
  assert.deepEqual(webkit, { isolated: true, shared: false });
  assert.deepEqual(plain, { isolated: false, shared: true });
  assert.deepEqual(threadFacts({}), { isolated: false, shared: false });
  assert.equal(threadPlan({ ...chromium, platform: 'desktop', cores: 4 }).threads, 4);
  const onWebkit = threadPlan({ ...webkit, platform: 'desktop', cores: 4 });
  assert.equal(onWebkit.threads, 1);
  assert.match(onWebkit.why, /^this browser has no SharedArrayBuffer although the page is cross-origin isolated/);
  const warnings = [];
  const asked = threadPlan({ ...webkit, numThreads: 4, platform: 'desktop', cores: 4 }, (e) => warnings.push(e));
  assert.equal(asked.threads, 1);
  assert.match(asked.why, /^numThreads 4 asked, but this browser has no SharedArrayBuffer/);
  assert.match(warnings[0].message, /needs SharedArrayBuffer/);
  assert.equal(threadPlan({ ...plain, platform: 'desktop', cores: 4 }).threads, 1);
  // this node process: isolation is a browser notion (undefined here), SharedArrayBuffer exists
  assert.deepEqual(threadFacts(), { isolated: false, shared: true });
});

test('warnSingleThread: once per page, only when isolation would give this device more threads', () => {
  const said = [];
  const warn = (text) => said.push(text);
  const base = { threads: 1, isolated: false, platform: 'desktop', cores: 8, chain: ['webgpu', 'wasm'] };
  assert.equal(warnSingleThread({ ...base, platform: 'apple-mobile' }, warn), false); // one thread by choice
  assert.equal(warnSingleThread({ ...base, cores: 1 }, warn), false); // nothing to gain
  assert.equal(warnSingleThread({ ...base, chain: ['webgpu'] }, warn), false); // no wasm
  assert.equal(warnSingleThread({ ...base, threads: 4, isolated: true }, warn), false);
  assert.deepEqual(said, []);
  assert.equal(warnSingleThread(base, warn), true);
  assert.equal(warnSingleThread(base, warn), false); // once
  assert.equal(said.length, 1);
  assert.match(said[0], /^\[pack\] wasm runs on 1 thread: the page is not cross-origin isolated .* it would use up to 4 of this device's 8 cores/);
});

test('withFirst: the chosen pair, then the fallbacks in order, each once', async () => {
  const { withFirst } = await import('../../web_template/loader/load.js');
  const wasm = { ep: 'wasm', variant: 'fp32' };
  const webgpu = { ep: 'webgpu', variant: 'fp32' };
  assert.deepEqual(withFirst(wasm, [webgpu, wasm, webgpu]), [wasm, webgpu]);
});

test('the waits after the downloads are progress phases with their times: create, pre-warm, the first run', async (t) => {
  t.mock.method(console, 'warn', () => {});
  let now = 0;
  const progress = [];
  const tracker = new ProgressTracker((p) => progress.push(p), { clock: () => (now += 5), started: 0 });
  const ort = fakeOrt({ 'webgpu/fp16': { createError: 'requires f16' } });
  const files = { get: async (path) => new TextEncoder().encode(path.includes('fp16') ? 'fp16' : 'fp32'), progress: tracker };
  const r = new Runner({
    ort, manifest: manifest(), files, attempts: [{ ep: 'webgpu', variant: 'fp16' }, { ep: 'wasm', variant: 'fp32' }], fallbacks: [], skipped: [], options: { watchdogMs: 1000 },
    emit: () => {}, bundle: 'webgpu', platform: 'desktop', chain: ['webgpu', 'wasm'], threads: 1, selection: null,
  });
  await r.openNext({ prewarm: true, signal: null });
  const feeds = { x: { data: new Float32Array(4), dims: [1, 4], type: 'float32' } };
  await r.run(feeds);
  await r.run(feeds); // later runs are not a phase of the load
  const phases = progress.map((p) => [p.phase, p.state, p.ep, p.variant]);
  assert.deepEqual(phases, [
    ['create', 'start', 'webgpu', 'fp16'], // failed: no 'done', the fallback creates the next
    ['create', 'start', 'wasm', 'fp32'], ['create', 'done', 'wasm', 'fp32'],
    ['prewarm', 'start', 'wasm', 'fp32'], ['prewarm', 'done', 'wasm', 'fp32'],
    ['run', 'start', 'wasm', 'fp32'], ['run', 'done', 'wasm', 'fp32'],
  ]);
  for (const event of progress) assert.ok(event.elapsedMs > 0 && event.loaded === 0 && event.total === 0, JSON.stringify(event));
  const done = progress.filter((p) => p.state === 'done');
  assert.ok(done.every((p) => typeof p.ms === 'number' && p.ms >= 0), JSON.stringify(done));
  assert.ok(progress.every((p, i) => i === 0 || p.elapsedMs > progress[i - 1].elapsedMs));
});
