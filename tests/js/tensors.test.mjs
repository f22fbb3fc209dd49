import assert from 'node:assert/strict';
import { test } from 'node:test';

import { PackLoadError } from '../../web_template/loader/errors.js';
import { concreteDims, decodeTensors, floatToHalf, halfToFloat, numbers, prepareFeeds, prewarmFeeds, prewarmSource } from '../../web_template/loader/tensors.js';
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

test('prewarmFeeds take the sample dims, else the declared shape with symbolic dims as 1', () => {
  const m = manifest({ inputs: [{ name: 'x', dtype: 'float32', shape: [1, 'T'] }, { name: 'k', dtype: 'int64', shape: [2] }], sample: { tensors: { x: { dims: [1, 9] } } } });
  const feeds = prewarmFeeds(ort, m);
  assert.deepEqual(feeds.x.dims, [1, 9]);
  assert.equal(feeds.x.data.length, 9);
  assert.ok(feeds.k.data instanceof BigInt64Array);
  assert.deepEqual(concreteDims([1, 'H', -1, 3]), [1, 1, 1, 3]);
});

test('prewarm feeds: small inputs take the sample values the manifest carries, big ones zeros', () => {
  const m = manifest({
    inputs: [
      { name: 'x', dtype: 'float32', shape: [1, 'T'] },
      { name: 'sr', dtype: 'int64', shape: [] },
      { name: 'gain', dtype: 'float32', shape: [2] },
      { name: 'half', dtype: 'float16', shape: [1] },
      { name: 'flag', dtype: 'bool', shape: [1] },
      { name: 'state', dtype: 'float32', shape: [2, 1, 128] },
    ],
    sample: {
      tensors: {
        x: { dims: [1, 16000] }, // signal: no values in the manifest
        sr: { dims: [], values: [16000] },
        gain: { dims: [2], values: [0.5, -2] },
        half: { dims: [1], values: [1.5] },
        flag: { dims: [1], values: [1] },
        state: { dims: [2, 1, 128] },
      },
    },
  });
  const feeds = prewarmFeeds(ort, m);
  assert.deepEqual(feeds.sr.dims, []);
  assert.deepEqual(Array.from(feeds.sr.data), [16000n]);
  assert.deepEqual(Array.from(feeds.gain.data), [0.5, -2]);
  const half = feeds.half.data;
  assert.equal(half instanceof Uint16Array ? halfToFloat(half[0]) : half[0], 1.5);
  assert.deepEqual(Array.from(feeds.flag.data), [1]);
  assert.equal(feeds.x.data.length, 16000);
  assert.ok(feeds.x.data.every((v) => v === 0) && feeds.state.data.every((v) => v === 0));
  // values that do not fit the dims the run uses are not used
  assert.equal(prewarmSource({ dims: [2], values: [1, 2, 3] }, [2]), 'zeros');
  assert.equal(prewarmSource({ dims: [2], values: [1, 2] }, [2]), 'sample');
  assert.equal(prewarmSource(undefined, [2]), 'zeros');
});

test('floatToHalf rounds to the nearest half, subnormals and overflow included', () => {
  for (const v of [0, 1, -2, 1.5, 0.1, 65504, 2 ** -24, 6e-5, -0.333]) {
    const back = halfToFloat(floatToHalf(v));
    assert.ok(Math.abs(back - v) <= Math.max(Math.abs(v) * 2 ** -11, 2 ** -25), `${v} -> ${back}`);
  }
  assert.equal(halfToFloat(floatToHalf(1e6)), Infinity);
});

test('halfToFloat and numbers', () => {
  assert.deepEqual([0x3c00, 0xc000, 0x0001, 0x7c00, 0x7e00].map(halfToFloat), [1, -2, 2 ** -24, Infinity, NaN]);
  assert.deepEqual(Array.from(numbers({ type: 'int64', data: BigInt64Array.from([3n]) })), [3]);
  assert.throws(() => decodeTensors(new Uint8Array(4), { s: { dtype: 'string', dims: [1], offset: 0, length: 4 } }), PackLoadError);
});
