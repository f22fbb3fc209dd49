"""Browsers pack does not launch: a Playwright browser server (`playwright run-server`, the grids
and device clouds built on it) reached with `BrowserType.connect`, or a CDP endpoint reached with
`connect_over_cdp`. Beside chromium.py, which launches the local one; `open_browser` is the one
entry for all three.

The remote browser fetches the package from pack's local server *through the connection*:
- `connect`: Playwright's `expose_network="<loopback>"` makes the remote browser's requests to
  localhost/127.0.0.1 travel back over the WebSocket to this machine;
- CDP has no such tunnel: every request to 127.0.0.1 is intercepted (`context.route`) and answered
  with a fetch made here (`route.fetch()` runs in this machine's Playwright driver).
So nothing has to be published before a package is verified on a device.

Endpoint URLs often carry credentials (`?token=`, `user:pass@`, a key as a path segment); they are
used as given and only ever printed as `label` (pipeline/urls.py's rule, key-like path segments
masked too), errors included (`Endpoint.scrub`).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.errors import PackError
from pipeline.urls import mask_url, scrub
from pipeline.verify.engines.browser.chromium import launch_browser, launch_flags

LOCAL = "local"
CONNECT = "connect"
CDP = "cdp"
CONNECT_TIMEOUT_MS = 30_000
DEFAULT_BUDGET_S = 1800  # per browser, connecting and the retry included


@dataclass(frozen=True)
class Endpoint:
    kind: str  # local | connect | cdp
    url: str | None = None  # as given: may hold a token; never printed

    @property
    def label(self) -> str:
        """What reports and progress lines name this endpoint by: no credentials."""
        return "local" if self.kind == LOCAL else (mask_url(self.url or "", path_keys=True) + (" (cdp)" if self.kind == CDP else ""))

    def scrub(self, text: str) -> str:
        """`text` (an error message, a log line) with every secret part of the endpoint's URL masked."""
        return scrub(text, self.url, path_keys=True)


def parse_endpoints(browsers: list[str] | None, cdps: list[str] | None) -> list[Endpoint]:
    """The endpoints of `--browser` (and PACK_BROWSERS: comma separated) and `--cdp`, in order,
    duplicates dropped; `--browser local` is this machine's headless Chromium. [] = local only."""
    endpoints: list[Endpoint] = []
    for option, values, schemes in (("--browser", browsers, ("ws", "wss")), ("--cdp", cdps, ("ws", "wss", "http", "https"))):
        for value in values or []:
            for item in (part.strip() for part in value.split(",")):
                if not item:
                    continue
                if option == "--browser" and item == LOCAL:
                    endpoint = Endpoint(LOCAL)
                else:
                    parts = urlsplit(item)
                    if parts.scheme not in schemes or not parts.hostname:
                        shown = mask_url(item, path_keys=True) if "://" in item else item[:40]
                        raise PackError(f"{option} {shown}: not a {' or '.join(s + '://' for s in schemes)} URL"
                                        + (" (or `local`)" if option == "--browser" else "")
                                        + " (a Playwright browser server: `npx playwright run-server --port 3000`, docs/remote.md)")
                    endpoint = Endpoint(CONNECT if option == "--browser" else CDP, item)
                if endpoint not in endpoints:
                    endpoints.append(endpoint)
    return endpoints


def launch_options(gpu: bool, executable: str | None) -> dict:
    """What a Playwright browser server launches for us (header `x-playwright-launch-options`):
    pack's Chromium flags; the server honours `args` and `executablePath` only when started
    with `--unsafe`, else it launches its own Chromium with Playwright's defaults."""
    options = {"headless": True, "args": launch_flags(gpu), "chromiumSandbox": False}
    if executable:
        options["executablePath"] = executable
    return options


@contextmanager
def open_browser(endpoint: Endpoint, *, gpu: bool = False, remote_executable: str | None = None, timeout_ms: int = CONNECT_TIMEOUT_MS):
    """A Playwright `Browser` for `endpoint`, closed (or disconnected) on exit; sync API, this thread.

    Errors reaching an endpoint are PackError naming it by its label."""
    if endpoint.kind == LOCAL:
        with launch_browser(gpu=gpu) as browser:
            yield browser
        return
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        try:
            if endpoint.kind == CONNECT:
                headers = {"x-playwright-launch-options": json.dumps(launch_options(gpu, remote_executable))}
                browser = playwright.chromium.connect(endpoint.url, timeout=timeout_ms, headers=headers,
                                                      expose_network="<loopback>")
            else:
                browser = playwright.chromium.connect_over_cdp(endpoint.url, timeout=timeout_ms)
                browser = RoutedBrowser(browser)
        except PlaywrightError as error:
            raise PackError(f"{endpoint.label}: cannot connect ({endpoint.scrub(first_line(error))}); "
                            "check that the browser server runs and the URL and its token are right") from None
        try:
            yield browser
        finally:
            try:
                browser.close()
            except Exception:  # noqa: BLE001 - a lost connection cannot be closed cleanly
                pass


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def _is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def _fetch_here(route) -> None:
    try:
        route.fulfill(response=route.fetch())
    except Exception:  # noqa: BLE001 - the page sees a network error, as it would without the tunnel
        try:
            route.abort()
        except Exception:  # noqa: BLE001 - the page or the connection is gone
            pass


class RoutedBrowser:
    """A CDP browser whose new contexts answer requests for this machine's loopback from here."""

    def __init__(self, browser):
        self._browser = browser

    def new_context(self, **options):
        context = self._browser.new_context(**options)
        context.route(_is_local, _fetch_here)
        return context

    def __getattr__(self, name):
        return getattr(self._browser, name)
