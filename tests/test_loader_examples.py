"""The integration examples of docs/examples/ run as a web developer runs them, against the S3 test
server as the CDN: GTCRN built by `pack build gtcrn` and published with `pack publish --cors`, then
- html/: a page with no build step on another origin imports loader.js from the bucket by URL;
- vite/: `npm install <package>` into the Vite + TypeScript app, strict `tsc`, `vite build` (the
  bundle holds the loader only: no model, no onnxruntime-web), `vite preview` and the dev server,
  each opened in headless Chromium; the loader finds the package by `baseUrl`.
Chromium runs without WebGPU here: these tests are about the way into an app, and GTCRN on
SwiftShader's WebGPU takes ~10 s a page (the EP choice has its own tests).

Needs npm (vite and typescript at the versions docs/examples/vite/package-lock.json pins; the
installed node_modules are cached under PACK_CACHE_DIR) and the GTCRN package from PyPI.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.verify.engines.browser.chromium import launch_browser
from npm_helpers import locked_node_modules, npm
from publish_helpers import isolate_aws_env, new_bucket, run_json, use_test_credentials

pytestmark = [pytest.mark.browser, pytest.mark.network_registry]

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
VITE = EXAMPLES / "vite"


@pytest.fixture(scope="module")
def browser():
    with launch_browser(webgpu=False) as launched:
        yield launched


@pytest.fixture(scope="module")
def published(s3_server, tmp_path_factory) -> dict:
    """GTCRN built (host-verified; the browser checks have their own tests) and published to a
    public bucket that lets any origin fetch it."""
    dist = tmp_path_factory.mktemp("dist")
    with pytest.MonkeyPatch.context() as patch:
        isolate_aws_env(patch, dist)
        use_test_credentials(patch)
        patch.setenv("PACK_WEBGPU_KERNELS", "off")
        built = CliRunner().invoke(app, ["build", "gtcrn", "--no-browser", "--out", str(dist)])
        assert built.exit_code == 0, built.output
        bucket = new_bucket(s3_server)
        s3_server.client().put_bucket_policy(Bucket=bucket, Policy=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}],
        }))
        run_json(str(dist), "--bucket", bucket, "--endpoint-url", s3_server.url, "--cors", "*")
    return {"package": dist / "gtcrn", "url": f"{s3_server.url}/{bucket}/gtcrn/"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _open(browser, url: str, on_worker=None) -> dict:
    """Opens `url` and returns what the example page put in window.example; `on_worker` is called
    with each Worker the page starts."""
    page = browser.new_context().new_page()
    errors: list[str] = []
    console: list[str] = []
    if on_worker:
        page.on("worker", on_worker)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    try:
        page.goto(url)
        try:
            page.wait_for_function("window.example", timeout=120_000)
        except Exception as error:
            raise AssertionError(f"{url}: {page.inner_text('body')}; console: {console[-10:]}") from error
        result = page.evaluate("window.example")
        result["text"] = page.inner_text("#status")
        result["console"] = console
    finally:
        page.context.close()
    assert not errors, errors
    return result


def _assert_ran(result: dict) -> None:
    assert result["ok"], result
    # GTCRN's four outputs for one streaming frame
    assert result["outputs"]["enh"] == [1, 257, 1, 2], result
    assert set(result["outputs"]) == {"enh", "conv_cache_out", "tra_cache_out", "inter_cache_out"}


def test_plain_html_page_imports_the_loader_from_the_cdn(browser, published, tmp_path):
    site = shutil.copytree(EXAMPLES / "html", tmp_path / "site")
    # Strict tsc on app.js against the package's own loader.d.ts.
    config = {"extends": "./tsconfig.json", "compilerOptions": {"paths": {"gtcrn": [str(published["package"] / "loader.d.ts")]}}}
    (site / "tsconfig.test.json").write_text(json.dumps(config))
    _tsc(site / "tsconfig.test.json")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = _open(browser, f"http://127.0.0.1:{server.server_address[1]}/index.html?package={published['url']}")
    finally:
        server.shutdown()
    _assert_ran(result)
    assert "first result in" in result["text"]
    # a static server without COOP/COEP: one thread, said in info and once in the console
    assert result["threads"] == 1 and result["threadsWhy"].startswith("the page is not cross-origin isolated"), result
    single = [line for line in result["console"] if line.startswith("warning: [pack] wasm runs on 1 thread")]
    assert len(single) == 1, result["console"]


def test_the_whole_model_runs_in_the_apps_worker(browser, published, tmp_path):
    """docs/examples/worker: the page starts its own module Worker, which imports the loader from
    the CDN, loads and runs the model; the page only exchanges messages (progress, the outputs)."""
    site = shutil.copytree(EXAMPLES / "worker", tmp_path / "site")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers: list[str] = []
    try:
        result = _open(browser, f"http://127.0.0.1:{server.server_address[1]}/index.html?package={published['url']}", on_worker=lambda w: workers.append(w.url))
    finally:
        server.shutdown()
    _assert_ran(result)
    assert result["inWorker"] is True and result["info"]["ep"] == "wasm", result
    assert workers[0].endswith("/model.worker.js"), workers
    assert "in a Worker: first result in" in result["text"]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


# --- Vite ----------------------------------------------------------------------------------


def _cached_node_modules() -> Path:
    """vite + typescript as package-lock.json pins them."""
    return locked_node_modules(VITE, "examples/vite-", "vite")


def _copy_tree(source: Path, target: Path) -> None:
    # Hard links: a copy of node_modules in well under a second.
    if subprocess.run(["cp", "-al", str(source), str(target)], capture_output=True).returncode != 0:
        shutil.copytree(source, target, symlinks=True)


def _tsc(config: Path) -> None:
    tsc = _cached_node_modules() / "typescript" / "bin" / "tsc"
    done = subprocess.run(["node", str(tsc), "-p", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def vite_app(published, tmp_path_factory) -> Path:
    """docs/examples/vite with the package installed the way its README says: npm install <folder>."""
    root = tmp_path_factory.mktemp("vite") / "app"
    shutil.copytree(VITE, root, ignore=shutil.ignore_patterns("node_modules", "dist"))
    _copy_tree(_cached_node_modules(), root / "node_modules")
    (root / "node_modules" / ".package-lock.json").unlink(missing_ok=True)  # npm rewrites it; keep the cache's own
    npm("install", "--no-audit", "--no-fund", "--prefer-offline", str(published["package"]), cwd=root)
    return root


def _vite_env(published) -> dict:
    return {**os.environ, "VITE_PACK_BASE_URL": published["url"], "NO_COLOR": "1"}


class _Running:
    """A vite server (dev or preview) in the background until the block ends."""

    def __init__(self, root: Path, env: dict, *args: str):
        self.port = _free_port()
        vite = root / "node_modules" / "vite" / "bin" / "vite.js"
        self.process = subprocess.Popen(["node", str(vite), *args, "--port", str(self.port), "--strictPort", "--host", "127.0.0.1"],
                                        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stdout.read()
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError(f"vite {' '.join(args)} did not listen on {self.port}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def test_vite_app_types_builds_with_only_the_loader_and_runs_in_dev_and_preview(browser, published, vite_app):
    # npm install <folder> gave `import { load } from 'gtcrn'` (package.json exports); strict tsc passes.
    assert json.loads((vite_app / "package.json").read_text())["dependencies"]["gtcrn"].startswith("file:")
    _tsc(vite_app / "tsconfig.json")
    env = _vite_env(published)
    build = subprocess.run(["node", str(vite_app / "node_modules" / "vite" / "bin" / "vite.js"), "build"], cwd=vite_app, env=env,
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    shipped = sorted(p.relative_to(vite_app / "dist").as_posix() for p in (vite_app / "dist").rglob("*") if p.is_file())
    # The app's page, its script (the loader bundled with the app) and the loader's helper Worker;
    # nothing of the model or runtime.
    assert len(shipped) == 3 and shipped[2] == "index.html", shipped
    assert shipped[0].startswith("assets/index-") and shipped[1].startswith("assets/worker-") and shipped[1].endswith(".js"), shipped
    script = (vite_app / "dist" / shipped[0]).read_bytes()
    assert len(script) < 90_000, len(script)  # the loader with its decision checks: 82.6 kB (2026-12-03)
    assert b"InferenceSession.create" in script  # the loader's own code is there...
    assert b"ort-wasm" not in script and b"onnxruntime-web/dist" not in script  # ...and no runtime
    with _Running(vite_app, env, "preview") as preview:
        built = _open(browser, preview.url)
    with _Running(vite_app, env) as dev:
        dev_result = _open(browser, dev.url)
    _assert_ran(built)
    _assert_ran(dev_result)
    # vite.config.ts sends COOP/COEP in dev and preview: cross-origin isolated, wasm on every core (up to 4), no warning
    for result in (built, dev_result):
        assert result["info"]["threads"] > 1 and result["info"]["threadsWhy"].startswith("cross-origin isolated: "), result["info"]
        assert not [line for line in result["console"] if "wasm runs on 1 thread" in line], result["console"]


# Vite's default build injects the modulepreload polyfill (it touches `document`) into the entry
# chunk; this config leaves it out, so a worker that started the entry chunk would run the app.
_NO_POLYFILL_CONFIG = """import { defineConfig, mergeConfig } from 'vite';
import base from './vite.config';
export default mergeConfig(base, defineConfig({ build: { outDir: 'dist-no-polyfill', modulePreload: { polyfill: false } } }));
"""


class _LoggingHandler(SimpleHTTPRequestHandler):
    """A static host that serves files as they are (so the loader decodes `.br` bodies in its
    helper Worker) and records every path asked for."""

    requests: list[str]

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        self.requests.append(self.path)


@pytest.mark.parametrize("polyfill", [True, False], ids=["modulepreload-polyfill", "no-polyfill"])
def test_vite_build_starts_the_loaders_own_worker_never_the_app_chunk(browser, published, vite_app, tmp_path, polyfill):
    # The package beside the app on a plain host: `pack export` keeps the .br bodies, the host
    # serves them as files, so the loader decodes them with the package's decoder in its Worker.
    exported = CliRunner().invoke(app, ["export", str(published["package"]), str(tmp_path / "gtcrn")])
    assert exported.exit_code == 0, exported.output
    args = [] if polyfill else ["--config", "vite.no-polyfill.config.ts"]
    (vite_app / "vite.no-polyfill.config.ts").write_text(_NO_POLYFILL_CONFIG)
    out = vite_app / ("dist" if polyfill else "dist-no-polyfill")
    env = {**_vite_env(published), "VITE_PACK_BASE_URL": "/models/gtcrn/"}
    build = subprocess.run(["node", str(vite_app / "node_modules" / "vite" / "bin" / "vite.js"), "build", *args], cwd=vite_app, env=env,
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    site = shutil.copytree(out, tmp_path / "site")
    shutil.copytree(tmp_path / "gtcrn", site / "models" / "gtcrn")
    scripts = sorted(p.name for p in (site / "assets").glob("*.js"))
    entry = [name for name in scripts if name.startswith("index-")]
    worker = [name for name in scripts if name.startswith("worker-")]
    # the app's chunk and the loader's worker chunk, which holds the decoder glue, not the app
    assert len(entry) == 1 and len(worker) == 1 and len(scripts) == 2, scripts
    worker_code = (site / "assets" / worker[0]).read_text()
    assert "querySelector" not in worker_code and "MutationObserver" not in worker_code, worker_code[:2000]
    assert (b"MutationObserver" in (site / "assets" / entry[0]).read_bytes()) == polyfill  # the polyfill watches for <link>s

    handler = type("Handler", (_LoggingHandler,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers: list[str] = []
    try:
        page_url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
        result = _open(browser, page_url, on_worker=lambda started: workers.append(started.url))
    finally:
        server.shutdown()
    _assert_ran(result)
    # .br bodies decoded in the loader's own Worker: its chunk started, the app's chunk never did
    assert result["decodedIn"] == ["worker"], result
    # (one per load's decoding: it closes 2 s after its last body, and a later file starts another)
    assert workers and {url.rsplit("/", 1)[-1] for url in workers} == {worker[0]}, workers
    assert handler.requests.count(f"/assets/{entry[0]}") == 1, handler.requests
    assert handler.requests.count("/models/gtcrn/manifest.json") == 1, handler.requests


# --- webpack -------------------------------------------------------------------------------

WEBPACK = EXAMPLES / "webpack"


def test_webpack_build_emits_the_loaders_worker_and_runs(browser, published, tmp_path):
    """docs/examples/webpack: `npm install <package>`, `webpack` (production), the built app and
    the exported package on one plain host: webpack emits the loader's helper Worker as a chunk of
    its own (never the app's), which decodes the `.br` bodies; the outputs are right."""
    app_root = tmp_path / "app"
    shutil.copytree(WEBPACK, app_root, ignore=shutil.ignore_patterns("node_modules", "dist"))
    _copy_tree(locked_node_modules(WEBPACK, "examples/webpack-", "webpack"), app_root / "node_modules")
    (app_root / "node_modules" / ".package-lock.json").unlink(missing_ok=True)
    npm("install", "--no-audit", "--no-fund", "--prefer-offline", str(published["package"]), cwd=app_root)
    built = subprocess.run(["node", str(app_root / "node_modules" / "webpack-cli" / "bin" / "cli.js")], cwd=app_root, capture_output=True, text=True, timeout=180)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    scripts = sorted(p.name for p in (app_root / "dist").glob("*.js"))
    app_script = [name for name in scripts if name.startswith("app.")]
    assert len(app_script) == 1 and len(scripts) == 2, scripts  # the app and the loader's worker chunk
    worker_chunk = next(name for name in scripts if name not in app_script)
    assert "querySelector" not in (app_root / "dist" / worker_chunk).read_text()
    exported = CliRunner().invoke(app, ["export", str(published["package"]), str(tmp_path / "gtcrn")])
    assert exported.exit_code == 0, exported.output
    site = shutil.copytree(app_root / "dist", tmp_path / "site")
    shutil.copytree(tmp_path / "gtcrn", site / "models" / "gtcrn")
    (site / "index.html").write_text((WEBPACK / "index.html").read_text().replace("APP_SCRIPT", app_script[0]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers: list[str] = []
    try:
        result = _open(browser, f"http://127.0.0.1:{server.server_address[1]}/index.html?package=/models/gtcrn/", on_worker=lambda w: workers.append(w.url))
    finally:
        server.shutdown()
    _assert_ran(result)
    assert result["decodedIn"] == ["worker"], result
    assert workers and {url.rsplit("/", 1)[-1] for url in workers} == {worker_chunk}, workers
