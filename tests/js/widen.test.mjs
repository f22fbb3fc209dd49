import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { PackLoadError } from '../../web_template/loader/errors.js';
import { trustedWithoutCheck } from '../../web_template/loader/select.js';
import { WIDEN, halfToFloatBits, variantBytes, widenFp16Initializers } from '../../web_template/loader/widen.js';
import { manifest } from './helpers.mjs';

// A real model: the LaMa-architecture test export with its float32 initializers stored as fp16 by
// pipeline/precision/fp16w.py; tests/test_fp16w.py keeps this file and the widened hash in step.
const DATA = new URL('../data/fp16w/', import.meta.url);
const narrowed = new Uint8Array(readFileSync(new URL('lama.fp16w.onnx', DATA)));
const widenedSha = readFileSync(new URL('lama.fp16w.widened.sha256', DATA), 'utf8').trim();
const original = readFileSync(new URL('../data/flagship/lama.onnx', import.meta.url));
const digest = (bytes) => createHash('sha256').update(bytes).digest('hex');
const bitsOf = (x) => new Uint32Array(new Float32Array([x]).buffer)[0];

test('fp16 bits widen exactly: normals, subnormals, zeros, infinities, NaN payloads', () => {
  const t = halfToFloatBits();
  assert.equal(t[0x3c00], bitsOf(1));
  assert.equal(t[0xc000], bitsOf(-2));
  assert.equal(t[0x7bff], bitsOf(65504));
  assert.equal(t[0x0001], bitsOf(2 ** -24)); // smallest subnormal
  assert.equal(t[0x03ff], bitsOf(1023 * 2 ** -24)); // largest subnormal
  assert.equal(t[0x0400], bitsOf(2 ** -14)); // smallest normal
  assert.equal(t[0x0000], 0);
  assert.equal(t[0x8000], 0x80000000); // -0
  assert.equal(t[0x7c00], 0x7f800000);
  assert.equal(t[0xfc00], 0xff800000);
  assert.equal(t[0x7e01], 0x7fc02000); // NaN payload kept, as numpy keeps it
  const values = new Float32Array(t.buffer);
  for (const h of [0x3555, 0x2e66, 0xb9a0, 0x1234]) assert.equal(Math.fround(values[h]), values[h]);
});

test('a real fp16w model widens to the bytes the build checks, float32 again and the size of the fp32 model', () => {
  const result = widenFp16Initializers(narrowed);
  assert.equal(digest(result.bytes), widenedSha);
  assert.equal(result.tensors, 27);
  assert.equal(result.bytes.byteLength, original.byteLength);
  assert.ok(narrowed.byteLength < 0.75 * original.byteLength, `${narrowed.byteLength} vs ${original.byteLength}`);
  // Widening what is already float32 changes nothing.
  const again = widenFp16Initializers(result.bytes);
  assert.equal(again.tensors, 0);
  assert.equal(digest(again.bytes), widenedSha);
});

test('truncated or foreign bytes fail with a PackLoadError naming the problem', () => {
  assert.throws(() => widenFp16Initializers(narrowed.subarray(0, narrowed.byteLength - 7)), (e) => e instanceof PackLoadError && /fp16w model: .*rebuild the package/.test(e.message));
  // A FLOAT16 tensor with int32_data instead of raw_data: graph { initializer { data_type: 10, int32_data: 1 } }.
  const tensor = [0x10, 10, 0x28, 1];
  const graph = [0x2a, tensor.length, ...tensor];
  const model = Uint8Array.from([0x3a, graph.length, ...graph]);
  assert.throws(() => widenFp16Initializers(model), /without raw_data/);
  assert.throws(() => widenFp16Initializers(Uint8Array.from([0x3b])), /wire type 3/);
});

test('variantBytes widens a marked variant only, and says where it ran', async () => {
  const m = manifest({
    files: { 'a.onnx': { sha256: 'a'.repeat(64), size: narrowed.byteLength }, 'b.onnx': { sha256: 'b'.repeat(64), size: 3 } },
    variants: { fp16w: { precision: 'fp16w', model: 'a.onnx', requires: [], widen: WIDEN }, fp32: { precision: 'fp32', model: 'b.onnx', requires: [] } },
  });
  const files = { get: async (path) => (path === 'a.onnx' ? narrowed : Uint8Array.from([1, 2, 3])) };
  const events = [];
  const wide = await variantBytes(files, m, 'fp16w', undefined, (e) => events.push(e));
  assert.equal(digest(wide), widenedSha);
  assert.deepEqual(events.map(({ type, variant, where, tensors }) => ({ type, variant, where, tensors })), [{ type: 'widen', variant: 'fp16w', where: 'this thread', tensors: 27 }]);
  assert.deepEqual([...(await variantBytes(files, m, 'fp32'))], [1, 2, 3]);
  m.variants.fp16w.widen = 'fp8-everything';
  await assert.rejects(variantBytes(files, m, 'fp16w'), /widen "fp8-everything" is unknown to this loader/);
});

test('the measured choice times fp16w, not fp32 beside it: same kernels, half the bytes', () => {
  const m = manifest({
    variants: {
      fp16w: { precision: 'fp16w', model: 'model.fp16.bbbbbbbbbbbbbbbb.onnx', requires: [], widen: WIDEN },
      fp32: { precision: 'fp32', model: 'model.fp32.aaaaaaaaaaaaaaaa.onnx', requires: [] },
    },
  });
  const c = (ep, variant) => ({ ep, variant, status: 'passed' });
  const trusted = trustedWithoutCheck(m, null, [c('webgpu', 'fp16w'), c('webgpu', 'fp32'), c('wasm', 'fp32')]);
  assert.deepEqual(trusted.map((x) => `${x.ep}/${x.variant}`), ['webgpu/fp16w', 'wasm/fp32']);
  // fp16w not trusted (refused or unchecked): fp32 stays a candidate.
  assert.deepEqual(trustedWithoutCheck(m, null, [c('webgpu', 'fp32')]).map((x) => x.variant), ['fp32']);
});
