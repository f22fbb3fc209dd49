"""Run raw ONNX models in headless Chromium on a chosen onnxruntime-web bundle and EP.

`pack inspect` (which nodes fall back to the CPU) and `pack diagnose` (where a model parts from the
host) need sessions on arbitrary models and feeds, outside any package. They go through the one
browser runner (pages.py): models are written to a scratch folder served at /__pack__/models/,
the installed runtime's dist/ at /__pack__/runtime/ort/, and page/runner.js runs them ('model'
runs). One page per (bundle, EP) is kept while its runs succeed.
"""

from __future__ import annotations

import hashlib
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.cache import temporary_folder
from pipeline.runtime import Runtime
from pipeline.verify.engines.browser import logs
from pipeline.verify.engines.browser.chromium import ConsoleLine
from pipeline.verify.engines.browser.pages import MODEL_PREFIX, BrowserRunner, RunnerPage, decode_tensor, encode_tensor

RUNTIME_KEY = "ort"
RUN_WATCHDOG_MS = 60_000
_FATAL = re.compile(r"Aborted|RuntimeError|out of bounds|unreachable|watchdog|device (?:was )?lost|Out of memory", re.I)


@dataclass
class ModelRun:
    """What one raw-model run in the browser gave: outputs, or where and why it failed."""

    bundle: str
    ep: str
    ok: bool
    stage: str  # 'done', 'created', or where it failed: 'import', 'session-create', 'run', 'page', 'watchdog'
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


class BrowserModelRunner:
    """A browser, a server and pages per (bundle, EP); `run()` one model. Use as a context manager."""

    def __init__(self, runtime: Runtime, gpu: bool = False, browser=None):
        self.runtime = runtime
        self.gpu = gpu
        self._browser = browser
        self._stack = ExitStack()
        self._pages: dict[tuple[str, str], RunnerPage] = {}
        self.adapter: dict | None = None

    def __enter__(self) -> "BrowserModelRunner":
        try:
            self._models = Path(self._stack.enter_context(temporary_folder("pack-models-")))
            self._runner = self._stack.enter_context(BrowserRunner(
                self._models, runtimes={RUNTIME_KEY: self.runtime}, gpu=self.gpu, browser=self._browser, models=self._models))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for page in self._pages.values():
            page.close()
        self._pages.clear()
        self._stack.close()

    def _page(self, bundle: str, ep: str) -> RunnerPage:
        key = (bundle, ep)
        if key not in self._pages:
            page = self._runner.open_page()
            if ep == "webgpu":
                self.adapter = page.probe_adapter()
            self._pages[key] = page
        return self._pages[key]

    def _drop_page(self, bundle: str, ep: str) -> None:
        self._pages.pop((bundle, ep)).close()

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
    ) -> ModelRun:
        """Create a session for `model` on `bundle`/`ep` and (with `execute`) run it on `feeds`."""
        data = model.SerializeToString()
        name = hashlib.sha256(data).hexdigest()[:16] + ".onnx"
        (self._models / name).write_bytes(data)
        page = self._page(bundle, ep)
        mark = page.watch.mark()
        options = {
            **self._runner.runtime_urls(RUNTIME_KEY, bundle),
            "model": self._runner.url(MODEL_PREFIX + name),
            "ep": ep,
            "epOptions": ep_options or {},
            "sessionOptions": {"logSeverityLevel": 0, "logVerbosityLevel": 0} if verbose_log else {"logSeverityLevel": 2},
            "feeds": {key: encode_tensor(value) for key, value in feeds.items()},
            "run": execute,
            "watchdogMs": RUN_WATCHDOG_MS,
        }
        outcome = page.run("model", options, 3 * RUN_WATCHDOG_MS + 10_000)
        console = page.watch.since(mark)
        errors = [] if outcome.get("hung") or outcome.get("crashed") else page.gpu_errors()
        result = ModelRun(bundle, ep, bool(outcome.get("ok")), outcome.get("stage", "?"), outcome.get("error"), console=console)
        for output_name, encoded in (outcome.get("outputs") or {}).items():
            if "bytes" in encoded:
                result.outputs[output_name] = decode_tensor(encoded)
            else:
                result.output_errors[output_name] = f"output {output_name}: {encoded.get('error')}"
        result.signals = logs.failure_signals(console, errors)
        (self._models / name).unlink(missing_ok=True)
        if errors or (not result.ok and (result.stage in ("page", "import", "watchdog") or _FATAL.search(result.error or ""))):
            # A wasm abort, a crashed page or a GPU error can leave the heap or the device unusable;
            # a refused session or a kernel that threw leaves nothing behind, so the page stays.
            self._drop_page(bundle, ep)
        return result

    def placement(self, model: onnx.ModelProto, bundle: str = "webgpu", ep: str = "webgpu") -> tuple[ModelRun, logs.Placement]:
        """Session creation with verbose logs, and which nodes onnxruntime put on the CPU."""
        run = self.run(model, {}, bundle, ep, execute=False, verbose_log=True)
        return run, logs.parse_placement(run.console)


def measure_cpu_fallback(model: onnx.ModelProto, runner: BrowserModelRunner, measured_on: str = "model as is") -> dict[str, Any]:
    """Create a webgpu-bundle WebGPU session (verbose logs) on `model`; read which nodes onnxruntime
    placed on the CPU. `measured_on` says what `model` is ("repaired model", "model as is")."""
    run, placement = runner.placement(model, "webgpu", "webgpu")
    measured: dict[str, Any] = {
        "bundle": "webgpu", "ep": "webgpu", "runtime": runner.runtime.version,
        "adapter": (runner.adapter or {}).get("description") or (runner.adapter or {}).get("vendor") or None,
        "measured_on": measured_on,
    }
    if not run.ok:
        measured.update(error=run.why())
        return measured
    measured.update(
        nodes_per_ep=placement.eps,
        cpu_nodes=placement.cpu_nodes,
        ops_without_webgpu_kernel=sorted({entry["op"] for entry in placement.unsupported}),
        all_on_cpu=placement.all_on_cpu,
    )
    return measured
