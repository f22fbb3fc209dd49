"""The runner page in an engine pack drives from outside Playwright (Firefox, WebKit): the same
page/runner.html and the same questions as pages.RunnerPage asks Chromium, so harness.py runs its
per-(EP, variant) checks in any engine; the engine is a driver choice, not a second harness.

A driver module (firefox.py, webkit.py) has INSTALL, unavailable() and session(), a context
manager yielding an object with: name, version, open(url, init) -> page handle (a fresh page,
`init` run before the page's scripts where the engine can, right after load where it cannot),
evaluate(handle, source, arg, limit_s) (a function expression called with `arg`, awaited; raises
PageHung past `limit_s`), console(handle) -> [ConsoleLine] since the last ask, close(handle).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from types import ModuleType

from pipeline.verify.engines.browser.chromium import ADAPTER_PROBE, DEVICE_PROBE, GPU_HOOKS, PageHung, PageWatch, _probe_source

DRIVEN_ENGINES = ("firefox", "webkit")
POLL_S = 0.25
CALL_S = 60  # a short question (a probe, a start, a poll) on a page whose main thread yields


def driver_for(engine: str) -> ModuleType:
    """The driver module of a driven engine."""
    from pipeline.verify.engines.browser import firefox, webkit

    return {"firefox": firefox, "webkit": webkit}[engine]


def engine_identity(engine: str) -> str | None:
    """What decides a driven engine's results (its version, or its library's bytes), for the
    build's keys; None when it is not installed."""
    return driver_for(engine).identity()


@contextmanager
def engine_session(engine: str):
    """An open session of `engine` (one browser for every page of a verification)."""
    with driver_for(engine).session() as session:
        yield session


class DrivenPage:
    """pages.RunnerPage's interface (run, probe_adapter, gpu_errors, watch, close) on a page of a
    driven engine: runs start with packRunner.start and are polled, as in Chromium."""

    def __init__(self, session, handle):
        self.session = session
        self.handle = handle
        self.watch = PageWatch()

    def _ask(self, source: str, arg=None, limit_s: float = CALL_S):
        try:
            return self.session.evaluate(self.handle, source, arg, limit_s)
        finally:
            self.watch.lines.extend(self.session.console(self.handle))

    def run(self, kind: str, options: dict, limit_ms: int) -> dict:
        """Start `kind` with `options`; its result within `limit_ms`, else `hung` (as RunnerPage.run)."""
        deadline = time.monotonic() + limit_ms / 1000
        try:
            self._ask("([kind, options]) => window.packRunner.start(kind, options)", [kind, options])
            while time.monotonic() < deadline:
                result = self._ask("() => window.__packResult", None, max(1.0, min(CALL_S, deadline - time.monotonic() + 5)))
                if result is not None:
                    return result
                time.sleep(POLL_S)
        except PageHung as error:
            return {"ok": False, "stage": "watchdog", "hung": True, "error": f"watchdog: {error}"}
        except Exception as error:  # noqa: BLE001 - the engine's own error: the page crashed
            return {"ok": False, "stage": "page", "crashed": True, "error": f"{type(error).__name__}: {str(error).strip()[:300]}"}
        return {"ok": False, "stage": "watchdog", "hung": True, "error": f"watchdog: no result within {limit_ms} ms"}

    def probe_adapter(self, attempts: int = 5, delay_ms: int = 200) -> dict:
        return self._ask(_probe_source(ADAPTER_PROBE), {"attempts": attempts, "delayMs": delay_ms})

    def probe_device(self) -> dict:
        return self._ask(_probe_source(DEVICE_PROBE))

    def gpu_errors(self) -> list[dict]:
        try:
            return self._ask("() => window.__packGpuErrors || []") or []
        except Exception:  # noqa: BLE001 - a crashed or hung page has nothing more to say
            return []

    def close(self) -> None:
        try:
            self.session.close(self.handle)
        except Exception:  # noqa: BLE001 - a hung page may refuse a clean close; the session ends it
            pass


def open_driven_page(session, url: str) -> DrivenPage:
    """runner.html at `url` in `session`, the GPU hooks installed, ready for runs."""
    page = DrivenPage(session, session.open(url, GPU_HOOKS.read_text(encoding="utf-8")))
    try:
        deadline = time.monotonic() + 30
        while not page._ask("() => window.__packRunnerReady === true"):
            if time.monotonic() > deadline:
                raise PageHung("runner.html did not load its script within 30 s")
            time.sleep(POLL_S)
    except BaseException:
        page.close()
        raise
    return page
