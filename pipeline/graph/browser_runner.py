"""Run raw ONNX models in headless Chromium on a chosen onnxruntime-web bundle and EP.

`pack inspect` (which nodes fall back to the CPU) and `pack diagnose` (where a model parts from the
host) need sessions on arbitrary models and feeds, outside any package. This reuses the browser
helpers: the static server (models and the installed runtime's dist/ are mounted beside the harness
page, so the page is same-origin and cross-origin isolated) and the Chromium launcher with its
console and WebGPU-error capture. One page per (bundle, EP) is kept while its runs succeed.
"""

from __future__ import annotations

import base64
import hashlib
import re
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from pipeline.runtime import Runtime
from pipeline.verify.browser import logs
from pipeline.verify.browser.chromium import ConsoleLine, gpu_errors, launch_browser, new_watched_page, probe_adapter
from pipeline.verify.browser.harness import HARNESS_DIR, HARNESS_PREFIX, decode_tensor
from pipeline.verify.browser.server import running_server

RUNTIME_PREFIX = "/__ort__/"
MODEL_PREFIX = "/__models__/"
RUN_WATCHDOG_MS = 60_000
_FATAL = re.compile(r"Aborted|RuntimeError|out of bounds|unreachable|watchdog|device (?:was )?lost|Out of memory", re.I)

# Runs inside the harness page: import the bundle, create a session, run, hand outputs back as base64.
_RUN_IN_PAGE = r"""
async (options) => {
  const watchdog = (promise, what) => {
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`watchdog: ${what} did not finish within ${options.watchdogMs} ms`)), options.watchdogMs);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
  };
  const TYPED = {float32: Float32Array, float64: Float64Array, int32: Int32Array, int64: BigInt64Array,
                 uint8: Uint8Array, int8: Int8Array, bool: Uint8Array, float16: globalThis.Float16Array ?? Uint16Array};
  const decode = (text) => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
  const encode = (view) => {
    const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    let binary = '';
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  };
  let stage = 'import';
  let session = null;
  try {
    const ort = await import(options.module);
    ort.env.wasm.wasmPaths = {wasm: options.wasm};
    ort.env.wasm.numThreads = 1;
    stage = 'session-create';
    session = await watchdog(ort.InferenceSession.create(options.model, {
      ...options.sessionOptions,
      executionProviders: [{name: options.ep, ...options.epOptions}],
    }), 'session creation');
    if (!options.run) { await session.release(); return {ok: true, stage: 'created', outputs: {}}; }
    stage = 'run';
    const feeds = {};
    for (const [name, feed] of Object.entries(options.feeds)) {
      const bytes = decode(feed.bytes);
      feeds[name] = new ort.Tensor(feed.type, new TYPED[feed.type](bytes.buffer), feed.dims);
    }
    const results = await watchdog(session.run(feeds), 'the run');
    const outputs = {};
    for (const [name, tensor] of Object.entries(results)) {
      outputs[name] = ArrayBuffer.isView(tensor.data)
        ? {type: tensor.type, dims: Array.from(tensor.dims), bytes: encode(tensor.data)}
        : {type: tensor.type, dims: Array.from(tensor.dims), error: `data is ${typeof tensor.data}`};
    }
    await session.release();
    return {ok: true, stage: 'done', outputs};
  } catch (error) {
    try { await session?.release(); } catch { /* unusable after the failure */ }
    return {ok: false, stage, error: String(error?.message ?? error)};
  }
}
"""

_DTYPE_NAMES = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.int32): "int32",
                np.dtype(np.int64): "int64", np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8",
                np.dtype(np.bool_): "bool", np.dtype(np.float16): "float16"}


@dataclass
class BrowserRun:
    bundle: str
    ep: str
    ok: bool
    stage: str  # 'done', 'created', or where it failed: 'import', 'session-create', 'run'
    error: str | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    output_errors: dict[str, str] = field(default_factory=dict)
    console: list[ConsoleLine] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)  # onnxruntime error lines, WebGPU errors, size warnings

    @property
    def failed(self) -> bool:
        return not self.ok or bool(self.output_errors)

    def why(self) -> str:
        if not self.ok:
            return f"{self.stage} failed: {self.error}"
        return "; ".join([*self.output_errors.values(), *self.signals])


def encode_feed(array: np.ndarray) -> dict:
    dtype = _DTYPE_NAMES.get(array.dtype)
    if dtype is None:
        raise ValueError(f"input dtype {array.dtype} is not supported in the browser runner")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return {"type": dtype, "dims": list(array.shape), "bytes": base64.b64encode(data.tobytes()).decode()}


class BrowserModelRunner:
    """A browser, a server and pages per (bundle, EP); `run()` one model. Use as a context manager."""

    def __init__(self, runtime: Runtime, gpu: bool = False):
        self.runtime = runtime
        self.gpu = gpu
        self._stack = ExitStack()
        self._pages: dict[tuple[str, str], tuple[object, object]] = {}
        self.adapter: dict | None = None

    def __enter__(self) -> "BrowserModelRunner":
        self._models = Path(self._stack.enter_context(tempfile.TemporaryDirectory(prefix="pack-graph-")))
        dist = self.runtime.bundles["webgpu"].module.parent
        mounts = {HARNESS_PREFIX: HARNESS_DIR, RUNTIME_PREFIX: dist, MODEL_PREFIX: self._models}
        self._server = self._stack.enter_context(running_server(self._models, mounts))
        self._browser = self._stack.enter_context(launch_browser(gpu=self.gpu))
        return self

    def __exit__(self, *exc) -> None:
        for page, _ in self._pages.values():
            try:
                page.context.close()
            except Exception:  # noqa: BLE001 - a crashed page; the browser closes it anyway
                pass
        self._stack.close()

    def _page(self, bundle: str, ep: str):
        key = (bundle, ep)
        if key not in self._pages:
            page, watch = new_watched_page(self._browser)
            page.goto(self._server.url + HARNESS_PREFIX[1:] + "harness.html")
            if ep == "webgpu":
                self.adapter = probe_adapter(page)
            self._pages[key] = (page, watch)
        return self._pages[key]

    def _drop_page(self, bundle: str, ep: str) -> None:
        page, _ = self._pages.pop((bundle, ep))
        try:
            page.context.close()
        except Exception:  # noqa: BLE001
            pass

    def run(
        self,
        model: onnx.ModelProto,
        feeds: dict[str, np.ndarray],
        bundle: str,
        ep: str,
        *,
        execute: bool = True,
        ep_options: dict | None = None,
        verbose_log: bool = False,
    ) -> BrowserRun:
        """Create a session for `model` on `bundle`/`ep` and (with `execute`) run it on `feeds`."""
        data = model.SerializeToString()
        name = hashlib.sha256(data).hexdigest()[:16] + ".onnx"
        (self._models / name).write_bytes(data)
        page, watch = self._page(bundle, ep)
        mark = watch.mark()
        base = self._server.url + RUNTIME_PREFIX[1:]
        options = {
            "module": base + self.runtime.bundles[bundle].module.name,
            "wasm": base + self.runtime.bundles[bundle].wasm.name,
            "model": self._server.url + MODEL_PREFIX[1:] + name,
            "ep": ep,
            "epOptions": ep_options or {},
            "sessionOptions": {"logSeverityLevel": 0, "logVerbosityLevel": 0} if verbose_log else {"logSeverityLevel": 2},
            "feeds": {key: encode_feed(value) for key, value in feeds.items()},
            "run": execute,
            "watchdogMs": RUN_WATCHDOG_MS,
        }
        try:
            outcome = page.evaluate(_RUN_IN_PAGE, options)
        except Exception as error:  # noqa: BLE001 - a crashed renderer or closed page
            outcome = {"ok": False, "stage": "page", "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        console = watch.since(mark)
        try:
            errors = gpu_errors(page)
        except Exception:  # noqa: BLE001
            errors = []
        result = BrowserRun(bundle, ep, bool(outcome.get("ok")), outcome.get("stage", "?"), outcome.get("error"), console=console)
        for output_name, encoded in (outcome.get("outputs") or {}).items():
            if "bytes" in encoded:
                result.outputs[output_name] = decode_tensor(encoded)
            else:
                result.output_errors[output_name] = f"output {output_name}: {encoded.get('error')}"
        result.signals = logs.failure_signals(console, errors)
        (self._models / name).unlink(missing_ok=True)
        if errors or (not result.ok and (result.stage in ("page", "import") or _FATAL.search(result.error or ""))):
            # A wasm abort, a crashed page or a GPU error can leave the heap or the device unusable;
            # a refused session or a kernel that threw leaves nothing behind, so the page stays.
            self._drop_page(bundle, ep)
        return result

    def placement(self, model: onnx.ModelProto, bundle: str = "webgpu", ep: str = "webgpu") -> tuple[BrowserRun, logs.Placement]:
        """Session creation with verbose logs, and which nodes onnxruntime put on the CPU."""
        run = self.run(model, {}, bundle, ep, execute=False, verbose_log=True)
        return run, logs.parse_placement(run.console)
