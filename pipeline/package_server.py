"""A static server on 127.0.0.1 that serves a package the way production does.

- A file `X` with a brotli copy `X.br` is served under `X` with the `.br` bytes and
  `Content-Encoding: br` (browsers decode it; so does the CDN). `X.br` alone serves `X` too, as a
  bucket holding only the encoded object does. `X.br` asked by its own name is marked
  `Content-Encoding: br` too, for a client that accepts it, as pack export's host configurations
  do: the loader's host probe of an export asks for it (web_template/loader/brotli.js).
- Media types come from the package's manifest.json ("mediaType"), else from the file extension
  (.mjs must be text/javascript and .wasm application/wasm or the browser refuses them).
- Every response is cross-origin isolated (COOP same-origin, COEP require-corp, CORP) so wasm
  threads (SharedArrayBuffer) are available, as they are behind a correctly configured CDN.
- `cors` (origins, or `*`): pages on those origins may fetch the files (Access-Control-Allow-Origin),
  as a bucket with a CORS rule allows an app on another origin.
- `extra_mounts` maps URL prefixes (e.g. "/__pack__/") to folders outside the package: harness
  pages and alternative runtime files. They never shadow package files except under their prefix.
- `manifest` (bytes): served as the package's manifest.json in place of the file on disk, with the
  headers the file would get (`pack build` hands its browser stage the manifest in memory, so no
  provisional manifest.json is ever written into the package; pipeline/build.py).
"""

from __future__ import annotations

import json
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote, urlsplit

from pipeline.http_headers import ISOLATION_HEADERS
from pipeline.media_types import content_type

MANIFEST = "manifest.json"


@dataclass
class ServedRequest:
    path: str
    status: int
    encoding: str | None  # "br" when the brotli copy was sent
    size: int  # body bytes sent


class StaticServer:
    """Threaded static server; `url` ends with '/'. `requests` records what was served."""

    def __init__(self, root: Path, extra_mounts: dict[str, Path] | None = None, host: str = "127.0.0.1", port: int = 0, cors: list[str] | None = None,
                 manifest: bytes | None = None):
        self.root = Path(root).resolve()
        # the package's manifest.json from memory (the build's browser stage), else the file on disk
        self.manifest = manifest
        self.cors = list(cors or [])
        mounts = {prefix if prefix.endswith("/") else prefix + "/": Path(path).resolve() for prefix, path in (extra_mounts or {}).items()}
        # longest prefix first, the package root last
        self.mounts = sorted(mounts.items(), key=lambda item: -len(item[0])) + [("/", self.root)]
        self.requests: list[ServedRequest] = []
        # every response's Cache-Control (None: none sent, the browser's own caching)
        self.cache_control: str | None = "no-store"
        self._media_types = _manifest_media_types(manifest if manifest is not None else self.root / MANIFEST)
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        # a short poll interval keeps shutdown() quick (it waits for the next poll)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="pack-static-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> "StaticServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def locate(self, url_path: str) -> tuple[Path, str] | None:
        """The file for a URL path and its package-relative name, or None (outside every mount)."""
        for prefix, folder in self.mounts:
            if url_path.startswith(prefix):
                relative = url_path[len(prefix):]
                candidate = (folder / relative).resolve()
                if candidate != folder and not candidate.is_relative_to(folder):
                    return None  # ../ escapes
                return candidate, relative
        return None

    def media_type(self, relative: str) -> str:
        return content_type(relative, self._media_types.get(relative))

    def body(self, plain: Path, accepts_br: bool) -> tuple[Path | bytes, str | None] | None:
        """(the file or in-memory bytes to send, its Content-Encoding) for the file `locate` found;
        None when nothing is there."""
        if self.manifest is not None and plain == self.root / MANIFEST:
            return self.manifest, None
        encoded = plain.with_name(plain.name + ".br")
        if encoded.is_file() and (accepts_br or not plain.is_file()):
            return encoded, "br"
        if plain.is_file():
            return plain, "br" if accepts_br and plain.suffix == ".br" else None
        return None


def _manifest_media_types(source: Path | bytes) -> dict[str, str]:
    try:
        text = source if isinstance(source, bytes) else source.read_text()
        files = json.loads(text).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {name: entry["mediaType"] for name, entry in files.items() if isinstance(entry, dict) and entry.get("mediaType")}


def _handler_for(server: StaticServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - silence stderr access logs
            pass

        def do_HEAD(self) -> None:  # noqa: N802 - http.server naming
            self._serve(send_body=False)

        def do_GET(self) -> None:  # noqa: N802
            self._serve(send_body=True)

        def do_OPTIONS(self) -> None:  # noqa: N802 - a CORS preflight (a fetch with a Range header, say)
            allowed = self._allowed_origin()
            self.send_response(HTTPStatus.NO_CONTENT if allowed else HTTPStatus.FORBIDDEN)
            if allowed:
                self._cors_headers(allowed)
                self.send_header("Access-Control-Allow-Methods", "GET, HEAD")
                self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers") or "*")
                self.send_header("Access-Control-Max-Age", "86400")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _allowed_origin(self) -> str | None:
            origin = self.headers.get("Origin")
            if not origin or not server.cors:
                return None
            return "*" if "*" in server.cors else origin if origin in server.cors else None

        def _cors_headers(self, allowed: str) -> None:
            self.send_header("Access-Control-Allow-Origin", allowed)
            self.send_header("Access-Control-Expose-Headers", "Content-Length, Content-Encoding")

        def _serve(self, send_body: bool) -> None:
            url_path = unquote(urlsplit(self.path).path)
            if url_path.endswith("/"):
                url_path += "index.html"
            located = server.locate(url_path)
            if located is None:
                return self._fail(HTTPStatus.FORBIDDEN, url_path)
            plain, relative = located
            found = server.body(plain, "br" in self.headers.get("Accept-Encoding", ""))
            if found is None:
                return self._fail(HTTPStatus.NOT_FOUND, url_path)
            body, encoding = found
            size = len(body) if isinstance(body, bytes) else body.stat().st_size
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", server.media_type(relative))
            self.send_header("Content-Length", str(size))
            if encoding:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Vary", "Accept-Encoding, Origin" if server.cors else "Accept-Encoding")
            if server.cache_control:
                self.send_header("Cache-Control", server.cache_control)
            allowed = self._allowed_origin()
            if allowed:
                self._cors_headers(allowed)
            for name, value in ISOLATION_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            # Logged before the body goes out: a client that has read the body finds its request
            # in the log (logging after the send raced with tests reading the log).
            record = ServedRequest(url_path, HTTPStatus.OK, encoding, size if send_body else 0)
            server.requests.append(record)
            if send_body:
                try:
                    if isinstance(body, bytes):
                        self.wfile.write(body)
                    else:
                        with body.open("rb") as stream:
                            shutil.copyfileobj(stream, self.wfile, 1 << 20)
                except (BrokenPipeError, ConnectionResetError):
                    record.size = 0  # the page navigated away or was closed mid-transfer

        def _fail(self, status: HTTPStatus, url_path: str) -> None:
            body = f"{status.value} {status.phrase}: {url_path}\n".encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            for name, value in ISOLATION_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            server.requests.append(ServedRequest(url_path, status.value, None, len(body) if self.command != "HEAD" else 0))
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler


@contextmanager
def serve_package(package_dir: Path, extra_mounts: dict[str, Path] | None = None) -> Iterator[str]:
    """Serve `package_dir` on 127.0.0.1 (a free port); yields the base URL, ending with '/'."""
    with running_server(package_dir, extra_mounts) as server:
        yield server.url


@contextmanager
def running_server(package_dir: Path, extra_mounts: dict[str, Path] | None = None, manifest: bytes | None = None) -> Iterator[StaticServer]:
    """Like `serve_package`, yielding the `StaticServer` (its `url` and `requests` log);
    `manifest`: the bytes served as manifest.json instead of the file (StaticServer)."""
    server = StaticServer(package_dir, extra_mounts, manifest=manifest).start()
    try:
        yield server
    finally:
        server.stop()
