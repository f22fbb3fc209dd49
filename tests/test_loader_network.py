"""Network failures in headless Chromium: a download cut mid-body is retried with backoff, and when
it keeps failing load() rejects with a PackLoadError that names the file, its URL and the cause
(never a bare `TypeError: network error`)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from loader_helpers import LOAD_AND_RUN, make_package, read_manifest

pytestmark = pytest.mark.browser


class CuttingServer:
    """Serves a package folder; the first `cuts` requests for `victim` send the full Content-Length,
    half of the body, and close the connection."""

    def __init__(self, root: Path, victim: str, cuts: int):
        self.root, self.victim, self.cuts, self.seen = root, victim, cuts, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

            def do_GET(self):  # noqa: N802 - http.server naming
                path = self.path.split("?")[0].lstrip("/")
                body = b"<!doctype html><title>blank</title>" if path == "blank.html" else (server.root / path).read_bytes() if (server.root / path).is_file() else None
                if body is None:
                    self.send_error(404)
                    return
                kind = "text/html" if path.endswith(".html") else "text/javascript" if path.endswith((".js", ".mjs")) else "application/wasm" if path.endswith(".wasm") else "application/octet-stream"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if path == server.victim:
                    server.seen += 1
                    if server.seen <= server.cuts:
                        self.wfile.write(body[: len(body) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return make_package(tmp_path_factory.mktemp("pkg") / "loader-test-conv", "conv", prewarm=False)


def _load_with_cut(browser, package: Path, cuts: int) -> tuple[dict, str, str]:
    model = read_manifest(package)["variants"]["fp32"]["model"]
    server = CuttingServer(package, model, cuts)
    try:
        page = browser.new_context().new_page()
        page.goto(server.url + "blank.html")
        result = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"cache": False, "executionProviders": ["wasm"]}, "run": False})
        page.context.close()
    finally:
        server.close()
    return result, model, server.url + model


def test_a_download_cut_every_time_is_a_pack_load_error_naming_the_file(browser, package):
    result, model, url = _load_with_cut(browser, package, cuts=99)
    assert result["ok"] is False and result["name"] == "PackLoadError", result
    assert result["message"].startswith(f"{model}: download from {url} failed 3 times (TypeError: "), result["message"]
    retries = [e for e in result["events"] if e["type"] == "retry"]
    assert [(e["file"], e["attempt"], e["delayMs"]) for e in retries] == [(model, 1, 250), (model, 2, 500)]


def test_a_download_cut_once_is_retried_and_the_load_goes_on(browser, package):
    result, model, _ = _load_with_cut(browser, package, cuts=1)
    assert result["ok"], result
    assert [(e["file"], e["attempt"]) for e in result["events"] if e["type"] == "retry"] == [(model, 1)]
    # the cut attempt's bytes are not counted twice
    assert result["progress"][-1]["loaded"] == result["progress"][-1]["total"]
