// Init script of every page pack opens (chromium.py adds it before any page script runs).
// 1. WebGPU device errors (validation, out-of-memory, internal, lost) reach only the device's
//    `uncapturederror` event and the console: hooking GPUAdapter.requestDevice makes every device
//    onnxruntime creates report them into window.__packGpuErrors.
// 2. GPU buffer bytes: GPUDevice.createBuffer and GPUBuffer.destroy are wrapped to keep the live
//    total and its peak in window.__packGpuMemory (a buffer dropped without destroy() stays counted).
(() => {
  window.__packGpuErrors = [];
  const memory = {live: 0, peak: 0, buffers: 0};
  window.__packGpuMemory = memory;
  if (!('GPUAdapter' in self)) return;
  const requestDevice = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = async function (...args) {
    const device = await requestDevice.apply(this, args);
    device.addEventListener('uncapturederror', (event) => {
      const error = event.error || {};
      window.__packGpuErrors.push({kind: error.constructor ? error.constructor.name : 'GPUError',
                                   message: String(error.message || error)});
    });
    device.lost.then((info) => {
      if (info.reason !== 'destroyed') {
        window.__packGpuErrors.push({kind: 'DeviceLost', message: `${info.reason}: ${info.message}`});
      }
    });
    return device;
  };
  const sizes = new WeakMap();
  const createBuffer = GPUDevice.prototype.createBuffer;
  GPUDevice.prototype.createBuffer = function (descriptor) {
    const buffer = createBuffer.call(this, descriptor);
    const size = Number(descriptor?.size) || 0;
    sizes.set(buffer, size);
    memory.live += size;
    memory.buffers += 1;
    if (memory.live > memory.peak) memory.peak = memory.live;
    return buffer;
  };
  const destroy = GPUBuffer.prototype.destroy;
  GPUBuffer.prototype.destroy = function () {
    const size = sizes.get(this);
    if (size !== undefined) {
      memory.live -= size;
      sizes.delete(this);
    }
    return destroy.call(this);
  };
})();
