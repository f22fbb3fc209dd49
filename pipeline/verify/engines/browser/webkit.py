"""WebKit as the third engine: Debian's WebKitGTK
MiniBrowser, driven by `WebKitWebDriver` (W3C WebDriver classic; apt `webkit2gtk-driver`) through
PyPI selenium's WebKitGTK driver, under a virtual display (xvfb.py): MiniBrowser has no headless
mode. Playwright cannot drive it here (it passes MiniBrowser an option MiniBrowser does not know).

Like firefox.py it runs the build's default loads (default_load.py): the same page
(page/default_load.js), served the same way, one page per visit in one session; and the per-(EP,
variant) checks (harness.py through driven.py) on runner pages of one MiniBrowser, `session()`.
WebDriver classic gives no console, so the page
reports its warnings and facts itself; and the driver polls for the answer instead of awaiting one
long call. WebKit is the engine of every iOS browser; WebKitGTK has no SharedArrayBuffer on an
isolated page (one wasm thread) and no WebGPU here. A machine without it gets a `not-verifiable`
check naming the install line, never a silent skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import threading
import time
from pathlib import Path

from pipeline.errors import PackError
from pipeline.verify.engines.browser.chromium import ConsoleLine

INSTALL = "apt-get install webkit2gtk-driver xvfb"
MINIBROWSER_ENV = "PACK_MINIBROWSER"  # a MiniBrowser other than the one beside Debian's libwebkit2gtk
# MiniBrowser is not on PATH: it lives beside the library, in the multiarch lib folder (Debian:
# /usr/lib/<triplet>/webkit2gtk-4.1/) or libexec (other distributions); the newest API first.
MINIBROWSER_GLOBS = ("/usr/lib/*/webkit2gtk-4.*/MiniBrowser", "/usr/lib/webkit2gtk-4.*/MiniBrowser", "/usr/libexec/webkit2gtk-4.*/MiniBrowser")
POLL_S = 0.25
LAUNCH_S = 60  # session start (1.5 s here) and page open, beyond the load's own limit


def minibrowser() -> str | None:
    """The MiniBrowser to drive: $PACK_MINIBROWSER, else the one installed with libwebkit2gtk; None when none."""
    configured = os.environ.get(MINIBROWSER_ENV)
    if configured:
        return configured if Path(configured).is_file() else None
    found = sorted({path for pattern in MINIBROWSER_GLOBS for path in glob.glob(pattern) if os.access(path, os.X_OK)}, reverse=True)
    return found[0] if found else None


def identity() -> str | None:
    """What decides this WebKit's results, for the build's keys: the WebKitGTK library MiniBrowser
    runs, by name and sha256 (its version needs a display to ask; the digest is remembered per file
    state); None when there is no MiniBrowser."""
    from pipeline.cache import file_sha256, remembered_digest

    binary = minibrowser()
    if binary is None:
        return None
    libraries = sorted(Path(binary).resolve().parent.parent.glob("libwebkit2gtk-4.*.so.0"))
    target = libraries[0].resolve() if libraries else Path(binary).resolve()
    return f"{target.name} {remembered_digest(target, 'sha256', file_sha256)}"


def unavailable() -> str | None:
    """Why WebKit cannot run here, with the line that fixes it; None when it can."""
    from pipeline.verify.engines.browser.xvfb import xvfb_executable

    if minibrowser() is None:
        where = f"${MINIBROWSER_ENV} ({os.environ[MINIBROWSER_ENV]}) is not a file" if os.environ.get(MINIBROWSER_ENV) else "no webkit2gtk MiniBrowser in the lib folders"
        return f"WebKit is not installed ({where}); install it: {INSTALL}"
    if shutil.which("WebKitWebDriver") is None:
        return f"WebKit is not drivable (no WebKitWebDriver on PATH); install it: {INSTALL}"
    if xvfb_executable() is None:
        return f"WebKit needs a display and Xvfb is not on PATH; install it: {INSTALL}"
    try:
        import selenium.webdriver.webkitgtk.webdriver  # noqa: F401
    except ImportError:
        return "WebKit is driven through selenium, which is not installed: pip install -e . (pyproject pins it)"
    return None


def run_visits(url: str, base: str, visits: list[dict], timeout_ms: int) -> dict[str, dict]:
    """The answers of page/default_load.js at `url` in one MiniBrowser, one page load per visit
    ({name, platform, cold}, in order), by name: DEFAULT_LOAD's shape with the page's facts and
    warnings, plus `browser` and `memory` (the web processes' peak during the visit: memory.py);
    {ok: false, message} for a visit WebKit did not answer."""
    from pipeline.verify.engines.browser.xvfb import virtual_display

    limit_s = timeout_ms / 1000 * len(visits)
    fired = threading.Event()
    try:
        with virtual_display() as (display, xvfb):
            # selenium's HTTP calls wait without limit (a page whose main thread never yields would
            # hang the build): past the limit the display goes, and MiniBrowser and its driver's calls with it.
            guard = threading.Timer(limit_s + LAUNCH_S, lambda: (fired.set(), xvfb.kill()))
            guard.start()
            try:
                answers = _ask(url, base, display, timeout_ms / 1000, visits)
            finally:
                guard.cancel()
    except PackError as error:
        answers = {visit["name"]: {"ok": False, "message": f"WebKit: {error}", "fallbacks": []} for visit in visits}
    if fired.is_set():
        late = {"ok": False, "message": f"WebKit did not answer within {limit_s + LAUNCH_S:.0f} s (its page never yielded)", "fallbacks": []}
        answers = {name: answer if answer.get("ok") else late for name, answer in answers.items()}
    return answers


def _ask(url: str, base: str, display: str, limit_s: float, visits: list[dict]) -> dict[str, dict]:
    from selenium.webdriver.webkitgtk.options import Options
    from selenium.webdriver.webkitgtk.service import Service
    from selenium.webdriver.webkitgtk.webdriver import WebDriver

    from pipeline.verify.engines.browser.memory import PeakSampler

    options = Options()
    options.binary_location = minibrowser() or "MiniBrowser"
    options.add_argument("--automation")  # MiniBrowser given as a binary waits for the driver only with it
    service = Service(executable_path=shutil.which("WebKitWebDriver"), env={**os.environ, "DISPLAY": display})
    driver = None
    answers: dict[str, dict] = {}
    try:
        driver = WebDriver(options=options, service=service)
        browser = f"webkitgtk/{driver.capabilities.get('browserVersion', '?')}"
        with PeakSampler(service.process.pid, "webkit") as sampler:
            for index, visit in enumerate(visits):
                sampler.start_phase(visit["name"])
                if index:
                    # a new page, as the other engines' visits are; the pages before stay open: in WebKitGTK
                    # under WebKitWebDriver what a page cached is gone once it navigates away or closes
                    driver.switch_to.new_window("tab")
                driver.get(url)
                _wait(driver, "return typeof window.__packStartDefaultLoad === 'function'", 30, "the page did not load its script")
                driver.execute_script("window.__packStartDefaultLoad(arguments[0], arguments[1])", base,
                                      {"platform": visit.get("platform"), "cold": bool(visit.get("cold"))})
                answer = _wait(driver, "return window.__packDefaultLoadAnswer", limit_s, "load() and the sample run did not finish")
                sampler.end_phase()
                answers[visit["name"]] = {**answer, "browser": browser, "memory": sampler.peaks().get(visit["name"])}
        return answers
    except Exception as error:  # the session, the page or the display failed: the loads left did not happen
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        failed = {"ok": False, "message": f"WebKit: {first[:300]}", "fallbacks": []}
        return {visit["name"]: answers.get(visit["name"], failed) for visit in visits}
    finally:
        with contextlib.suppress(Exception):  # what is left of a session that failed must not hide why
            if driver is not None:
                driver.quit()
            else:
                service.stop()


def _wait(driver, script: str, limit_s: float, what: str):
    """The first truthy value of `script` within `limit_s`; TimeoutError naming `what` after it."""
    deadline = time.monotonic() + limit_s
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {limit_s:.0f} s")
        time.sleep(POLL_S)


# WebDriver classic has no console and no script run before a page's own: the runner page's
# console is hooked right after load, before any run starts.
CONSOLE_HOOK = Path(__file__).parent / "page" / "console_hook.js"


class WebKitSession:
    """One MiniBrowser under Xvfb for the runner pages of a verification (driven.py's session).
    A page is the one window navigated afresh; a call past its limit takes the display down (and
    MiniBrowser with it: selenium's calls wait without limit), and the next page starts anew."""

    name = "webkit"

    def __init__(self):
        self.version = "?"
        self._stack: contextlib.ExitStack | None = None
        self._driver = None
        self._xvfb = None

    def _start(self) -> None:
        from selenium.webdriver.webkitgtk.options import Options
        from selenium.webdriver.webkitgtk.service import Service
        from selenium.webdriver.webkitgtk.webdriver import WebDriver

        from pipeline.verify.engines.browser.xvfb import virtual_display

        self._stack = contextlib.ExitStack()
        display, self._xvfb = self._stack.enter_context(virtual_display())
        options = Options()
        options.binary_location = minibrowser() or "MiniBrowser"
        options.add_argument("--automation")
        service = Service(executable_path=shutil.which("WebKitWebDriver"), env={**os.environ, "DISPLAY": display})
        self._stack.callback(service.stop)
        self._driver = self._guarded(lambda: WebDriver(options=options, service=service), LAUNCH_S)
        self._stack.callback(self._driver.quit)
        self.version = f"webkitgtk/{self._driver.capabilities.get('browserVersion', '?')}"

    def _guarded(self, call, limit_s: float):
        """`call()` within `limit_s`, else the display goes (the session with it) and PageHung."""
        from pipeline.verify.engines.browser.chromium import PageHung

        fired = threading.Event()
        xvfb = self._xvfb
        guard = threading.Timer(limit_s, lambda: (fired.set(), xvfb.kill()))
        guard.start()
        try:
            return call()
        except Exception:
            if fired.is_set():
                self.stop()
                raise PageHung(f"WebKit gave no answer within {limit_s:.0f} s") from None
            raise
        finally:
            guard.cancel()

    def open(self, url: str, init: str) -> str:
        if self._driver is None:
            self._start()
        self._guarded(lambda: self._driver.get(url), LAUNCH_S)
        self._guarded(lambda: self._driver.execute_script(CONSOLE_HOOK.read_text(encoding="utf-8") + "\n" + init), LAUNCH_S)
        return url

    def evaluate(self, handle: str, source: str, arg, limit_s: float):
        if self._driver is None:
            raise RuntimeError("WebKit's session ended")
        return self._guarded(lambda: self._driver.execute_script(f"return ({source})(arguments[0]);", arg), limit_s)

    def console(self, handle: str) -> list[ConsoleLine]:
        if self._driver is None:
            return []
        try:
            lines = self._guarded(lambda: self._driver.execute_script("return (window.__packConsole || []).splice(0);"), LAUNCH_S) or []
        except Exception:  # noqa: BLE001 - a page that crashed has nothing more to say
            return []
        return [ConsoleLine(line["type"], line["text"]) for line in lines]

    def close(self, handle: str) -> None:
        if self._driver is not None:
            self._guarded(lambda: self._driver.get("about:blank"), LAUNCH_S)

    def stop(self) -> None:
        stack, self._stack, self._driver = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):  # what is left of a session that failed must not hide why
                stack.close()


@contextlib.contextmanager
def session():
    """A WebKitSession, stopped at the end of the block."""
    webkit = WebKitSession()
    try:
        webkit._start()
        yield webkit
    finally:
        webkit.stop()
