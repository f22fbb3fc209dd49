import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  IDLE_TIMEOUT_MS, browserKey, bundleForChoice, decisionKey, describeResults, packageHash, readDecision, runTrials, selectMode, startChoice, trialPlan, trialSlot,
  trustedWithoutCheck, writeDecision,
} from '../../web_template/loader/select.js';
import { fakeOrt, manifest, memoryStorage, run, Tensor } from './helpers.mjs';

test('selectMode: the option, else manifest.loader.select, else chain; anything else is an error', () => {
  assert.equal(selectMode(undefined, manifest()), 'chain');
  assert.equal(selectMode(undefined, manifest({ loader: { select: 'measured' } })), 'measured');
  assert.equal(selectMode('chain', manifest({ loader: { select: 'measured' } })), 'chain');
  assert.throws(() => selectMode('fastest', manifest()), /select must be one of measured, chain/);
});

test('packageHash follows the models, weight chunks, runtime files and EP options only', async () => {
  const files = { ...manifest().files, 'w.mjs': { sha256: '1'.repeat(64) }, 'w.wasm': { sha256: '2'.repeat(64) }, 'm.mjs': { sha256: '3'.repeat(64) }, 'm.wasm': { sha256: '4'.repeat(64) }, 'report.json': { sha256: '5'.repeat(64) } };
  const m = manifest({ files });
  const hash = await packageHash(m);
  assert.match(hash, /^[0-9a-f]{64}$/);
  assert.equal(await packageHash(manifest({ files: Object.fromEntries(Object.entries(files).reverse()) })), hash);
  // a rebuild that changes the report, the demo or the loader keeps the decision
  const cosmetic = { ...files, 'report.json': { sha256: 'c'.repeat(64) }, 'loader.js': { sha256: 'd'.repeat(64) }, 'demo.js': { sha256: 'e'.repeat(64) } };
  assert.equal(await packageHash(manifest({ files: cosmetic })), hash);
  // a model, a runtime file or an EP option does not
  assert.notEqual(await packageHash(manifest({ files: { ...files, 'model.fp16.bbbbbbbbbbbbbbbb.onnx': { sha256: 'f'.repeat(64) } } })), hash);
  assert.notEqual(await packageHash(manifest({ files: { ...files, 'w.wasm': { sha256: 'f'.repeat(64) } } })), hash);
  assert.notEqual(await packageHash(manifest({ files, epOptions: { webgpu: { preferredLayout: 'NCHW' } } })), hash);
  const chunked = manifest({ files: { ...files, 'p0.bin': { sha256: '6'.repeat(64) } } });
  chunked.variants.fp32.externalData = { chunks: [{ file: 'p0.bin' }] };
  const chunkedHash = await packageHash(chunked);
  assert.notEqual(chunkedHash, hash);
  chunked.files['p0.bin'] = { sha256: '7'.repeat(64) };
  assert.notEqual(await packageHash(chunked), chunkedHash);
});

test('browserKey: the UA-CH brand when there is one, else parsed from the user agent', () => {
  assert.equal(browserKey({ userAgentData: { brands: [{ brand: 'Not)A;Brand', version: '99' }, { brand: 'Chromium', version: '131' }, { brand: 'Google Chrome', version: '131' }] } }), 'Google Chrome/131');
  assert.equal(browserKey({ userAgentData: { brands: [{ brand: 'Chromium', version: '150' }, { brand: 'Not=A?Brand', version: '24' }] } }), 'Chromium/150');
  assert.equal(browserKey({ userAgent: 'Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0' }), 'Firefox/133');
  assert.equal(browserKey({ userAgent: 'Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15' }), 'Safari/18.1');
  assert.equal(browserKey({ userAgent: 'Mozilla/5.0 (Windows NT 10.0) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0' }), 'Microsoft Edge/131');
});

test('a stored decision is reused only for the same package, adapter and browser, and a choice still allowed', () => {
  const storage = memoryStorage();
  const candidates = [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }];
  const key = decisionKey({ packageHash: 'p1', adapter: { vendor: 'Google', architecture: 'SwiftShader' }, browser: 'Chromium/150' });
  assert.deepEqual(key, { package: 'p1', adapter: { vendor: 'google', architecture: 'swiftshader', description: '' }, browser: 'Chromium/150' });
  assert.equal(readDecision(storage, 'https://x/pkg/', key, candidates), null);
  assert.ok(writeDecision(storage, 'https://x/pkg/', { key, choice: { ep: 'wasm', variant: 'fp32' }, ranking: [] }));
  assert.deepEqual(readDecision(storage, 'https://x/pkg/', key, candidates).choice, { ep: 'wasm', variant: 'fp32' });
  assert.equal(readDecision(storage, 'https://x/other/', key, candidates), null);
  for (const changed of [{ packageHash: 'p2' }, { adapter: { vendor: 'nvidia', architecture: 'hopper' } }, { browser: 'Chromium/151' }]) {
    const other = decisionKey({ packageHash: 'p1', adapter: { vendor: 'Google', architecture: 'SwiftShader' }, browser: 'Chromium/150', ...changed });
    assert.equal(readDecision(storage, 'https://x/pkg/', other, candidates), null, JSON.stringify(changed));
  }
  assert.equal(readDecision(storage, 'https://x/pkg/', key, [{ ep: 'webgpu', variant: 'fp32' }]), null);
  storage.setItem('pack-select-v1:https://x/pkg/', '{not json');
  assert.equal(readDecision(storage, 'https://x/pkg/', key, candidates), null);
  assert.equal(readDecision(null, 'https://x/pkg/', key, candidates), null);
  assert.equal(writeDecision({ setItem() { throw new Error('quota'); } }, 's', {}), false);
});

test('trialPlan: the chain choice first, then by prior; far slower candidates skipped with the figure', () => {
  const candidates = [{ ep: 'webgpu', variant: 'fp16' }, { ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }];
  const priors = new Map([['webgpu/fp16', 125], ['webgpu/fp32', 45], ['wasm/fp32', 200]]);
  const { order, skipped } = trialPlan(candidates, priors, { ep: 'webgpu', variant: 'fp16' });
  assert.deepEqual(order.map((c) => `${c.ep}/${c.variant}`), ['webgpu/fp16', 'webgpu/fp32']);
  assert.deepEqual(skipped.map((c) => [c.ep, c.variant, c.result, c.priorMs]), [['wasm', 'fp32', 'skipped', 200]]);
  assert.match(skipped[0].detail, /4\.4× slower than the best/);
  assert.deepEqual(trialPlan(candidates, new Map(), null).order.map((c) => c.variant), ['fp16', 'fp32', 'fp32']);
});

test('trustedWithoutCheck: checkable on the device, or verified in a browser by the build', () => {
  const m = manifest({ thresholds: { webgpu: { fp32: { y: {} } } } });
  const candidates = [{ ep: 'webgpu', variant: 'fp32', status: 'unverified' }, { ep: 'wasm', variant: 'fp32', status: 'passed' }, { ep: 'webgpu', variant: 'fp16', status: 'not-verifiable' }];
  assert.deepEqual(trustedWithoutCheck(m, { y: {} }, candidates).map((c) => `${c.ep}/${c.variant}`), ['webgpu/fp32', 'wasm/fp32']);
  assert.deepEqual(trustedWithoutCheck(m, null, candidates).map((c) => `${c.ep}/${c.variant}`), ['wasm/fp32']);
});

function trialSetup(behaviours, extra = {}) {
  const log = [];
  const bounds = { y: { rel_l2: 1e-3, max_abs_of_range: 1e-3 } };
  const m = manifest({ thresholds: { webgpu: { fp16: bounds, fp32: bounds }, wasm: { fp32: bounds } } });
  const x = new Tensor('float32', Float32Array.from([1, 2, 3, 4]), [1, 4]);
  return {
    log,
    args: {
      ort: fakeOrt(behaviours, log), manifest: m,
      candidates: [{ ep: 'webgpu', variant: 'fp16' }, { ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }],
      priors: new Map(), first: { ep: 'webgpu', variant: 'fp16' },
      modelBytes: async (variant) => new TextEncoder().encode(variant), feeds: { x },
      reference: { y: { type: 'float32', data: Float32Array.from([1, 2, 3, 4]), dims: [1, 4] } },
      watchdogMs: 5000, budgetMs: 5000, sessionOptions: {}, emit: () => {}, signal: null, ...extra,
    },
  };
}

test('runTrials keeps the fastest candidate whose outputs match, drops a corrupted one, records failures', async () => {
  const { args, log } = trialSetup({
    'webgpu/fp16': { scale: 0 }, // all zeros: the fp16-without-f16 failure the notes describe
    'webgpu/fp32': { delayMs: 15 },
    'wasm/fp32': { delayMs: 1 },
  });
  const events = [];
  const { results, winner } = await runTrials({ ...args, emit: (e) => events.push(e) });
  assert.deepEqual([winner.ep, winner.variant], ['wasm', 'fp32']);
  assert.equal(winner.session.released, false);
  const rows = describeResults(results);
  assert.deepEqual(rows.map((r) => [r.ep, r.variant, r.result]), [['webgpu', 'fp16', 'mismatch'], ['webgpu', 'fp32', 'ok'], ['wasm', 'fp32', 'ok']]);
  assert.match(rows[0].detail, /outputs disagree with the build's fp32 reference: y: rel_l2 1 > 0\.001/);
  assert.ok(rows[1].steadyMs > rows[2].steadyMs, JSON.stringify(rows));
  assert.equal(rows[2].runs, 3);
  // Every session but the winner's is released.
  assert.deepEqual(log.filter(([what]) => what === 'release').map(([, ep, v]) => `${ep}/${v}`).sort(), ['webgpu/fp16', 'webgpu/fp32']);
  assert.deepEqual(events.filter((e) => e.type === 'trial' && e.phase === 'start').map((e) => `${e.ep}/${e.variant}`), ['webgpu/fp16', 'webgpu/fp32', 'wasm/fp32']);
});

test('runTrials: creation failures are recorded; the budget stops later candidates once one is good', async () => {
  const failing = trialSetup({ 'webgpu/fp16': { createError: 'requires f16' }, 'webgpu/fp32': { runError: 'lost device' } });
  const { results, winner } = await runTrials(failing.args);
  assert.deepEqual([winner.ep, winner.variant], ['wasm', 'fp32']);
  assert.deepEqual(describeResults(results).map((r) => [r.result, r.detail]), [['failed', 'requires f16'], ['failed', 'lost device'], ['ok', undefined]]);

  // A slow first candidate: one checked and one timed run, then the next gets its turn ...
  const slow = trialSetup({ 'webgpu/fp16': { delayMs: 60 } }, { budgetMs: 150 });
  const shared = describeResults((await runTrials(slow.args)).results);
  assert.deepEqual(shared.map((r) => [r.result, r.runs]), [['ok', 1], ['ok', 3], ['ok', 3]]);
  // ... unless four times the budget is gone: then the rest are not started.
  const slower = trialSetup({ 'webgpu/fp16': { delayMs: 50 } }, { budgetMs: 20 });
  const budget = describeResults((await runTrials(slower.args)).results);
  assert.deepEqual(budget.map((r) => r.result), ['ok', 'budget', 'budget']);
  assert.match(budget[1].detail, /ms of trial runs spent, over four times the 20 ms budget/);

  const none = trialSetup({ 'webgpu/fp16': { scale: 2 }, 'webgpu/fp32': { scale: 2 }, 'wasm/fp32': { scale: 2 } });
  assert.equal((await runTrials(none.args)).winner, null);
});

test('startChoice: the fastest pair the build measured on this adapter class, else the chain first', () => {
  const candidates = [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }];
  assert.deepEqual(startChoice(candidates, new Map([['webgpu/fp32', 48.4], ['wasm/fp32', 1.9]]), candidates[0]), { choice: { ep: 'wasm', variant: 'fp32' }, from: 'build measurements' });
  assert.deepEqual(startChoice(candidates, new Map(), candidates[0]), { choice: { ep: 'webgpu', variant: 'fp32' }, from: 'chain' });
  assert.deepEqual(startChoice(candidates, new Map(), { ep: 'webgpu', variant: 'fp16' }).choice, { ep: 'webgpu', variant: 'fp32' });
});

test('bundleForChoice: wasm chosen on the webgpu bundle loads the wasm-only bundle, unless it is not shipped or refused there', () => {
  const m = manifest();
  assert.equal(bundleForChoice(m, 'webgpu', { ep: 'wasm', variant: 'fp32' }), 'wasm');
  assert.equal(bundleForChoice(m, 'webgpu', { ep: 'webgpu', variant: 'fp32' }), 'webgpu');
  assert.equal(bundleForChoice(manifest({ runtime: { bundles: { webgpu: { module: 'w.mjs', wasm: 'w.wasm' } } } }), 'webgpu', { ep: 'wasm', variant: 'fp32' }), 'webgpu');
  const refused = manifest({ verification: { browser: true, passed: false, runs: [run('wasm', 'wasm', 'fp32', 'failed')] } });
  assert.equal(bundleForChoice(refused, 'webgpu', { ep: 'wasm', variant: 'fp32' }), 'webgpu');
});

test('trialPlan with `last`: the pair serving the app is measured last', () => {
  const candidates = [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }];
  assert.deepEqual(trialPlan(candidates, new Map(), null, { ep: 'webgpu', variant: 'fp32' }).order.map((c) => c.ep), ['wasm', 'webgpu']);
});

test('trialSlot: waits for a visible page and an idle moment; a low battery or Save-Data postpones the trials', async () => {
  const listeners = new Set();
  const doc = { visibilityState: 'hidden', addEventListener: (_, f) => listeners.add(f), removeEventListener: (_, f) => listeners.delete(f) };
  let idle = 0;
  const env = { document: doc, navigator: {}, requestIdleCallback: (f, { timeout }) => { idle = timeout; setTimeout(f, 0); } };
  let done = false;
  const slot = trialSlot(null, env).then((why) => { done = true; return why; });
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(done, false); // hidden: nothing runs
  doc.visibilityState = 'visible';
  for (const f of [...listeners]) f();
  assert.equal(await slot, null);
  assert.equal(idle, IDLE_TIMEOUT_MS);
  const battery = { ...env, document: { visibilityState: 'visible' }, navigator: { getBattery: async () => ({ charging: false, level: 0.12 }) } };
  assert.equal(await trialSlot(null, battery), 'battery at 12 % and not charging');
  const charging = { ...battery, navigator: { getBattery: async () => ({ charging: true, level: 0.12 }) } };
  assert.equal(await trialSlot(null, charging), null);
  assert.match(await trialSlot(null, { ...env, document: null, navigator: { connection: { saveData: true } } }), /Save-Data/);
  const aborted = new AbortController();
  aborted.abort();
  await assert.rejects(trialSlot(aborted.signal, { ...env, document: { visibilityState: 'visible' } }));
});
