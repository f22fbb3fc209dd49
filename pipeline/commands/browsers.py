"""The options `pack build` and `pack verify` share for verifying on other browsers: remote
Playwright browser servers (`--browser ws://…`, PACK_BROWSERS), CDP endpoints (`--cdp`), the
per-browser time budget and the exit-code policy (docs/remote.md). Light: Playwright is imported
only when a command runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from pipeline.verify.engines.browser.remote import DEFAULT_BUDGET_S  # a light module: Playwright loads only when connecting

BrowserOption = Annotated[Optional[list[str]], typer.Option(
    "--browser", envvar="PACK_BROWSERS", show_envvar=True,
    help="Verify on this Playwright browser server, ws://HOST:PORT/PATH (`npx playwright run-server`), instead of the local "
         "headless Chromium; repeatable; `local` adds this machine's. PACK_BROWSERS: comma-separated. Tokens in the URL are never printed.")]
CdpOption = Annotated[Optional[list[str]], typer.Option(
    "--cdp", envvar="PACK_CDP", show_envvar=True,
    help="Verify on a Chrome DevTools Protocol endpoint (ws:// or http://HOST:PORT), for CDP-only services; repeatable.")]
RequireAllOption = Annotated[bool, typer.Option(
    "--require-all", envvar="PACK_REQUIRE_ALL", show_envvar=True,
    help="Exit 1 when any browser ended in error (unreachable, connection lost, budget spent). Default: only when none finished.")]
BudgetOption = Annotated[int, typer.Option(
    "--browser-budget-s", envvar="PACK_BROWSER_BUDGET_S", show_envvar=True, min=10,
    help="Time budget per browser, seconds (connecting and retrying included); what is left undone is reported as error.")]
RemoteChromiumOption = Annotated[Optional[str], typer.Option(
    "--remote-chromium", envvar="PACK_REMOTE_CHROMIUM", show_envvar=True,
    help="Chromium executable a browser server launches for pack (its path on that machine; the server needs --unsafe).")]




def grid_settings(browsers: list[str] | None, cdps: list[str] | None, *, require_all: bool, budget_s: int, remote_chromium: str | None):
    """GridSettings for the options given, or None when none names an endpoint (the local browser)."""
    from pipeline.verify.engines.browser.grid import GridSettings
    from pipeline.verify.engines.browser.remote import parse_endpoints

    endpoints = parse_endpoints(browsers, cdps)
    if not endpoints:
        return None
    return GridSettings(tuple(endpoints), float(budget_s), remote_chromium, require_all)
