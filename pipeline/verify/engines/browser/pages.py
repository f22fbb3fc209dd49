"""The one browser runner: a static server, headless Chromium and pages that run page/runner.js.

Everything pack serves beside what runs lives under one mount prefix, `/__pack__/`:
- `/__pack__/page/`: runner.html and runner.js (the in-page code, real .js files in page/);
- `/__pack__/loader/`: pack's own loader modules (web_template/loader/), whose tensor code runner.js
  imports (`model` runs serve a scratch folder, which has no loader of its own);
- `/__pack__/runtime/<key>/`: an onnxruntime-web dist/ folder (another runtime than the one a
  package ships, or the bundles `pack inspect`/`pack diagnose` run models on);
- `/__pack__/models/`: scratch models (raw-model runs).
The server's root is the package under test (or the scratch folder), so pages are same-origin with
it and cross-origin isolated (wasm threads).
"""

from __future__ import annotations

import base64
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

import numpy as np

from pipeline.dtypes import NUMPY_DTYPES, name_of_numpy
from pipeline.errors import PackError
from pipeline.runtime import Runtime
from pipeline.verify.engines.browser.chromium import PAGE_DIR, gpu_errors, launch_browser, new_watched_page, probe_adapter, probe_device
from pipeline.verify.engines.browser.driven import DrivenPage, engine_session, open_driven_page
from pipeline.package_server import running_server

MOUNT_PREFIX = "/__pack__/"
PAGE_PREFIX = MOUNT_PREFIX + "page/"
LOADER_PREFIX = MOUNT_PREFIX + "loader/"
RUNTIME_PREFIX = MOUNT_PREFIX + "runtime/"
MODEL_PREFIX = MOUNT_PREFIX + "models/"


class BrowserLost(Exception):
    """The browser went away under a run (a remote endpoint died or its connection dropped): not a
    verdict on the package, so the caller reconnects or reports the endpoint's checks as `error`."""


def connection_lost(browser, error: BaseException) -> bool:
    """Whether `error` means the browser is gone. Playwright may raise TargetClosedError for the
    calls in flight before it has processed the disconnection itself."""
    return browser is not None and (not browser.is_connected() or type(error).__name__ == "TargetClosedError")


class BrowserRunner:
    """Serve `root` with the runner page (and `runtimes`, each under its key) and open runner pages.

    `runtimes`: key -> Runtime whose dist/ is mounted at /__pack__/runtime/<key>/. `browser` reuses
    an open Playwright browser; otherwise one is launched (`gpu`: hardware Vulkan flags) and closed.
    `engine` firefox or webkit: the pages open in that engine instead (driven.py), the same page.
    `manifest` (bytes) is served as the package's manifest.json instead of the file in `root`
    (server.py). Use as a context manager.
    """

    def __init__(self, root: Path, *, runtimes: dict[str, Runtime] | None = None, gpu: bool = False, browser=None,
                 models: Path | None = None, manifest: bytes | None = None, engine: str = "chromium"):
        self.engine = engine
        self.session = None  # a driven engine's session (driven.py)
        self.root = Path(root)
        self.manifest = manifest
        self.runtimes = dict(runtimes or {})
        self.gpu = gpu
        self.browser = browser
        self.models = models
        self._stack = ExitStack()
        self.server = None

    def __enter__(self) -> "BrowserRunner":
        mounts = {PAGE_PREFIX: PAGE_DIR, LOADER_PREFIX: loader_modules()}
        for key, runtime in self.runtimes.items():
            mounts[f"{RUNTIME_PREFIX}{key}/"] = runtime.bundles["webgpu"].module.parent
        if self.models is not None:
            mounts[MODEL_PREFIX] = self.models
        try:
            self.server = self._stack.enter_context(running_server(self.root, mounts, manifest=self.manifest))
            if self.engine != "chromium":
                self.session = self._stack.enter_context(engine_session(self.engine))
            elif self.browser is None:
                self.browser = self._stack.enter_context(launch_browser(gpu=self.gpu))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    @property
    def browser_version(self) -> str:
        return self.session.version if self.session is not None else self.browser.version

    @property
    def browser_name(self) -> str:
        return self.session.name if self.session is not None else self.browser.browser_type.name

    def url(self, path: str) -> str:
        """The absolute URL of `path` ("/__pack__/..." or a package file) on this server."""
        return self.server.url + path.lstrip("/")

    def runtime_urls(self, key: str, bundle: str) -> dict[str, str]:
        """{module, wasm} URLs of `bundle` of the runtime mounted under `key`: what the loader and
        the model runs take instead of a shipped bundle."""
        chosen = self.runtimes[key].bundles[bundle]
        base = f"{RUNTIME_PREFIX}{key}/"
        urls = {"module": self.url(base + chosen.module.name), "wasm": self.url(base + chosen.wasm.name)}
        if chosen.glue is not None:
            urls["glue"] = self.url(base + chosen.glue.name)
        return urls

    def open_page(self) -> "RunnerPage | DrivenPage":
        """A fresh context and page with runner.js loaded (and the GPU hooks installed)."""
        if self.session is not None:
            return open_driven_page(self.session, self.url(PAGE_PREFIX + "runner.html"))
        page, watch = new_watched_page(self.browser)
        runner_page = RunnerPage(page, watch)
        try:
            page.goto(self.url(PAGE_PREFIX + "runner.html"))
            page.wait_for_function("() => window.__packRunnerReady === true", timeout=30_000)
        except BaseException:
            runner_page.close()
            raise
        return runner_page

    def probe_adapter(self) -> dict:
        """The WebGPU adapter facts of a fresh page (retrying a null adapter)."""
        runner_page = self.open_page()
        try:
            return runner_page.probe_adapter()
        finally:
            runner_page.close()

    def probe_device(self) -> tuple[dict, dict]:
        """(adapter facts, browser/OS facts) of one fresh page."""
        runner_page = self.open_page()
        try:
            if isinstance(runner_page, DrivenPage):
                return runner_page.probe_adapter(), runner_page.probe_device()
            return runner_page.probe_adapter(), probe_device(runner_page.page)
        finally:
            runner_page.close()


class RunnerPage:
    """One page of the runner: start a run, wait for its result, read what the page logged."""

    def __init__(self, page, watch):
        self.page = page
        self.watch = watch

    def run(self, kind: str, options: dict, limit_ms: int) -> dict:
        """Start `kind` ('package' or 'model') with `options`, wait up to `limit_ms` for the result.

        The in-page watchdog covers each stage; this limit catches a main thread that never yields,
        which no in-page timer can: the result then says `hung`.
        """
        try:
            self.page.evaluate("([kind, options]) => window.packRunner.start(kind, options)", [kind, options])
            self.page.wait_for_function("() => window.__packResult !== null", timeout=limit_ms, polling=200)
            return self.page.evaluate("() => window.__packResult")
        except Exception as error:  # noqa: BLE001 - Playwright TimeoutError, or a crashed page
            if connection_lost(self.page.context.browser, error):
                raise BrowserLost(f"connection lost ({type(error).__name__} during a run)") from None
            if type(error).__name__ == "TimeoutError":
                return {"ok": False, "stage": "watchdog", "hung": True,
                        "error": f"watchdog: no result within {limit_ms} ms ({type(error).__name__})"}
            return {"ok": False, "stage": "page", "crashed": True,
                    "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"}

    def probe_adapter(self) -> dict:
        return probe_adapter(self.page)

    def gpu_errors(self) -> list[dict]:
        try:
            return gpu_errors(self.page)
        except Exception:  # noqa: BLE001 - a crashed or hung page has nothing more to say
            return []

    def close(self) -> None:
        try:
            self.page.context.close()
        except Exception:  # noqa: BLE001 - a hung renderer may refuse a clean close; the browser closes it later
            pass


def loader_modules() -> Path:
    """The folder of the loader's ES modules pack renders into packages (package data
    `pipeline.web_template`: web_template/loader/ in the repository)."""
    return Path(str(resources.files("pipeline.web_template") / "loader"))


def encode_tensor(array: np.ndarray) -> dict:
    """{type, dims, bytes (base64, little-endian)}: how a tensor crosses into the page."""
    dtype = name_of_numpy(array.dtype)
    if dtype is None:
        raise PackError(f"input dtype {array.dtype}: not supported in the browser; use one of {', '.join(NUMPY_DTYPES)}")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return {"type": dtype, "dims": list(array.shape), "bytes": base64.b64encode(data.tobytes()).decode()}


def decode_tensor(encoded: dict) -> np.ndarray:
    """The array of an output the page handed back (`encode_tensor`'s format)."""
    dtype = NUMPY_DTYPES.get(encoded["type"])
    if dtype is None:
        raise PackError(f"browser output type {encoded['type']!r}: not supported by the runner")
    raw = base64.b64decode(encoded["bytes"])
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(encoded["dims"])
