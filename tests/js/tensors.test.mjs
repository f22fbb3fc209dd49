import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PackLoadError } from '../../web_template/loader/errors.js';
import { concreteDims, decodeTensors, dummyFeeds, halfToFloat, numbers, prepareFeeds } from '../../web_template/loader/tensors.js';
import { manifest, Tensor } from './helpers.mjs';

const ort = { Tensor };

test('decodeTensors reads inputs and reference outputs out of one sample file', () => {
  const bytes = new Uint8Array(new Float32Array([1, 2, 3, 4, 10, 20]).buffer);
  const tensors = decodeTensors(bytes, { x: { dtype: 'float32', dims: [1, 4], offset: 0, length: 16 }, y: { dtype: 'float32', dims: [2], offset: 16, length: 8 } });
  assert.deepEqual(Array.from(tensors.x.data), [1, 2, 3, 4]);
  assert.deepEqual(tensors.x.dims, [1, 4]);
  assert.deepEqual(Array.from(tensors.y.data), [10, 20]);
  assert.throws(() => decodeTensors(bytes, { y: { dtype: 'float32', dims: [4], offset: 16, length: 16 } }, 'sample.bin'), /lie beyond sample.bin \(24 bytes\)/);
});

test('prepareFeeds: names, dtypes and fixed dims are the caller\'s errors (TypeError)', () => {
  const m = manifest({ inputs: [{ name: 'x', dtype: 'float32', shape: [1, 'T'] }] });
  const ok = prepareFeeds(ort, m, { x: { data: new Float32Array(7), dims: [1, 7], type: 'float32' } });
  assert.deepEqual(ok.x.dims, [1, 7]);
  assert.throws(() => prepareFeeds(ort, m, {}), (e) => e instanceof TypeError && /missing input "x"/.test(e.message));
  assert.throws(() => prepareFeeds(ort, m, { x: { data: new Float32Array(2), dims: [2, 1], type: 'float32' } }), /has dims \[2,1\]/);
  assert.throws(() => prepareFeeds(ort, m, { x: { data: new Int32Array(2), dims: [1, 2], type: 'int32' } }), /is int32, the model takes float32/);
  assert.throws(() => prepareFeeds(ort, m, { x: ok.x, z: ok.x }), /unknown input "z"/);
  assert.throws(() => prepareFeeds(ort, m, { x: 3 }), /must be \{ data, dims, type \}/);
});

test('dummyFeeds take the sample dims, else the declared shape with symbolic dims as 1', () => {
  const m = manifest({ inputs: [{ name: 'x', dtype: 'float32', shape: [1, 'T'] }, { name: 'k', dtype: 'int64', shape: [2] }], sample: { tensors: { x: { dims: [1, 9] } } } });
  const feeds = dummyFeeds(ort, m);
  assert.deepEqual(feeds.x.dims, [1, 9]);
  assert.equal(feeds.x.data.length, 9);
  assert.ok(feeds.k.data instanceof BigInt64Array);
  assert.deepEqual(concreteDims([1, 'H', -1, 3]), [1, 1, 1, 3]);
});

test('halfToFloat and numbers', () => {
  assert.deepEqual([0x3c00, 0xc000, 0x0001, 0x7c00, 0x7e00].map(halfToFloat), [1, -2, 2 ** -24, Infinity, NaN]);
  assert.deepEqual(Array.from(numbers({ type: 'int64', data: BigInt64Array.from([3n]) })), [3]);
  assert.throws(() => decodeTensors(new Uint8Array(4), { s: { dtype: 'string', dims: [1], offset: 0, length: 4 } }), PackLoadError);
});
