// WebGPU adapter facts of a page (features, fallback flag, vendor, limits), evaluated by
// chromium.probe_adapter. Some adapters return null on the first requestAdapter() in a fresh
// browser (7 of 8 runs on a real NVIDIA GPU): retry before declaring the adapter missing.
async ({attempts, delayMs}) => {
  if (!navigator.gpu) return {available: false, attempts: 0, reason: 'navigator.gpu is undefined'};
  for (let attempt = 1; attempt <= attempts; attempt++) {
    let adapter = null;
    try {
      adapter = await navigator.gpu.requestAdapter();
    } catch (error) {
      // Firefox ESR exposes navigator.gpu with dom.webgpu.enabled yet refuses: "WebGPU is not yet available in Release or late Beta builds"
      return {available: false, attempts: attempt, reason: `requestAdapter() threw: ${String((error && error.message) || error)}`};
    }
    if (adapter) {
      const info = adapter.info || {};
      return {
        available: true, attempts: attempt,
        features: [...adapter.features].sort(),
        isFallbackAdapter: Boolean(adapter.isFallbackAdapter ?? info.isFallbackAdapter),
        vendor: info.vendor || '', architecture: info.architecture || '',
        device: info.device || '', description: info.description || '',
        limits: {maxBufferSize: adapter.limits.maxBufferSize,
                 maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize},
      };
    }
    await new Promise((resolve) => setTimeout(resolve, delayMs));
  }
  return {available: false, attempts, reason: `requestAdapter() returned null ${attempts} times`};
}
