"""Launch Debian's Chromium through Playwright with WebGPU on, and watch a page for failure signals.

Playwright comes from PyPI but its own browser download is never used: `executable_path` points at
the system Chromium (`$PACK_CHROMIUM`, else `chromium` on PATH, else /usr/bin/chromium).

Signals a run can fail by without an exception (measured with onnxruntime-web 1.30, docs/browser.md):
- every onnxruntime log line arrives as console.error with ANSI colours, `[E:onnxruntime` = error;
- WebGPU validation errors reach only the device's `uncapturederror` event and the console (the
  root JSEP build returns all zeros for fp16 without shader-f16 and says so only there). An init
  script (page/gpu_hooks.js) hooks `GPUAdapter.requestDevice` so every device onnxruntime creates
  reports them, and sums GPU buffer sizes for the peak-memory figure.
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

# In-page code, in real .js files: the init script every page gets (WebGPU error capture, GPU
# buffer accounting) and the adapter probe.
PAGE_DIR = Path(__file__).parent / "page"
GPU_HOOKS = PAGE_DIR / "gpu_hooks.js"
ADAPTER_PROBE = PAGE_DIR / "adapter_probe.js"
DEVICE_PROBE = PAGE_DIR / "device_probe.js"


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


class PageHung(Exception):
    """A page did not answer within its limit (its main thread never yielded, or the engine died);
    raised by every engine's driver (driven.py's sessions)."""


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
    context.add_init_script(path=GPU_HOOKS)
    page = context.new_page()
    watch = PageWatch()
    page.on("console", lambda message: watch.lines.append(ConsoleLine(message.type, _ANSI.sub("", message.text))))
    page.on("pageerror", lambda error: watch.lines.append(ConsoleLine("pageerror", str(error))))
    return page, watch


def probe_adapter(page, attempts: int = 5, delay_ms: int = 200) -> dict:
    """WebGPU adapter facts of this page (features, fallback flag, vendor), retrying a null adapter."""
    return page.evaluate(_probe_source(ADAPTER_PROBE), {"attempts": attempts, "delayMs": delay_ms})


def probe_device(page) -> dict:
    """Browser brand, OS and user agent of this page (page/device_probe.js)."""
    return page.evaluate(_probe_source(DEVICE_PROBE))


def _probe_source(path: Path) -> str:
    # the file holds one function expression; its leading comment lines are not part of it
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.startswith("//"))


def gpu_errors(page) -> list[dict]:
    """WebGPU errors reported to any device of the page since it loaded."""
    return page.evaluate("() => window.__packGpuErrors || []")

