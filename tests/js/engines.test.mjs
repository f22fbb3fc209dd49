import assert from 'node:assert/strict';
import { test } from 'node:test';

import { detectEngine, engineRuns, forEngine, isRefused, planAttempts, refusalReason, verificationStatus } from '../../web_template/loader/policy.js';
import { manifest, run } from './helpers.mjs';

const F16 = new Set(['shader-f16']);
// user agents as the three engines send them (Debian's builds here, and the platforms they stand for)
const UA = {
  firefox: 'Mozilla/5.0 (X11; Linux x86_64; rv:140.0) Gecko/20100101 Firefox/140.0',
  chromium: 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/150.0.0.0 Safari/537.36',
  edge: 'Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/150.0.0.0 Safari/537.36 Edg/150.0.0.0',
  webkitgtk: 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/60.5 Safari/605.1.15',
  safari: 'Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15',
  chromeIos: 'Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0 Mobile/15E148 Safari/604.1',
  firefoxIos: 'Mozilla/5.0 (iPad; CPU OS 17_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) FxiOS/132.0 Mobile/15E148 Safari/605.1.15',
};

test('detectEngine: Firefox, Chromium (Edge too), WebKit (every iOS browser, iPadOS desktop mode); unknown is null', () => {
  assert.equal(detectEngine({ userAgent: UA.firefox }), 'firefox');
  assert.equal(detectEngine({ userAgent: UA.chromium }), 'chromium');
  assert.equal(detectEngine({ userAgent: UA.edge }), 'chromium');
  assert.equal(detectEngine({ userAgent: UA.webkitgtk }), 'webkit');
  assert.equal(detectEngine({ userAgent: UA.safari, platform: 'MacIntel', maxTouchPoints: 0 }), 'webkit');
  assert.equal(detectEngine({ userAgent: UA.chromeIos }), 'webkit');
  assert.equal(detectEngine({ userAgent: UA.firefoxIos }), 'webkit');
  assert.equal(detectEngine({ userAgent: 'curl/8.0' }), null);
  assert.equal(detectEngine(), null);
});

// The build: Chromium passed every pair; Firefox failed webgpu/fp16 (its WGSL refuses the fp16 Pad
// shader) and passed webgpu/fp32 and wasm; WebKit has no WebGPU (not verifiable) and passed wasm.
const PAD = "Pad shader: Invalid access into expression";
const built = manifest({
  verification: {
    browser: true, passed: true,
    runs: [
      run('webgpu', 'webgpu', 'fp16', 'passed'), run('webgpu', 'webgpu', 'fp32', 'passed'), run('webgpu', 'wasm', 'fp32', 'passed'),
      run('webgpu', 'webgpu', 'fp16', 'failed', { engine: 'firefox', detail: PAD }),
      run('webgpu', 'webgpu', 'fp32', 'passed', { engine: 'firefox' }), run('webgpu', 'wasm', 'fp32', 'passed', { engine: 'firefox' }),
      run('webgpu', 'webgpu', 'fp16', 'not-verifiable', { engine: 'webkit', detail: 'no WebGPU adapter' }),
      run('webgpu', 'wasm', 'fp32', 'passed', { engine: 'webkit' }),
    ],
  },
});

/** What load() plans on a device: the engine from its fake navigator, the manifest as that engine reads it. */
function planOn(navigator) {
  const engine = detectEngine(navigator);
  return planAttempts(forEngine(built, engine), { chain: ['webgpu', 'wasm'], features: F16 });
}

test('Firefox failed webgpu/fp16 at build: its chain starts at webgpu/fp32 and info says why fp16 was skipped', () => {
  const plan = planOn({ userAgent: UA.firefox, platform: 'Linux x86_64', maxTouchPoints: 0 });
  assert.deepEqual(plan.attempts.map((a) => `${a.ep}/${a.variant}`), ['webgpu/fp32', 'wasm/fp32']);
  assert.equal(plan.bundle, 'webgpu');
  const [skipped] = plan.skipped;
  assert.deepEqual([skipped.ep, skipped.variant], ['webgpu', 'fp16']);
  assert.equal(skipped.reason, `firefox failed webgpu/fp16 at build: ${PAD}`);
});

test('Chromium and an unknown engine keep what Chromium found: webgpu/fp16 first', () => {
  for (const navigator of [{ userAgent: UA.chromium }, { userAgent: 'an unknown browser' }]) {
    const plan = planOn(navigator);
    assert.deepEqual(plan.attempts.map((a) => `${a.ep}/${a.variant}`), ['webgpu/fp16', 'webgpu/fp32', 'wasm/fp32']);
    assert.deepEqual(plan.skipped, []);
  }
});

test('an engine without a verdict on a pair reads Chromium\'s run for it', () => {
  const webkit = forEngine(built, 'webkit');
  assert.equal(verificationStatus(webkit, 'webgpu', 'webgpu', 'fp16'), 'passed');
  assert.equal(isRefused(webkit, 'webgpu', 'webgpu', 'fp16'), false);
  assert.equal(isRefused(forEngine(built, 'firefox'), 'webgpu', 'webgpu', 'fp16'), true);
  assert.equal(isRefused(built, 'webgpu', 'webgpu', 'fp16'), false);
});

test('engineRuns: another engine passing a pair Chromium failed may use it; host failures refuse everywhere', () => {
  const runs = [
    run('webgpu', 'webgpu', 'fp32', 'failed', { detail: 'chromium: wrong' }), run('webgpu', 'webgpu', 'fp32', 'passed', { engine: 'firefox' }),
    run('*', '*', 'fp16', 'failed', { stage: 'host', detail: 'host: wrong' }),
  ];
  assert.deepEqual(engineRuns(runs, 'firefox').map((r) => `${r.stage}:${r.engine || '-'}:${r.status}`), ['browser:firefox:passed', 'host:-:failed']);
  assert.deepEqual(engineRuns(runs).map((r) => `${r.stage}:${r.engine || '-'}:${r.status}`), ['browser:-:failed', 'host:-:failed']);
  assert.equal(refusalReason(runs[0]), 'failed its browser check at build time: chromium: wrong');
});
