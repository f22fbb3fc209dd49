"""`pack serve`: a real server in a child process, fetched over HTTP, stopped with Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import brotli
from typer.testing import CliRunner

from pipeline.cli import app
from process_helpers import interruptible

REPO = Path(__file__).resolve().parent.parent
DEMO_JS = b"export const greeting = 'hello';\n" * 200


def write_package(dist: Path, name: str) -> Path:
    """The parts of a package the server looks at: manifest.json (media types), index.html, and a
    file that ships with a brotli copy."""
    root = dist / name
    root.mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><script type=module src=demo.js></script>\n")
    (root / "demo.js").write_bytes(DEMO_JS)
    (root / "demo.js.br").write_bytes(brotli.compress(DEMO_JS))
    files = {"index.html": {"mediaType": "text/html; charset=utf-8"}, "demo.js": {"mediaType": "text/javascript"}}
    (root / "manifest.json").write_text(json.dumps({"name": name, "files": files}))
    return root


def start(folder: Path, *options: str) -> tuple[subprocess.Popen, list[str]]:
    child = interruptible([sys.executable, "-m", "pipeline.cli", "serve", str(folder), "--port", "0", *options], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = child.stdout.readline()
    assert first.startswith(f"serving {folder} on 127.0.0.1:") and "http" not in first, first + child.stderr.read()  # only URLs that answer are printed
    return child, [first]


def fetch(url: str, accept_br: bool, **headers: str) -> tuple[dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={**headers, **({"Accept-Encoding": "br"} if accept_br else {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(response.headers), response.read()


def test_serve_a_package_as_production_and_stop_on_ctrl_c(tmp_path):
    package = write_package(tmp_path / "dist", "demo")
    child, _ = start(package)
    try:
        line = child.stdout.readline().strip()
        assert line.startswith("demo: http://127.0.0.1:") and line.endswith("/demo/index.html")
        index_url = line.split(": ", 1)[1]
        headers, body = fetch(index_url, accept_br=True)
        assert body.startswith(b"<!doctype html>") and headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin" and headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        js_url = index_url.replace("index.html", "demo.js")
        headers, body = fetch(js_url, accept_br=True)
        assert headers["Content-Encoding"] == "br" and headers["Content-Type"] == "text/javascript"
        assert body == (package / "demo.js.br").read_bytes() and brotli.decompress(body) == DEMO_JS
        headers, body = fetch(js_url, accept_br=False)
        assert "Content-Encoding" not in headers and body == DEMO_JS
    finally:
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=30)
    assert child.returncode == 0, stderr
    assert "Traceback" not in stderr and stdout.strip().endswith("stopped")


def test_serve_an_export_prints_its_manifest_url_and_serves_br_bodies_alone(tmp_path):
    """`pack export` leaves out the demo page and keeps a .br body alone: no URL that answers 404."""
    package = write_package(tmp_path / "web", "demo")
    (package / "index.html").unlink()
    (package / "demo.js").unlink()
    child, _ = start(package)
    try:
        line = child.stdout.readline().strip()
        assert line.startswith("demo: http://127.0.0.1:") and line.endswith("/demo/manifest.json"), line
        headers, body = fetch(line.split(": ", 1)[1], accept_br=True)
        assert json.loads(body)["name"] == "demo"
        headers, body = fetch(line.split(": ", 1)[1].replace("manifest.json", "demo.js"), accept_br=True)
        assert headers["Content-Encoding"] == "br" and brotli.decompress(body) == DEMO_JS
    finally:
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    assert child.returncode == 0


def test_serve_a_folder_of_packages_lists_each(tmp_path):
    dist = tmp_path / "dist"
    write_package(dist, "alpha")
    write_package(dist, "beta")
    child, _ = start(dist)
    try:
        urls = [child.stdout.readline().strip() for _ in range(2)]
        assert [u.split(":", 1)[0] for u in urls] == ["alpha", "beta"]
        headers, body = fetch(urls[1].split(": ", 1)[1].replace("index.html", "demo.js"), accept_br=True)
        assert headers["Content-Encoding"] == "br" and brotli.decompress(body) == DEMO_JS
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=30)
    assert child.returncode == 0


def test_serve_refuses_what_is_not_a_package(tmp_path):
    runner = CliRunner()
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    for target, message in ((model, "is a file, not a package folder"), (tmp_path, "holds no package"), (tmp_path / "nope", "no such folder")):
        result = runner.invoke(app, ["serve", str(target)])
        assert result.exit_code == 2 and message in result.output
        assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error: ")


def test_serve_on_a_busy_port_says_so(tmp_path):
    import socket

    package = write_package(tmp_path / "dist", "demo")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["serve", str(package), "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen there") and "choose another --port" in result.output


def test_serve_cors_allows_the_named_origin_only(tmp_path):
    package = write_package(tmp_path / "dist", "demo")
    child, _ = start(package, "--cors", "http://localhost:5173/")
    try:
        assert child.stdout.readline().strip() == "CORS: pages on http://localhost:5173 may fetch these files"
        url = child.stdout.readline().strip().split(": ", 1)[1].replace("index.html", "demo.js")
        headers, body = fetch(url, accept_br=True, Origin="http://localhost:5173")
        assert headers["Access-Control-Allow-Origin"] == "http://localhost:5173" and "Content-Encoding" in headers["Access-Control-Expose-Headers"]
        assert "Origin" in headers["Vary"] and brotli.decompress(body) == DEMO_JS
        headers, _ = fetch(url, accept_br=True, Origin="https://elsewhere.example")
        assert "Access-Control-Allow-Origin" not in headers
        preflight = urllib.request.Request(url, method="OPTIONS", headers={"Origin": "http://localhost:5173", "Access-Control-Request-Headers": "range"})
        with urllib.request.urlopen(preflight, timeout=30) as response:
            assert response.status == 204 and response.headers["Access-Control-Allow-Headers"] == "range"
    finally:
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    assert child.returncode == 0

    child, _ = start(package, "--cors", "*")
    try:
        child.stdout.readline()
        url = child.stdout.readline().strip().split(": ", 1)[1]
        assert fetch(url, accept_br=False, Origin="https://any.example")[0]["Access-Control-Allow-Origin"] == "*"
    finally:
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)


def test_serve_refuses_an_origin_with_a_path(tmp_path):
    package = write_package(tmp_path / "dist", "demo")
    result = CliRunner().invoke(app, ["serve", str(package), "--cors", "https://app.example.com/page"])
    assert result.exit_code == 2 and result.output.startswith("error: --cors 'https://app.example.com/page': an origin is scheme://host[:port]")
