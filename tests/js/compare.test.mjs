import assert from 'node:assert/strict';
import { test } from 'node:test';

import { compareOutputs, compareTensor, formatMetrics, judge, thresholdsFor } from '../../web_template/loader/compare.js';
import { manifest } from './helpers.mjs';

const f32 = (values, dims = [values.length]) => ({ type: 'float32', data: Float32Array.from(values), dims });

test('identical outputs: zero errors, "identical", no infinite dB figure', () => {
  const ref = f32([0, 0.5, 1, -1]);
  assert.deepEqual(compareTensor(ref, ref, 'image'), { shape_ok: true, nan: 0, inf: 0, max_abs: 0, identical: true, max_abs_of_range: 0, rel_l2: 0, p999_abs_of_range: 0, block_mae_of_range: 0 });
  const audio = compareTensor(ref, ref, 'audio');
  assert.ok(!('snr_db' in audio) && !('seg_snr_db' in audio));
  assert.equal(formatMetrics(audio, { snr_db: 50, max_abs_of_range: 1e-3 }), 'identical to the reference');
  assert.deepEqual(judge(audio, { snr_db: 50 }), { passed: true, reason: null });
});

test('a degenerate reference is not verifiable, never passed; a broken output still fails', () => {
  const m = manifest({ thresholds: { wasm: { fp32: { y: { max_abs_of_range: 1e-3 } } } } });
  const bounds = thresholdsFor(m, 'wasm', 'fp32');
  for (const [values, why] of [[[0, 0, 0, 0], /all 4 of its values are 0/], [[2, 2, 2, 2], /are 2 \(constant\)/], [[1, 1 + 2 ** -22, 1, 1], /as good as constant/]]) {
    const result = compareOutputs(m, { y: f32(values, [1, 4]) }, { y: f32([0.1, 0.2, 0.3, 0.4], [1, 4]) }, bounds);
    assert.equal(result.outputs.y.passed, null);
    assert.equal(result.outputs.y.verifiable, false);
    assert.match(result.text, why);
    assert.match(result.text, /^y: not verifiable \(degenerate fp32 reference: /);
  }
  const broken = compareOutputs(m, { y: f32([0, 0, 0, 0], [1, 4]) }, { y: f32([0, NaN, 0, 0], [1, 4]) }, bounds);
  assert.equal(broken.passed, false);
});

test('figures as pipeline/verify/judgement/metrics.py computes them', () => {
  const ref = f32([0, 1, 2, 3]);
  const act = f32([0, 1, 2, 3.3]);
  const m = compareTensor(ref, act, 'audio');
  assert.ok(Math.abs(m.max_abs - 0.3) < 1e-6);
  assert.ok(Math.abs(m.max_abs_of_range - 0.1) < 1e-6);
  assert.ok(Math.abs(m.rel_l2 - 0.3 / Math.sqrt(14)) < 1e-6);
  assert.equal(m.snr_db, Math.round(20 * Math.log10(Math.sqrt(14) / m.max_abs) * 1000) / 1000);
  const image = compareTensor(ref, act, 'image');
  assert.equal(image.psnr_db, Math.round(10 * Math.log10(9 / (image.max_abs ** 2 / 4)) * 1000) / 1000);
});

test('NaN/Inf the reference lacks, wrong shapes and integer mismatches fail whatever the bounds', () => {
  const nan = compareTensor(f32([1, 2]), f32([NaN, Infinity]));
  assert.equal(nan.nan, 1);
  assert.equal(nan.inf, 1);
  assert.match(judge(nan, { rel_l2: 1 }).reason, /1 NaN and 1 Inf/);
  const shape = compareTensor(f32([1, 2], [2]), f32([1, 2], [1, 2]));
  assert.deepEqual(shape, { shape_ok: false, shape: [1, 2], expected_shape: [2] });
  assert.equal(judge(shape, {}).passed, false);
  const ints = compareTensor({ type: 'int64', data: BigInt64Array.from([1n, 2n]), dims: [2] }, { type: 'int64', data: BigInt64Array.from([1n, 5n]), dims: [2] });
  assert.deepEqual(ints, { shape_ok: true, mismatches: 1, max_abs: 3, identical: false });
  assert.deepEqual(judge(ints, {}), { passed: false, reason: '1 elements differ' });
});

test('float16 outputs stored as Uint16Array are decoded', () => {
  // 0x3c00 = 1.0, 0x4000 = 2.0
  const half = { type: 'float16', data: Uint16Array.from([0x3c00, 0x4000]), dims: [2] };
  assert.equal(compareTensor(f32([1, 2]), half).max_abs, 0);
});

test('judge: upper bounds, dB lower bounds; formatMetrics shows each figure by its bound', () => {
  const m = { shape_ok: true, nan: 0, inf: 0, rel_l2: 2e-7, psnr_db: 80 };
  assert.deepEqual(judge(m, { rel_l2: 1e-3, psnr_db: 60 }), { passed: true, reason: null });
  assert.deepEqual(judge(m, { psnr_db: 90 }), { passed: false, reason: 'psnr_db 80 < 90' });
  assert.deepEqual(judge({ ...m, rel_l2: 0.02 }, { rel_l2: 1e-2 }), { passed: false, reason: 'rel_l2 0.02 > 0.01' });
  assert.equal(formatMetrics(m, { rel_l2: 1e-3, psnr_db: 60, snr_db: 5 }), 'rel_l2 2e-7 ≤ 0.001, psnr_db 80 ≥ 60');
  // an exactly compared integer tensor still says what was compared
  assert.equal(formatMetrics({ shape_ok: true, mismatches: 0, max_abs: 0 }, { max_abs_of_range: 0.1, rel_l2: 0.1 }), '0 elements differ (max_abs 0)');
});

test('compareOutputs judges every output by manifest.thresholds[ep][variant]', () => {
  const m = manifest({ thresholds: { wasm: { fp32: { y: { rel_l2: 1e-3, max_abs_of_range: 1e-3 } } } } });
  assert.deepEqual(thresholdsFor(m, 'wasm', 'fp32'), { y: { rel_l2: 1e-3, max_abs_of_range: 1e-3 } });
  assert.equal(thresholdsFor(m, 'webgpu', 'fp32'), null);
  assert.equal(thresholdsFor(manifest(), 'wasm', 'fp32'), null);
  const reference = { y: f32([1, 2, 3, 4], [1, 4]) };
  const same = compareOutputs(m, reference, { y: f32([1, 2, 3, 4], [1, 4]) }, thresholdsFor(m, 'wasm', 'fp32'));
  assert.equal(same.passed, true);
  assert.equal(same.text, 'y: identical to the reference');
  const off = compareOutputs(m, reference, { y: f32([1, 2, 3, 5], [1, 4]) }, thresholdsFor(m, 'wasm', 'fp32'));
  assert.equal(off.passed, false);
  assert.match(off.text, /^y: rel_l2 0\.183 > 0\.001$/);
  const missing = compareOutputs(m, reference, {}, thresholdsFor(m, 'wasm', 'fp32'));
  assert.equal(missing.passed, false);
  // Without bounds: figures, no verdict (unless something is plainly broken).
  const unjudged = compareOutputs(m, reference, { y: f32([1, 2, 3, 5], [1, 4]) }, null);
  assert.equal(unjudged.passed, null);
  assert.match(unjudged.text, /rel_l2 0\.183/);
  assert.equal(compareOutputs(m, reference, { y: f32([1, 2, 3, NaN], [1, 4]) }, null).passed, false);
});
