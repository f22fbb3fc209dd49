// The WebGPU adapter probe (runtime.js): a null answered once more, no further (each request that
// finds none prints "No available adapters." in Chromium), and a page without an adapter not asked again.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';

import { forgetAdapter, probeWebGpu } from '../../web_template/loader/runtime.js';

const realNavigator = Object.getOwnPropertyDescriptor(globalThis, 'navigator');
afterEach(() => {
  if (realNavigator) Object.defineProperty(globalThis, 'navigator', realNavigator);
  else delete globalThis.navigator;
  forgetAdapter();
});

/** navigator.gpu whose requestAdapter() answers `answers` in turn; returns the call count. */
function gpuAnswering(...answers) {
  const calls = { count: 0 };
  const gpu = {
    requestAdapter: async () => {
      const answer = answers[Math.min(calls.count++, answers.length - 1)];
      if (answer instanceof Error) throw answer;
      return answer;
    },
  };
  Object.defineProperty(globalThis, 'navigator', { value: { gpu }, configurable: true, writable: true });
  return calls;
}

test('a page without an adapter asks twice, then never again: later loads reuse the answer', async () => {
  const calls = gpuAnswering(null);
  const first = await probeWebGpu(null);
  assert.deepEqual(first, { adapter: null, attempts: 2, reason: 'WebGPU is unavailable: requestAdapter() returned null 2 times' });
  const again = await probeWebGpu(null);
  assert.deepEqual([again.adapter, again.attempts, again.reason], [null, 0, first.reason]);
  assert.equal(calls.count, 2);
});

test('a first null followed by an adapter (a fresh browser on some GPUs) finds it', async () => {
  const adapter = { features: new Set() };
  const calls = gpuAnswering(null, adapter);
  assert.deepEqual(await probeWebGpu(null), { adapter, attempts: 2, reason: null });
  assert.equal(calls.count, 2);
});

test('a request that throws is said so, and not asked again', async () => {
  const calls = gpuAnswering(new TypeError('blocked'));
  assert.equal((await probeWebGpu(null)).reason, 'WebGPU is unavailable: requestAdapter() threw blocked 2 times');
  await probeWebGpu(null);
  assert.equal(calls.count, 2);
});

test('an adapter is asked for again per load (onnxruntime takes its device)', async () => {
  const adapter = { features: new Set() };
  const calls = gpuAnswering(adapter);
  assert.equal((await probeWebGpu(null)).adapter, adapter);
  assert.equal((await probeWebGpu(null)).adapter, adapter);
  assert.equal(calls.count, 2);
});

test('no navigator.gpu: nothing is asked', async () => {
  Object.defineProperty(globalThis, 'navigator', { value: {}, configurable: true, writable: true });
  assert.deepEqual(await probeWebGpu(null), { adapter: null, attempts: 0, reason: 'WebGPU is unavailable: navigator.gpu is undefined in this browser' });
});
