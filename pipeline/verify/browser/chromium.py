"""Launch Debian's Chromium through Playwright with WebGPU on, and watch a page for failure signals.

Playwright comes from PyPI but its own browser download is never used: `executable_path` points at
the system Chromium (`$PACK_CHROMIUM`, else `chromium` on PATH, else /usr/bin/chromium).

Signals a run can fail by without an exception (shared notes, onnxruntime-web 1.30):
- every onnxruntime log line arrives as console.error with ANSI colours, `[E:onnxruntime` = error;
- WebGPU validation errors reach only the device's `uncapturederror` event and the console (the
  root JSEP build returns all zeros for fp16 without shader-f16 and says so only there). An init
  script hooks `GPUAdapter.requestDevice` so every device onnxruntime creates reports them.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PackError

BASE_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--enable-unsafe-webgpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# A hardware Vulkan adapter in headless Chromium (measured on an NVIDIA H200: docs/gpu.md). The Dawn
# toggles expose shader-f16 on NVIDIA's Vulkan driver. --enable-webgpu-developer-features unmasks
# GPUAdapterInfo (without it `device` and `description` are empty, so report.json could not say which
# GPU verified the package) and leaves timestamp queries unquantized for the kernel profile.
GPU_FLAGS = [
    "--enable-webgpu-developer-features",
    "--use-angle=vulkan",
    "--enable-features=Vulkan",
    "--use-vulkan=native",
    "--disable-vulkan-surface",
    "--ignore-gpu-blocklist",
    "--enable-dawn-features=allow_unsafe_apis,vulkan_enable_f16_on_nvidia",
    "--disable-dawn-features=disallow_unsafe_apis",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Runs before any page script: report WebGPU device errors (validation, OOM, internal, lost).
GPU_ERROR_HOOK = r"""
(() => {
  window.__packGpuErrors = [];
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
})();
"""

# Some adapters return null on the first requestAdapter() in a fresh browser (7 of 8 runs on a
# real NVIDIA GPU): retry before declaring the adapter missing.
ADAPTER_PROBE = r"""
async ({attempts, delayMs}) => {
  if (!navigator.gpu) return {available: false, attempts: 0, reason: 'navigator.gpu is undefined'};
  for (let attempt = 1; attempt <= attempts; attempt++) {
    const adapter = await navigator.gpu.requestAdapter();
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
"""


def chromium_path() -> str:
    """The system Chromium; PackError with the fix when there is none."""
    configured = os.environ.get("PACK_CHROMIUM")
    candidates = [configured] if configured else [shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise PackError(
        "chromium: not found (looked at $PACK_CHROMIUM, PATH, /usr/bin/chromium); "
        "install it (`apt-get install chromium`), set PACK_CHROMIUM, or build with --no-browser"
    )


def launch_flags(gpu: bool = False, webgpu: bool = True) -> list[str]:
    flags = BASE_FLAGS + (GPU_FLAGS if gpu else [])
    # without --enable-unsafe-webgpu headless Chromium has no adapter: the no-WebGPU path, for tests
    return flags if webgpu else [flag for flag in flags if flag != "--enable-unsafe-webgpu"]


@contextmanager
def launch_browser(gpu: bool = False, webgpu: bool = True):
    """A Playwright `Browser` on the system Chromium with WebGPU enabled (sync API, this thread).

    `gpu` adds the hardware Vulkan adapter flags; `webgpu=False` leaves WebGPU off (tests of the
    "no adapter" path)."""
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with sync_playwright() as playwright:
        try:
            browser = playwright.chromium.launch(
                executable_path=executable, args=launch_flags(gpu, webgpu), headless=True, chromium_sandbox=False
            )
        except PlaywrightError as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
            raise PackError(f"{executable}: Chromium did not start ({first_line}); check the install or use --no-browser") from None
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class ConsoleLine:
    type: str  # console message type: 'error', 'warning', 'log', ...; 'pageerror' for uncaught errors
    text: str  # ANSI colours removed


@dataclass
class PageWatch:
    """Console lines and uncaught errors of one page, gathered as they arrive."""

    lines: list[ConsoleLine] = field(default_factory=list)

    def mark(self) -> int:
        """A position to read the lines of one run from (`since`)."""
        return len(self.lines)

    def since(self, mark: int) -> list[ConsoleLine]:
        return self.lines[mark:]


def new_watched_page(browser):
    """A fresh context and page with the GPU error hook installed and its console recorded.

    Returns (page, PageWatch); closing the page's context is the caller's job (page.context.close()).
    """
    context = browser.new_context()
    context.add_init_script(GPU_ERROR_HOOK)
    page = context.new_page()
    watch = PageWatch()
    page.on("console", lambda message: watch.lines.append(ConsoleLine(message.type, _ANSI.sub("", message.text))))
    page.on("pageerror", lambda error: watch.lines.append(ConsoleLine("pageerror", str(error))))
    return page, watch


def probe_adapter(page, attempts: int = 5, delay_ms: int = 200) -> dict:
    """WebGPU adapter facts of this page (features, fallback flag, vendor), retrying a null adapter."""
    return page.evaluate(ADAPTER_PROBE, {"attempts": attempts, "delayMs": delay_ms})


def gpu_errors(page) -> list[dict]:
    """WebGPU errors reported to any device of the page since it loaded."""
    return page.evaluate("() => window.__packGpuErrors || []")
