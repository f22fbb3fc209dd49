"""The static server serves a package the way production does (no browser needed)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import brotli
import pytest

from pipeline.package_server import running_server, serve_package


def _get(url: str, accept_br: bool = True, method: str = "GET"):
    request = urllib.request.Request(url, method=method, headers={"Accept-Encoding": "gzip, deflate, br"} if accept_br else {})
    with urllib.request.urlopen(request) as response:
        return response.status, dict(response.headers), response.read()


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    (root / "ort").mkdir(parents=True)
    model = b"\x08\x07" * 5000
    (root / "model.fp32.0123456789abcdef.onnx").write_bytes(model)
    (root / "model.fp32.0123456789abcdef.onnx.br").write_bytes(brotli.compress(model))
    (root / "ort" / "ort.webgpu.bundle.min.aaaa.mjs").write_text("export const x = 1;\n")
    (root / "ort" / "ort-wasm.bbbb.wasm.br").write_bytes(brotli.compress(b"\0asm\1\0\0\0"))  # only the encoded copy
    (root / "custom.dat").write_bytes(b"abc")
    (root / "manifest.json").write_text(json.dumps({"files": {"custom.dat": {"mediaType": "application/x-custom"}}}))
    (root / "index.html").write_text("<!doctype html>")
    return root


def test_brotli_copy_served_under_decoded_name_with_content_encoding(package: Path) -> None:
    with running_server(package) as server:
        status, headers, body = _get(server.url + "model.fp32.0123456789abcdef.onnx")
        assert status == 200
        assert headers["Content-Encoding"] == "br"
        assert brotli.decompress(body) == (package / "model.fp32.0123456789abcdef.onnx").read_bytes()
        assert int(headers["Content-Length"]) == (package / "model.fp32.0123456789abcdef.onnx.br").stat().st_size
        assert server.requests[-1].encoding == "br"


def test_plain_bytes_when_client_does_not_accept_br(package: Path) -> None:
    with serve_package(package) as url:
        _, headers, body = _get(url + "model.fp32.0123456789abcdef.onnx", accept_br=False)
    assert "Content-Encoding" not in headers
    assert body == (package / "model.fp32.0123456789abcdef.onnx").read_bytes()


def test_encoded_only_object_is_served_like_a_bucket_does(package: Path) -> None:
    with serve_package(package) as url:
        _, headers, body = _get(url + "ort/ort-wasm.bbbb.wasm")
    assert headers["Content-Type"] == "application/wasm"
    assert headers["Content-Encoding"] == "br"
    assert brotli.decompress(body) == b"\0asm\1\0\0\0"


def test_media_types_and_cross_origin_isolation(package: Path) -> None:
    with serve_package(package) as url:
        _, module_headers, _ = _get(url + "ort/ort.webgpu.bundle.min.aaaa.mjs")
        _, custom_headers, _ = _get(url + "custom.dat")
        _, index_headers, _ = _get(url)
    assert module_headers["Content-Type"] == "text/javascript"
    assert custom_headers["Content-Type"] == "application/x-custom"  # the manifest's mediaType wins
    assert index_headers["Content-Type"].startswith("text/html")
    for headers in (module_headers, custom_headers, index_headers):
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert headers["Cross-Origin-Resource-Policy"] == "cross-origin"


def test_head_sends_headers_only(package: Path) -> None:
    with serve_package(package) as url:
        status, headers, body = _get(url + "custom.dat", method="HEAD")
    assert (status, headers["Content-Length"], body) == (200, "3", b"")


def test_missing_file_is_404_and_escapes_are_refused(package: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("no")
    with serve_package(package) as url:
        with pytest.raises(urllib.error.HTTPError) as missing:
            _get(url + "nope.onnx")
        with pytest.raises(urllib.error.HTTPError) as escape:
            _get(url + "%2e%2e/secret.txt")
    assert missing.value.code == 404
    assert escape.value.code == 403


def test_extra_mount_serves_its_folder_under_its_prefix_only(package: Path, tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "harness.html").write_text("<p>harness</p>")
    with serve_package(package, {"/__pack__/": assets}) as url:
        _, headers, body = _get(url + "__pack__/harness.html")
        with pytest.raises(urllib.error.HTTPError) as not_in_package:
            _get(url + "harness.html")
    assert body == b"<p>harness</p>" and headers["Content-Type"].startswith("text/html")
    assert not_in_package.value.code == 404


def test_a_manifest_in_memory_is_served_as_the_file_would_be(package: Path, tmp_path: Path) -> None:
    """`pack build` serves its browser stage the manifest from memory (no manifest.json written
    before the end of the build): same headers as the file, its media types used, the file on disk
    (if any) shadowed, nothing under another mount replaced."""
    with running_server(package) as server:
        _, from_disk, _ = _get(server.url + "manifest.json")
    in_memory = json.dumps({"files": {"custom.dat": {"mediaType": "application/x-in-memory"}}}).encode()
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "manifest.json").write_text('{"other": true}')
    for folder in (package, tmp_path / "empty"):  # over a package folder with and without manifest.json
        folder.mkdir(exist_ok=True)
        with running_server(folder, {"/__pack__/": assets}, manifest=in_memory) as server:
            status, headers, body = _get(server.url + "manifest.json")
            head_status, head_headers, head_body = _get(server.url + "manifest.json", method="HEAD")
            _, _, mounted = _get(server.url + "__pack__/manifest.json")
            custom = _get(server.url + "custom.dat")[1]["Content-Type"] if folder == package else None
            assert server.requests[0].path == "/manifest.json" and server.requests[0].size == len(in_memory)
        assert (status, body) == (200, in_memory)
        assert (head_status, head_headers["Content-Length"], head_body) == (200, str(len(in_memory)), b"")
        same = ("Content-Type", "Cache-Control", "Vary", "Cross-Origin-Opener-Policy", "Cross-Origin-Embedder-Policy", "Cross-Origin-Resource-Policy")
        assert {k: headers[k] for k in same} == {k: from_disk[k] for k in same} and "Content-Encoding" not in headers
        assert headers["Content-Length"] == str(len(in_memory))
        assert mounted == b'{"other": true}'
        assert custom in (None, "application/x-in-memory")  # the served manifest's media types
