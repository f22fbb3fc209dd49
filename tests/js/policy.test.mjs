import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PackLoadError } from '../../web_template/loader/errors.js';
import {
  adapterKey, bundleFor, candidatesFor, chainFor, chooseVariant, detectPlatform, farSlower, isRefused, normalizeChain, orderByPriors,
  pickVariant, planAttempts, priorsFor, refusalReason, refusingRun, sameAdapterClass, verificationStatus, wasmBundlePriors,
} from '../../web_template/loader/policy.js';
import { manifest, run } from './helpers.mjs';

const F16 = new Set(['shader-f16']);
const NONE = new Set();

test('detectPlatform: iPhone, iPadOS desktop mode, Android, desktop', () => {
  const ua = (s) => `Mozilla/5.0 (${s}) AppleWebKit/605.1.15 (KHTML, like Gecko)`;
  assert.equal(detectPlatform({ userAgent: ua('iPhone; CPU iPhone OS 18_1 like Mac OS X') }), 'apple-mobile');
  assert.equal(detectPlatform({ userAgent: ua('iPad; CPU OS 17_7 like Mac OS X') }), 'apple-mobile');
  assert.equal(detectPlatform({ userAgent: ua('Macintosh; Intel Mac OS X 10_15_7'), platform: 'MacIntel', maxTouchPoints: 5 }), 'apple-mobile');
  assert.equal(detectPlatform({ userAgent: ua('Macintosh; Intel Mac OS X 10_15_7'), platform: 'MacIntel', maxTouchPoints: 0 }), 'desktop');
  assert.equal(detectPlatform({ userAgent: ua('Linux; Android 10; K') }), 'android');
  assert.equal(detectPlatform({ userAgent: ua('Windows NT 10.0; Win64; x64') }), 'desktop');
  assert.equal(detectPlatform(), 'desktop');
});

test('chainFor: the manifest chain, else the defaults (Apple mobile: wasm only)', () => {
  const m = manifest({ executionProviders: { desktop: ['wasm'] } });
  assert.deepEqual(chainFor(m, 'desktop'), ['wasm']);
  assert.deepEqual(chainFor(m, 'apple-mobile'), ['wasm']);
  assert.deepEqual(chainFor(m, 'android'), ['webgpu', 'wasm']);
  assert.deepEqual(chainFor({}, 'desktop'), ['webgpu', 'wasm']);
});

test('normalizeChain refuses unknown or empty chains and drops duplicates', () => {
  assert.deepEqual(normalizeChain(['wasm', 'wasm']), ['wasm']);
  assert.throws(() => normalizeChain([]), PackLoadError);
  assert.throws(() => normalizeChain(['webnn']), /"webnn" is not supported/);
});

test('bundleFor: webgpu when the chain has webgpu; the webgpu bundle also runs wasm', () => {
  const m = manifest();
  assert.equal(bundleFor(m, ['webgpu', 'wasm']), 'webgpu');
  assert.equal(bundleFor(m, ['wasm']), 'wasm');
  assert.equal(bundleFor(manifest({ runtime: { bundles: { webgpu: {} } } }), ['wasm']), 'webgpu');
  assert.throws(() => bundleFor(manifest({ runtime: { bundles: { wasm: {} } } }), ['webgpu']), /no "webgpu" bundle/);
});

test('the refusal rule: any failed run matching the triple, "*" matching anything', () => {
  const hostFailed = { stage: 'host', bundle: '*', ep: '*', variant: 'fp16', status: 'failed', detail: 'max_abs_of_range 0.2 > 0.01' };
  const kernels = { stage: 'webgpu-kernels', bundle: '*', ep: 'webgpu', variant: 'fp32', status: 'failed', detail: 'rel_l2 0.5 > 0.001' };
  const m = manifest({ verification: { runs: [hostFailed, kernels, run('wasm', 'wasm', 'fp32', 'passed'), run('webgpu', 'wasm', 'fp32', 'failed', { detail: 'NaN' })] } });
  assert.equal(refusingRun(m, 'wasm', 'wasm', 'fp16'), hostFailed);
  assert.equal(refusingRun(m, 'webgpu', 'webgpu', 'fp32'), kernels);
  assert.equal(refusingRun(m, 'wasm', 'wasm', 'fp32'), null);
  assert.ok(isRefused(m, 'webgpu', 'wasm', 'fp32'));
  assert.ok(!isRefused(m, 'wasm', 'wasm', 'fp32'));
  assert.equal(refusalReason(hostFailed), 'failed its host check at build time: max_abs_of_range 0.2 > 0.01');
  assert.equal(refusalReason({ status: 'failed' }), 'failed its browser check at build time');
  // A passed webgpu-kernels run is no browser verdict.
  const onlyKernels = manifest({ verification: { runs: [{ ...kernels, status: 'passed' }] } });
  assert.equal(verificationStatus(onlyKernels, 'webgpu', 'webgpu', 'fp32'), 'unverified');
  assert.equal(verificationStatus(m, 'wasm', 'wasm', 'fp32'), 'passed');
  assert.equal(verificationStatus(m, 'wasm', 'wasm', 'fp16'), 'failed');
  assert.equal(verificationStatus(m, 'custom', 'wasm', 'fp32'), 'unverified');
  assert.equal(verificationStatus({ verification: { browser: false, passed: true } }, 'wasm', 'wasm', 'fp32'), 'unverified');
  // Schema 1 runs have no stage: browser runs.
  const schema1 = manifest({ verification: { runs: [{ bundle: 'webgpu', ep: 'webgpu', variant: 'fp16', status: 'not-verifiable' }] } });
  assert.equal(verificationStatus(schema1, 'webgpu', 'webgpu', 'fp16'), 'not-verifiable');
});

test('pickVariant follows shader-f16 and the recipe, passes over refused variants with a bundle', () => {
  const m = manifest();
  assert.deepEqual(
    [pickVariant(m, 'webgpu', F16), pickVariant(m, 'webgpu', NONE), pickVariant(m, 'wasm', F16), pickVariant(m, 'webgpu', NONE, 'fp16')],
    ['fp16', 'fp32', 'fp32', 'fp16'],
  );
  assert.equal(pickVariant(manifest({ variantFor: { webgpu: ['fp16'] } }), 'webgpu', NONE), 'fp32');
  const fp16Failed = manifest({ verification: { runs: [run('webgpu', 'webgpu', 'fp16', 'failed')] } });
  assert.equal(pickVariant(fp16Failed, 'webgpu', F16, undefined, 'webgpu'), 'fp32');
  assert.equal(pickVariant(fp16Failed, 'webgpu', F16), 'fp16'); // no bundle: nothing refused
  const fp32Failed = manifest({ verification: { runs: [run('webgpu', 'webgpu', 'fp32', 'failed')] } });
  // fp32 refused and fp16 needs shader-f16: the next EP, not an unchecked variant
  assert.equal(pickVariant(fp32Failed, 'webgpu', NONE, undefined, 'webgpu'), null);
  assert.throws(() => pickVariant(m, 'wasm', NONE, 'int8'), /variant "int8" is not in manifest.json/);
});

test('a forced variant the build refused is reported, never chosen (unless allowRefused)', () => {
  const failed = run('webgpu', 'webgpu', 'fp32', 'failed', { detail: 'rel_l2 0.4 > 0.001' });
  const m = manifest({ verification: { runs: [failed] } });
  assert.deepEqual(chooseVariant(m, 'webgpu', { forced: 'fp32', bundle: 'webgpu' }), { variant: null, skipped: [{ variant: 'fp32', run: failed, forced: true }] });
  assert.deepEqual(chooseVariant(m, 'webgpu', { forced: { webgpu: 'fp32' }, bundle: 'webgpu', allowRefused: true }), { variant: 'fp32', skipped: [] });
  assert.deepEqual(chooseVariant(m, 'wasm', { forced: { webgpu: 'fp32' }, bundle: 'webgpu' }).variant, 'fp32');
});

test('planAttempts: one plan; a refused webgpu moves wasm to the wasm bundle unless that costs an EP', () => {
  const m = manifest({ verification: { runs: [run('webgpu', 'webgpu', 'fp32', 'failed')] } });
  const plan = planAttempts(m, { chain: ['webgpu', 'wasm'], features: NONE });
  assert.equal(plan.bundle, 'wasm');
  assert.deepEqual(plan.attempts, [{ ep: 'wasm', variant: 'fp32' }]);
  assert.deepEqual(plan.skipped.map((s) => [s.ep, s.variant, s.bundle, s.reason]), [['webgpu', 'fp32', 'webgpu', 'failed its browser check at build time']]);

  const wasmBundleFailed = manifest({ verification: { runs: [run('webgpu', 'webgpu', 'fp32', 'failed'), run('wasm', 'wasm', 'fp32', 'failed')] } });
  const kept = planAttempts(wasmBundleFailed, { chain: ['webgpu', 'wasm'], features: NONE });
  assert.equal(kept.bundle, 'webgpu');
  assert.deepEqual(kept.attempts, [{ ep: 'wasm', variant: 'fp32' }]);

  const none = planAttempts(manifest({ verification: { runs: [run('*', '*', 'fp32', 'failed', { stage: 'host' })] } }), { chain: ['webgpu', 'wasm'], features: NONE });
  assert.deepEqual(none.attempts, []);
  assert.deepEqual(none.skipped.map((s) => s.ep), ['webgpu', 'wasm']);

  const unfit = planAttempts(manifest({ variants: { fp16: { model: 'm', requires: ['shader-f16'] } }, variantFor: { webgpu: ['fp16'], wasm: ['fp16'] } }), { chain: ['webgpu', 'wasm'], features: NONE });
  assert.deepEqual(unfit.unfit, ['webgpu']);

  const fixed = planAttempts(m, { chain: ['webgpu', 'wasm'], features: NONE, bundle: 'webgpu' });
  assert.equal(fixed.bundle, 'webgpu');
  assert.deepEqual(fixed.attempts, [{ ep: 'wasm', variant: 'fp32' }]);
});

test('planAttempts with priors: fastest measured first, variants of an EP too', () => {
  const priors = new Map([['wasm/fp32', 2], ['webgpu/fp32', 12], ['webgpu/fp16', 30]]);
  const plan = planAttempts(manifest(), { chain: ['webgpu', 'wasm'], features: F16, priors });
  assert.deepEqual(plan.attempts, [{ ep: 'wasm', variant: 'fp32' }, { ep: 'webgpu', variant: 'fp32' }]);
  assert.deepEqual(orderByPriors([{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }], new Map()), [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
});

// variantFor as pipeline/assets/package.py variant_for writes it for a package with fp16w.
const withFp16w = (overrides = {}) =>
  manifest({
    variants: {
      fp16: { precision: 'fp16', model: 'h', requires: ['shader-f16'] },
      fp16w: { precision: 'fp16w', model: 'w', requires: [], widen: 'fp16-initializers' },
      fp32: { precision: 'fp32', model: 'f', requires: [] },
    },
    variantFor: { webgpu: ['fp16', 'fp16w', 'fp32'], wasm: ['fp16w', 'fp32'] },
    ...overrides,
  });

test('fp16w before fp32 on wasm and on WebGPU without shader-f16; fp32 only when fp16w is refused', () => {
  const m = withFp16w();
  const attempts = (manifest, options) => planAttempts(manifest, options).attempts;
  assert.deepEqual(attempts(m, { chain: ['wasm'] }), [{ ep: 'wasm', variant: 'fp16w' }]);
  assert.deepEqual(attempts(m, { chain: ['webgpu', 'wasm'], features: NONE }), [{ ep: 'webgpu', variant: 'fp16w' }, { ep: 'wasm', variant: 'fp16w' }]);
  assert.deepEqual(attempts(m, { chain: ['webgpu', 'wasm'], features: F16 })[0], { ep: 'webgpu', variant: 'fp16' });
  // build-time times of the same fp32 kernels differ by noise: fp32 measured faster does not win
  const priors = new Map([['webgpu/fp32', 10], ['webgpu/fp16w', 11], ['wasm/fp32', 50]]);
  assert.deepEqual(attempts(m, { chain: ['webgpu', 'wasm'], features: NONE, priors }), [{ ep: 'webgpu', variant: 'fp16w' }, { ep: 'wasm', variant: 'fp16w' }]);
  // a faster kernel still wins (fp16 measured faster than fp32's kernels)
  assert.equal(chooseVariant(m, 'webgpu', { features: F16, priors: new Map([['webgpu/fp32', 5], ['webgpu/fp16', 9]]) }).variant, 'fp16w');
  // fp16w failed its checks: fp32, with the refusal reported; a failed variant is never picked
  const refused = withFp16w({ verification: { browser: true, passed: true, runs: [{ stage: 'host', bundle: '*', ep: '*', variant: 'fp16w', status: 'failed', detail: 'rel_l2 0.2 > 0.005' }] } });
  const plan = planAttempts(refused, { chain: ['webgpu', 'wasm'], features: NONE });
  assert.deepEqual(plan.attempts, [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  assert.deepEqual(plan.skipped.map((s) => [s.ep, s.variant]), [['webgpu', 'fp16w'], ['wasm', 'fp16w']]);
});

test('candidatesFor: every unrefused variant the adapter can run, with its recorded status', () => {
  const m = manifest({ variantFor: { webgpu: ['fp16', 'fp32'], wasm: ['fp32', 'fp16'] }, verification: { runs: [run('webgpu', 'wasm', 'fp16', 'failed'), run('webgpu', 'webgpu', 'fp32', 'passed')] } });
  assert.deepEqual(candidatesFor(m, { chain: ['webgpu', 'wasm'], features: F16, bundle: 'webgpu' }), [
    { ep: 'webgpu', variant: 'fp16', status: 'unverified' },
    { ep: 'webgpu', variant: 'fp32', status: 'passed' },
    { ep: 'wasm', variant: 'fp32', status: 'unverified' },
  ]);
  assert.deepEqual(candidatesFor(m, { chain: ['webgpu'], features: NONE, bundle: 'webgpu' }).map((c) => c.variant), ['fp32']);
});

test('adapter classes: vendor and architecture, description when neither has an architecture', () => {
  const nvidia = { vendor: 'NVIDIA', architecture: 'hopper', description: 'H200' };
  assert.ok(sameAdapterClass(nvidia, { vendor: 'nvidia', architecture: 'Hopper', description: 'H100' }));
  assert.ok(!sameAdapterClass(nvidia, { vendor: 'nvidia', architecture: 'ampere' }));
  assert.ok(sameAdapterClass({ vendor: 'google', description: 'SwiftShader' }, { vendor: 'Google', description: 'swiftshader' }));
  assert.ok(!sameAdapterClass({ vendor: 'google', description: 'SwiftShader' }, { vendor: 'google', description: 'other' }));
  assert.ok(sameAdapterClass(null, null));
  assert.ok(!sameAdapterClass(nvidia, null));
  assert.deepEqual(adapterKey({ vendor: ' Intel ' }), { vendor: 'intel', architecture: '', description: '' });
});

test('priorsFor: only this adapter class, this bundle preferred, best time kept', () => {
  const swift = { vendor: 'google', architecture: 'swiftshader', description: '' };
  const m = manifest({
    measurements: [
      { source: 'build', adapter: swift, bundle: 'webgpu', ep: 'webgpu', variant: 'fp32', steadyMs: 40 },
      { source: 'build', adapter: swift, bundle: 'webgpu', ep: 'wasm', variant: 'fp32', steadyMs: 3 },
      { source: 'benchmark', adapter: swift, bundle: 'webgpu', ep: 'wasm', variant: 'fp32', steadyMs: 2.5 },
      { source: 'build', adapter: swift, bundle: 'wasm', ep: 'wasm', variant: 'fp32', steadyMs: 1 },
      { source: 'gpu', adapter: { vendor: 'nvidia', architecture: 'hopper' }, bundle: 'webgpu', ep: 'webgpu', variant: 'fp32', steadyMs: 0.5 },
      { source: 'build', adapter: swift, bundle: 'webgpu', ep: 'webgpu', variant: 'fp16', steadyMs: null },
    ],
  });
  assert.deepEqual([...priorsFor(m, swift, 'webgpu')], [['webgpu/fp32', 40], ['wasm/fp32', 2.5]]);
  assert.deepEqual(priorsFor(m, swift, 'wasm').get('wasm/fp32'), 1);
  assert.deepEqual([...priorsFor(m, { vendor: 'nvidia', architecture: 'hopper' }, 'webgpu')], [['webgpu/fp32', 0.5]]);
  assert.equal(priorsFor(m, { vendor: 'apple' }, 'webgpu').size, 0);
  assert.equal(priorsFor(manifest({ measurements: undefined }), swift, 'webgpu').size, 0);
  // As the build records them: wasm runs without an adapter, paired with the same machine's webgpu runs.
  const build = (ep, ms, adapter, browser = 'Chromium/150') => ({ source: 'build', browser, adapter, bundle: 'webgpu', ep, variant: 'fp32', steadyMs: ms });
  const recorded = manifest({ measurements: [build('webgpu', 40, swift), build('wasm', 2, null), build('webgpu', 1, { vendor: 'nvidia', architecture: 'hopper' }, 'Chromium/151'), build('wasm', 9, null, 'Chromium/151')] });
  assert.deepEqual([...priorsFor(recorded, swift, 'webgpu')], [['webgpu/fp32', 40], ['wasm/fp32', 2]]);
  assert.deepEqual([...priorsFor(recorded, { vendor: 'nvidia', architecture: 'hopper' }, 'webgpu')], [['webgpu/fp32', 1], ['wasm/fp32', 9]]);
  assert.deepEqual([...priorsFor(recorded, null, 'wasm')], [['wasm/fp32', 2]]);
});

test('farSlower: more than 4x the best prior; nothing without two priors', () => {
  const candidates = [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }, { ep: 'webgpu', variant: 'fp16' }];
  const priors = new Map([['webgpu/fp32', 45], ['wasm/fp32', 175], ['webgpu/fp16', 125]]);
  assert.deepEqual(farSlower(candidates, priors), []);
  priors.set('wasm/fp32', 181);
  assert.deepEqual(farSlower(candidates, priors), [{ ep: 'wasm', variant: 'fp32' }]);
  assert.deepEqual(farSlower(candidates, new Map([['wasm/fp32', 1000]])), []);
});

test('wasmBundlePriors: the wasm EP as the build measured it on the wasm-only bundle, for this adapter class', () => {
  const swift = { vendor: 'google', architecture: 'swiftshader', description: '' };
  const run = (bundle, ep, ms, adapter) => ({ source: 'build', browser: 'Chromium/150', adapter, bundle, ep, variant: 'fp32', steadyMs: ms });
  const m = manifest({ measurements: [run('webgpu', 'webgpu', 48.4, swift), run('webgpu', 'wasm', 30, null), run('wasm', 'wasm', 18.8, null)] });
  assert.deepEqual([...wasmBundlePriors(m, swift)], [['wasm/fp32', 18.8]]);
  assert.equal(wasmBundlePriors(m, { vendor: 'nvidia', architecture: 'hopper' }).size, 0);
  // Only the webgpu bundle measured: nothing for the wasm-only bundle.
  assert.equal(wasmBundlePriors(manifest({ measurements: [run('webgpu', 'webgpu', 48.4, swift), run('webgpu', 'wasm', 30, null)] }), swift).size, 0);
});

test('a run failed on one adapter class (verification.adapters) refuses it there only', () => {
  const nvidia = { vendor: 'nvidia', architecture: 'hopper', description: '', fallback: false };
  const fp16Failed = run('webgpu', 'webgpu', 'fp16', 'failed', { detail: 'y: rel_l2 0.3 > 0.03' });
  const m = manifest({
    verification: {
      runs: [run('webgpu', 'webgpu', 'fp16', 'passed'), run('webgpu', 'webgpu', 'fp32', 'passed')],
      adapters: [
        { adapter: nvidia, browsers: ['Chrome 150 on Windows'], runs: [fp16Failed, run('webgpu', 'webgpu', 'fp32', 'passed')] },
        { adapter: { vendor: 'apple', architecture: 'metal-3', description: '', fallback: false }, browsers: ['Safari 26'], runs: [run('webgpu', 'webgpu', 'fp16', 'passed')] },
      ],
    },
  });
  const onNvidia = { vendor: 'NVIDIA', architecture: 'hopper', description: 'H200' };
  const onOtherNvidia = { vendor: 'nvidia', architecture: 'ampere', description: '' };
  const onApple = { vendor: 'apple', architecture: 'metal-3', description: '' };
  assert.deepEqual(refusingRun(m, 'webgpu', 'webgpu', 'fp16', onNvidia), { ...fp16Failed, adapter: nvidia });
  assert.equal(refusingRun(m, 'webgpu', 'webgpu', 'fp16', onOtherNvidia), null);
  assert.equal(refusingRun(m, 'webgpu', 'webgpu', 'fp16', onApple), null);
  assert.equal(refusingRun(m, 'webgpu', 'webgpu', 'fp16'), null); // no adapter: the global runs only
  assert.equal(refusalReason(refusingRun(m, 'webgpu', 'webgpu', 'fp16', onNvidia)),
    'failed its browser check at build time on nvidia hopper adapters: y: rel_l2 0.3 > 0.03');
  assert.equal(verificationStatus(m, 'webgpu', 'webgpu', 'fp16', onNvidia), 'failed');
  assert.equal(verificationStatus(m, 'webgpu', 'webgpu', 'fp16', onApple), 'passed');
  // the plan: fp32 on the failing class, fp16 on the others
  const plan = (adapter) => planAttempts(m, { chain: ['webgpu', 'wasm'], features: F16, adapter }).attempts;
  assert.deepEqual(plan(onNvidia), [{ ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  // fp32 passed there too: the same EP's next verified variant before wasm
  assert.deepEqual(plan(onApple), [{ ep: 'webgpu', variant: 'fp16' }, { ep: 'webgpu', variant: 'fp32' }, { ep: 'wasm', variant: 'fp32' }]);
  assert.deepEqual(candidatesFor(m, { chain: ['webgpu'], features: F16, bundle: 'webgpu', adapter: onNvidia }).map((c) => c.variant), ['fp32']);
  assert.deepEqual(chooseVariant(m, 'webgpu', { features: F16, bundle: 'webgpu', adapter: onNvidia }).skipped.map((s) => s.variant), ['fp16']);
});

test('a provider failure falls to the same EP\'s next verified variant before the next EP', () => {
  const plan = (runs, extra = {}) => planAttempts(manifest({ verification: { runs } }), { chain: ['webgpu', 'wasm'], features: F16, ...extra }).attempts.map((a) => `${a.ep}/${a.variant}`);
  const passed = [run('webgpu', 'webgpu', 'fp16', 'passed'), run('webgpu', 'webgpu', 'fp32', 'passed'), run('webgpu', 'wasm', 'fp32', 'passed')];
  assert.deepEqual(plan(passed), ['webgpu/fp16', 'webgpu/fp32', 'wasm/fp32']);
  // webgpu/fp32 not verified (no run, or not verifiable): never a fallback, wasm next
  assert.deepEqual(plan([]), ['webgpu/fp16', 'wasm/fp32']);
  assert.deepEqual(plan([passed[0], run('webgpu', 'webgpu', 'fp32', 'not-verifiable')]), ['webgpu/fp16', 'wasm/fp32']);
  // refused: never
  assert.deepEqual(plan([passed[0], run('webgpu', 'webgpu', 'fp32', 'failed')]), ['webgpu/fp16', 'wasm/fp32']);
  // an adapter without shader-f16 starts on fp32: nothing further on webgpu
  assert.deepEqual(planAttempts(manifest({ verification: { runs: passed } }), { chain: ['webgpu', 'wasm'], features: new Set() }).attempts.map((a) => `${a.ep}/${a.variant}`), ['webgpu/fp32', 'wasm/fp32']);
  // a forced variant is the app's decision: no other variant of its EP
  assert.deepEqual(plan(passed, { forced: 'fp16' }).filter((a) => a.startsWith('webgpu')), ['webgpu/fp16']);
});
