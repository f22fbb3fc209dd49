import assert from 'node:assert/strict';
import { test } from 'node:test';

import { audioLayout, describeEvent, spectrumLayout, spectrumMagnitudes, wavBytes } from '../../web_template/loader/present.js';

test('a GTCRN frame [1, 257, 1, 2] is complex spectrum bins, not audio; a waveform is audio', () => {
  assert.deepEqual(spectrumLayout([1, 257, 1, 2]), { bins: 257, frames: 1 });
  assert.deepEqual(spectrumLayout([1, 257, 10, 2]), { bins: 257, frames: 10 });
  assert.equal(spectrumLayout([1, 2]), null); // a stereo sample is not a spectrum
  assert.equal(spectrumLayout([1, 16000]), null);
  assert.deepEqual(audioLayout([1, 16000]), { channels: 1, length: 16000 });
  assert.deepEqual(audioLayout([1, 2, 4096]), { channels: 2, length: 4096 });
  assert.equal(audioLayout([1, 257, 1, 2]), null);
});

test('spectrumMagnitudes takes |re + i im| of each bin of the first frame', () => {
  // [1, 3, 2, 2]: 3 bins x 2 frames x (re, im)
  const values = [3, 4, 9, 9, 0, 1, 9, 9, 6, 8, 9, 9];
  assert.deepEqual(Array.from(spectrumMagnitudes(values, [1, 3, 2, 2])), [5, 1, 10]);
});

test('wavBytes writes a 16-bit PCM RIFF file of the samples times the gain, clipped', () => {
  const bytes = wavBytes(new Float32Array([0, 0.5, -1, 2]), { channels: 1, length: 4 }, 16000, 1);
  const view = new DataView(bytes.buffer);
  assert.equal(new TextDecoder().decode(bytes.slice(0, 4)), 'RIFF');
  assert.equal(new TextDecoder().decode(bytes.slice(8, 12)), 'WAVE');
  assert.equal(view.getUint32(24, true), 16000);
  assert.equal(view.getUint32(40, true), 8);
  assert.deepEqual([0, 1, 2, 3].map((i) => view.getInt16(44 + 2 * i, true)), [0, 16384, -32767, 32767]);
  const stereo = new DataView(wavBytes([0.1, 0.2, -0.1, -0.2], { channels: 2, length: 2 }, 8000, 2).buffer);
  // interleaved: left0, right0, left1, right1 (the values are planar: left then right)
  assert.deepEqual([0, 1, 2, 3].map((i) => stereo.getInt16(44 + 2 * i, true)), [6553, -6553, 13107, -13107]);
});

test('describeEvent turns each loader event into one readable line with a level', () => {
  assert.deepEqual(describeEvent({ type: 'platform', platform: 'desktop', chain: ['webgpu', 'wasm'], threads: 4, crossOriginIsolated: true }),
    { level: 'info', text: 'platform desktop: chain webgpu → wasm, 4 threads' });
  assert.deepEqual(describeEvent({ type: 'adapter', available: true, features: ['shader-f16'], info: { vendor: 'nvidia', architecture: 'hopper' } }),
    { level: 'info', text: 'WebGPU adapter nvidia hopper (shader-f16)' });
  assert.equal(describeEvent({ type: 'download', file: 'model.fp32.0123.onnx', bytes: 2_500_000 }).text, 'downloaded model.fp32.0123.onnx (2.5 MB)');
  assert.equal(describeEvent({ type: 'download', file: 'm.onnx', bytes: 2_500_000, wireBytes: 500_000, decodedBy: 'brotli-dec-wasm' }).text,
    'downloaded m.onnx (2.5 MB, 500.0 KB of brotli decoded here)');
  assert.equal(describeEvent({ type: 'host', decodesBrotli: false, decoder: 'brotli-dec-wasm' }).text, 'this host serves .br files as they are: decoding them here (brotli-dec-wasm)');
  assert.equal(describeEvent({ type: 'host', decodesBrotli: true, decoder: null }).text, 'this host sends brotli bodies with Content-Encoding: br');
  assert.equal(describeEvent({ type: 'session', ep: 'webgpu', variant: 'fp16', ms: 943.2 }).text, 'session webgpu/fp16 created in 943 ms');
  assert.deepEqual(describeEvent({ type: 'fallback', from: { ep: 'webgpu', variant: 'fp16' }, to: { ep: 'wasm', variant: 'fp32' }, error: 'lost device' }),
    { level: 'error', text: 'fell back from webgpu/fp16 to wasm/fp32: lost device' });
  assert.equal(describeEvent({ type: 'error', ep: 'webgpu', variant: 'fp16', phase: 'run', error: 'x' }).text, 'webgpu/fp16 failed during run: x');
  assert.equal(describeEvent({ type: 'select', phase: 'done', choice: { ep: 'wasm', variant: 'fp32' }, fromCache: true }).text,
    'chose wasm/fp32 (decision cached earlier on this device)');
  assert.deepEqual(describeEvent({ type: 'warning', message: 'no cache' }), { level: 'warning', text: 'no cache' });
  assert.equal(describeEvent({ type: 'cache', held: { files: 3, bytes: 2_500_000 }, evicted: { files: 1, bytes: 1_000_000 } }).text,
    'Cache Storage holds 3 files of this package (2.5 MB); removed 1 files of an earlier version (1.0 MB)');
  assert.equal(describeEvent({ type: 'cache', held: { files: 3, bytes: 2_500_000 }, evicted: { files: 0, bytes: 0 } }).text, 'Cache Storage holds 3 files of this package (2.5 MB)');
  assert.equal(describeEvent({ type: 'retry', file: 'm.onnx', attempt: 2, delayMs: 500, error: 'reset' }).level, 'warning');
  assert.equal(describeEvent({ type: 'widen', variant: 'fp16w', where: 'worker', ms: 12, tensors: 40 }).text, "widened fp16w's fp16 weights (40 tensors) in a worker in 12 ms");
  assert.equal(describeEvent({ type: 'prewarm', ep: 'wasm', variant: 'fp32', error: 'bad sr', verdict: 'the sample ran: the provider is kept' }).level, 'warning');
  assert.equal(describeEvent({ type: 'novel', a: 1 }).text, 'novel: {"a":1}');
});
