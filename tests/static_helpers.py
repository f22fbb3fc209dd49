"""A plain static server for tests and benchmarks: python's http.server over a folder, every file
as it is (no Content-Encoding for `.br` files, no custom headers), as "upload a folder" hosting
serves them; and a first visit's bytes on the wire, as Chromium's DevTools protocol counts them."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def plain_static_server(folder: Path, fallback: str | None = None) -> Iterator[str]:
    """Serve `folder` on 127.0.0.1 (a free port); yields the base URL, ending with '/'. With
    `fallback` (a file of `folder`), a path that is no file is answered with it and 200, as a
    single-page app's host does (Cloudflare Pages without a 404.html, a Netlify `/* /index.html 200`)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(folder), **kwargs)

        def translate_path(self, path):
            found = super().translate_path(path)
            return found if fallback is None or Path(found).exists() else str(folder / fallback)

        def log_message(self, format, *args):  # noqa: A002 - no access log on stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def first_visit(browser, page_url: str, base: str, options: dict) -> dict:
    """loader_helpers.LOAD_AND_RUN of the package at `base` from the page at `page_url`, in a fresh
    context (empty Cache Storage), with `wire`: the bytes on the wire of every request the page made
    ("METHOD URL" -> CDP Network.loadingFinished encodedDataLength, headers included; for a HEAD,
    which gets none, its response headers' bytes), `unfinished`: requests that never finished, and
    `failed`: "METHOD URL STATUS" of each answer of 400 or more (the console shows each in red)."""
    from loader_helpers import LOAD_AND_RUN

    context = browser.new_context()
    try:
        page = context.new_page()
        cdp = context.new_cdp_session(page)
        cdp.send("Network.enable")
        urls: dict[str, str] = {}
        wire: dict[str, int] = {}
        heads: dict[str, int] = {}
        statuses: dict[str, int] = {}
        cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["method"] + " " + e["request"]["url"]))
        cdp.on("Network.responseReceived", lambda e: (heads.__setitem__(e["requestId"], e["response"].get("encodedDataLength", 0)), statuses.__setitem__(e["requestId"], e["response"]["status"])))
        cdp.on("Network.loadingFinished", lambda e: wire.__setitem__(e["requestId"], e["encodedDataLength"]))
        page.goto(page_url)
        result = page.evaluate(LOAD_AND_RUN, {"base": base, "options": options, "run": True})
        answered = lambda: [r for r in urls if r in heads]  # noqa: E731
        for _ in range(30):  # the last loadingFinished events may come after the page's promise
            if all(r in wire or urls[r].startswith("HEAD ") for r in answered()):
                break
            page.wait_for_timeout(100)
        result["wire"] = {urls[r]: wire.get(r, heads[r]) for r in answered()}
        result["unfinished"] = [urls[r] for r in answered() if r not in wire and not urls[r].startswith("HEAD ")]
        # the browser's own favicon request is not the page's
        result["failed"] = [f"{urls[r]} {statuses[r]}" for r in answered() if statuses[r] >= 400 and not urls[r].endswith("/favicon.ico")]
        return result
    finally:
        context.close()
