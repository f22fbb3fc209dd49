import assert from 'node:assert/strict';
import { test } from 'node:test';

import { compareOutputs } from '../../web_template/loader/compare.js';
import { decide, greedyCtc } from '../../web_template/loader/decisions.js';
import { manifest } from './helpers.mjs';

const f32 = (values, dims = [values.length]) => ({ type: 'float32', data: Float32Array.from(values), dims });
// [1, 6, 4] per-step probabilities decoding to 1 2 1; step 3 a near-tie (0.4879 blank vs 0.4805 class 3)
const STEPS = [[0.1, 0.8, 0.05, 0.05], [0.9, 0.05, 0.03, 0.02], [0.05, 0.05, 0.85, 0.05], [0.4879, 0.0158, 0.0158, 0.4805], [0.1, 0.7, 0.1, 0.1], [0.97, 0.01, 0.01, 0.01]];
const CTC = { kind: 'ctc', axis: -1, blank: 0, from: 'recipe' };

test('a near-tie flip is caught and told with its margin; the text it changed is shown', () => {
  const reference = f32(STEPS.flat(), [1, 6, 4]);
  const steps = STEPS.map((row) => row.slice());
  [steps[3][0], steps[3][3]] = [0.4841, 0.4843];
  const actual = f32(steps.flat(), [1, 6, 4]);
  const bounds = { max_abs_of_range: 0.01, rel_l2: 0.01, flips: 0, near_ties: 0 };
  const m = manifest({ outputs: [{ name: 'p', shape: [1, 6, 4], dtype: 'float32', kind: 'tensor', decision: CTC }] });
  const result = compareOutputs(m, { p: reference }, { p: actual }, { p: bounds });
  assert.equal(result.passed, false); // the numbers pass, the decision does not
  assert.equal(result.outputs.p.decision.status, 'failed');
  assert.deepEqual(result.outputs.p.decision.shown, { reference: '1 2 1', actual: '1 2 3 1' });
  assert.match(result.text, /p \(ctc decision\): failed \(near_ties 1 > 0; near-ties: step 3: fp32 0 by a margin of 0\.0074/);
  assert.equal(decide(reference, actual, CTC, { ...bounds, near_ties: 1 }).status, 'passed');
  assert.deepEqual(greedyCtc([0, 1, 1, 0, 1, 2, 2], 0), [1, 1, 2]);
});

test('a mask passes despite noise away from its threshold; a sample on one side is not verifiable', () => {
  const values = Array.from({ length: 64 }, (_, i) => (i % 3 === 0 ? 0.9 : 0.1));
  const noisy = values.map((v, i) => v + (i % 2 ? 0.02 : -0.02));
  const decision = { kind: 'mask', threshold: 0.5, from: 'recipe' };
  const passed = decide(f32(values, [1, 8, 8]), f32(noisy, [1, 8, 8]), decision, { p999_abs_of_range: 0.02, mask_agreement: 0.999 });
  assert.equal(passed.status, 'passed');
  assert.equal(passed.figures.mask_agreement, 1);
  const flat = decide(f32(values.map(() => 0.1)), f32(values.map(() => 0.1)), decision, { mask_agreement: 0.999 });
  assert.equal(flat.status, 'not-verifiable');
  assert.match(flat.reason, /fp32 decides nothing on this sample \(all 64 of its values are below the threshold 0.5\)/);
});
