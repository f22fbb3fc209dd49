"""`pack export --host NAME`: each generated configuration drives the real server it is for (nginx
and Apache from Debian, `serve` from npm), started on a free port as the current user, and the
answers to real requests carry the headers a bucket from `pack publish` would: the .br body under
the decoded name with Content-Encoding: br, immutable caching for content-hashed names, a short
one for the manifest and the loader, the media types browsers insist on, COOP/COEP. Through nginx,
Chromium loads the package cross-origin isolated and runs wasm on more than one thread.

The expected headers are spelled out here from the manifest, not taken from the module that
writes the configurations.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import brotli
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
import host_servers
from build_helpers import conv_model, save

IMMUTABLE = "public, max-age=31536000, immutable"
SHORT = "public, max-age=60, must-revalidate"
STRICT_TYPES = {".wasm": "application/wasm", ".mjs": "text/javascript", ".js": "text/javascript", ".json": "application/json"}
NAME = "tiny-conv"
runner = CliRunner()


def export(*args: str):
    return runner.invoke(app, ["export", *args])


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A tiny model built once (host checks only: the browser stage has its own tests)."""
    folder = tmp_path_factory.mktemp("hosts")
    model = save(conv_model(), folder / f"{NAME}.onnx")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACK_WEBGPU_KERNELS", "off")
        built = runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(folder / "dist")])
    assert built.exit_code == 0, built.output
    return folder / "dist" / NAME


@pytest.fixture
def site():
    """A site root any user can read: Apache refuses to serve as root, so its children run as nobody."""
    folder = Path(tempfile.mkdtemp(prefix="pack-site-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _get(url: str, origin: str | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "br, gzip", **({"Origin": origin} if origin else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _check_package_headers(base: str, app_copy: Path, isolation_on_files: bool = True) -> int:
    """Every file of the export answers with the headers a pack-published bucket gives it; returns how many
    were answered with their .br body."""
    manifest = json.loads((app_copy / "manifest.json").read_text())
    expected = {"manifest.json": ("application/json", SHORT, None, "manifest.json")}
    for path, entry in manifest["files"].items():
        encoded = entry.get("stored") == "br"
        media = STRICT_TYPES.get(Path(path).suffix, entry["mediaType"])
        body = entry["encodings"]["br"]["path"] if encoded else path
        expected[path] = (media, IMMUTABLE if entry["cache"] == "immutable" else SHORT, "br" if encoded else None, body)
    problems = []
    for path, (media, cache, encoding, body) in expected.items():
        status, headers, data = _get(base + path)
        sent = headers.get("content-encoding")
        if encoding is None and sent is not None:
            # a server may compress a file on the fly (serve does): what matters is that it decodes to the file
            data = brotli.decompress(data) if sent == "br" else gzip.decompress(data) if sent == "gzip" else data
            sent = None
        seen = (status, headers.get("content-type"), headers.get("cache-control"), sent, data == (app_copy / body).read_bytes())
        if seen != (200, media, cache, encoding, True):
            problems.append(f"{path}: {seen[:4]}, body {'matches' if seen[4] else 'differs'}; expected {media!r}, {cache!r}, {encoding!r}")
        if isolation_on_files and (headers.get("cross-origin-embedder-policy"), headers.get("cross-origin-resource-policy")) != ("require-corp", "cross-origin"):
            problems.append(f"{path}: COEP/CORP {headers.get('cross-origin-embedder-policy')}/{headers.get('cross-origin-resource-policy')}")
    assert problems == []
    assert any(media == "application/wasm" for media, *_ in expected.values())
    return sum(encoding == "br" for _, _, encoding, _ in expected.values())


def _page_isolated(url: str) -> None:
    status, headers, _ = _get(url)
    assert (status, headers.get("cross-origin-opener-policy"), headers.get("cross-origin-embedder-policy")) == (200, "same-origin", "require-corp")


# --- the command's own answers -------------------------------------------------------------


def test_unknown_host_and_s3_exit_2_naming_the_option_and_write_nothing(package, tmp_path):
    unknown = export(str(package), str(tmp_path / "a"), "--host", "geocities")
    assert unknown.exit_code == 2 and "--host 'geocities'" in unknown.output and "nginx" in unknown.output and "github-pages" in unknown.output
    s3 = export(str(package), str(tmp_path / "b"), "--host", "s3")
    assert s3.exit_code == 2 and len(s3.output.strip().splitlines()) == 1 and "pack publish" in s3.output
    bad_path = export(str(package), str(tmp_path / "d"), "--host", "nginx", "--url-path", "/../x/")
    assert bad_path.exit_code == 2 and "--url-path" in bad_path.output
    alone = export(str(package), str(tmp_path / "e"), "--url-path", "/x/")
    assert alone.exit_code == 2 and "--host" in alone.output
    assert not any(tmp_path.iterdir())


def test_each_config_names_every_file_as_its_host_serves_it(package, tmp_path):
    written = {}
    for host, config in (("netlify", "_headers"), ("cloudflare-pages", "_headers"), ("vercel", "vercel.json"), ("nginx", "nginx.conf"), ("apache", ".htaccess"), ("serve", "serve.json")):
        result = export(str(package), str(tmp_path / host / NAME), "--host", host, "--json")
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        # what a server reads from its own configuration is written beside the served folder, never in it
        where = tmp_path / host / (f"{NAME}.{config}" if host in ("nginx", "serve") else f"{NAME}/{config}")
        assert summary["config"] == str(where.resolve()) and summary["url_path"] == f"/{NAME}/"
        assert (host in ("nginx", "serve")) != (tmp_path / host / NAME / config).exists(), host
        assert summary["bodies"] == "br", host  # brotli bytes on every host
        text = where.read_text()
        manifest = json.loads((tmp_path / host / NAME / "manifest.json").read_text())
        stored = [path for path, entry in manifest["files"].items() if entry.get("stored") == "br"]
        assert stored, host
        if host in ("nginx", "apache"):
            # X answered with X.br and Content-Encoding: br; Apache's .htaccess names files by their base name (<Files>)
            assert all((Path(path).name if host == "apache" else f"/{NAME}/{path}") in text for path in manifest["files"]), host
        elif host == "serve":
            # a rewrite per .br body; header rules by pattern (the real server answers each file: below)
            rewrites = json.loads(text)["rewrites"]
            assert sorted(r["source"] for r in rewrites) == sorted(f"/{NAME}/{path}" for path in stored)
        else:
            # no Content-Encoding there: a rule names X.br (a file of its own that the loader decodes),
            # or its folder; never X (the hosts' own parsers match every URL: below)
            assert not any(re.search(rf"/{NAME}/{re.escape(path)}(?!\.br)\b", text) for path in stored), host
        written[host] = text
    vercel = json.loads(written["vercel"])
    assert {"key": "Cross-Origin-Embedder-Policy", "value": "require-corp"} in vercel["headers"][0]["headers"]
    # github-pages: no configuration, says why, offers the shim
    pages = export(str(package), str(tmp_path / "pages" / NAME), "--host", "github-pages")
    assert pages.exit_code == 0 and "sets no custom headers" in pages.output and "--coi-shim" in pages.output
    # its .br bodies as files of their own: the loader fetches and decodes them (tests/test_assets_chunks_browser.py)
    assert "the loader fetches them as files and decodes them itself" in pages.output
    assert any(path.name.endswith(".br") for path in (tmp_path / "pages" / NAME).rglob("*"))
    assert not any((tmp_path / "pages" / NAME / name).exists() for name in ("_headers", "vercel.json", "nginx.conf", ".htaccess", "serve.json", "coi-serviceworker.js"))


def test_cloudflare_pages_refuses_an_export_over_its_100_rules_naming_the_fix():
    from pipeline.errors import PackError
    from pipeline.publish.hosts import HOSTS, render

    entry = {"sha256": "0" * 64, "size": 1, "mediaType": "application/octet-stream", "cache": "immutable", "encodings": {}}
    manifest = {"name": "big", "files": {f"part.{index:016x}.bin": dict(entry) for index in range(98)}}
    assert render(HOSTS["netlify"], manifest, "/big/").count("/big/part.") == 98  # Netlify documents no such limit
    with pytest.raises(PackError, match=r"101 header rules, over the 100 that Cloudflare Pages reads; export fewer variants \(--variants\)"):
        render(HOSTS["cloudflare-pages"], manifest, "/big/")
    manifest["files"] = dict(list(manifest["files"].items())[:97])
    assert "/big/part." in render(HOSTS["cloudflare-pages"], manifest, "/big/")


def test_cors_goes_only_where_a_host_can_send_it_and_exits_2_naming_the_option(package, tmp_path):
    no_host = export(str(package), str(tmp_path / "a"), "--cors", "https://app.example.com")
    assert no_host.exit_code == 2 and "--cors" in no_host.output and "--host" in no_host.output
    bad = export(str(package), str(tmp_path / "b"), "--host", "nginx", "--cors", "https://app.example.com/path")
    assert bad.exit_code == 2 and "--cors 'https://app.example.com/path'" in bad.output
    pages = export(str(package), str(tmp_path / "c"), "--host", "github-pages", "--cors", "*")
    assert pages.exit_code == 2 and "GitHub Pages takes no configuration" in pages.output
    for host in ("serve", "netlify", "vercel"):  # one Access-Control-Allow-Origin value for everyone
        several = export(str(package), str(tmp_path / host), "--host", host, "--cors", "https://a.example.com,https://b.example.com")
        assert several.exit_code == 2 and len(several.output.strip().splitlines()) == 1 and "give one origin or *" in several.output, several.output
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c", "serve", "netlify", "vercel"))
    # one origin, or *, goes into every host's file; repeated options and comma lists are one list
    for host, config in (("netlify", "_headers"), ("vercel", "vercel.json"), ("serve", "serve.json"), ("nginx", "nginx.conf"), ("apache", ".htaccess")):
        done = export(str(package), str(tmp_path / f"{host}-star"), "--host", host, "--cors", "*", "--json")
        assert done.exit_code == 0, done.output
        text = Path(json.loads(done.stdout)["config"]).read_text()
        assert "Access-Control-Allow-Origin" in text and "*" in text, host
    repeated = runner.invoke(app, ["export", str(package), str(tmp_path / "rep"), "--host", "nginx", "--cors", "https://a.example.com", "--cors", "https://b.example.com", "--json"])
    assert repeated.exit_code == 0 and json.loads(repeated.output)["cors"] == ["https://a.example.com", "https://b.example.com"], repeated.output


# --- real servers ---------------------------------------------------------------------------


@pytest.fixture
def nginx_site(package, site, tmp_path):
    result = export(str(package), str(site / NAME), "--host", "nginx")
    assert result.exit_code == 0, result.output
    with host_servers.nginx(site, [site / "pack-site.nginx.conf", site / f"{NAME}.nginx.conf"], tmp_path) as base:
        yield base, site


def test_nginx_serves_the_export_from_the_generated_snippet(nginx_site):
    base, site = nginx_site
    (site / "index.html").write_text("<!doctype html><title>app</title>")
    assert _check_package_headers(f"{base}{NAME}/", site / NAME) >= 2
    _page_isolated(base + "index.html")
    # X.br asked by its own name (the loader's host probe) says brotli to a client that accepts it,
    # as on Apache and serve, and is the file as it is to one that does not
    manifest = json.loads((site / NAME / "manifest.json").read_text())
    body = next(entry["encodings"]["br"]["path"] for entry in manifest["files"].values() if entry.get("stored") == "br")
    status, headers = _header_counts(f"{base}{NAME}/{body}")
    assert (status, headers.get("content-encoding"), len(headers.get("cross-origin-resource-policy", []))) == (200, ["br"], 1), headers
    status, headers = _header_counts(f"{base}{NAME}/{body}", accept=None)
    assert (status, headers.get("content-encoding")) == (200, None), headers


def test_apache_serves_the_export_from_the_generated_htaccess(package, site, tmp_path):
    result = export(str(package), str(site / NAME), "--host", "apache")
    assert result.exit_code == 0, result.output
    with host_servers.apache(site, tmp_path) as base:
        assert _check_package_headers(f"{base}{NAME}/", site / NAME) >= 2


@pytest.mark.browser
@pytest.mark.network_registry
def test_serve_from_npm_serves_the_export_from_the_generated_serve_json(package, site):
    result = export(str(package), str(site / NAME), "--host", "serve")
    assert result.exit_code == 0, result.output
    (site / "index.html").write_text("<!doctype html><title>app</title>")
    with host_servers.serve(site, site / f"{NAME}.serve.json") as base:
        assert _check_package_headers(f"{base}{NAME}/", site / NAME) >= 2
        _page_isolated(f"{base}index.html")
        # in Chromium: isolated by the served headers, wasm threads, the outputs right
        host_servers.app_page(site)
        _assert_threads_and_outputs(_result(f"{base}?package={NAME}/", isolated=True))  # serve redirects /index.html to /, dropping the query


@pytest.fixture(scope="module")
def many_files(tmp_path_factory) -> Path:
    """A package of about ninety files: 2 MiB of weights in 64 KiB byte-plane chunks, three variants."""
    import numpy as np
    import onnx
    import onnx.helper
    import onnx.numpy_helper

    folder = tmp_path_factory.mktemp("many")
    weights = np.random.default_rng(3).normal(0, 1 / 32, (1024, 512)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "many",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 512])],
        [onnx.numpy_helper.from_array(weights, "w")],
    )
    save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), folder / "many.onnx")
    recipe = folder / "many.toml"
    recipe.write_text('name = "many"\nvariants = ["fp16", "fp16w", "fp32"]\n[source]\nuri = "many.onnx"\n[assets]\nchunk_mib = 0.0625\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACK_WEBGPU_KERNELS", "off")
        built = runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(folder / "dist")])
    assert built.exit_code == 0, built.output
    return folder / "dist" / "many"


@pytest.mark.network_registry
def test_serve_takes_the_config_of_a_package_of_many_files(many_files, site):
    """serve reads at most 50 header rules: its configuration stays under that however many files a
    package has (the rules go by pattern, the rewrites by file), and every file is answered right."""
    result = export(str(many_files), str(site / "many"), "--host", "serve")
    assert result.exit_code == 0, result.output
    manifest = json.loads((site / "many" / "manifest.json").read_text())
    assert len(manifest["files"]) > 80
    assert len(json.loads((site / "many.serve.json").read_text())["headers"]) <= 50
    with host_servers.serve(site, site / "many.serve.json") as base:
        assert _check_package_headers(f"{base}many/", site / "many") > 50


@pytest.mark.network_registry
@pytest.mark.parametrize("built", ["package", "many_files"])
def test_netlify_and_vercel_read_every_rule_from_the_generated_files(built, request, tmp_path):
    """Netlify's own _headers parser and Vercel's own route compiler: each URL gets each header from
    exactly one rule (two would be joined into one value), with the values a bucket would send;
    also where a folder of files that take the same headers has one rule for all."""
    package = request.getfixturevalue(built)
    NAME = package.name  # noqa: N806 - this test's package
    for host in ("netlify", "vercel"):
        result = export(str(package), str(tmp_path / host / NAME), "--host", host)
        assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "netlify" / NAME / "manifest.json").read_text())
    expected = {f"/{NAME}/manifest.json": ("application/json", SHORT)}
    for path, entry in manifest["files"].items():
        cache = IMMUTABLE if entry["cache"] == "immutable" else SHORT
        if entry.get("stored") == "br":  # served as it is, opaque bytes the loader decodes
            expected[f"/{NAME}/{entry['encodings']['br']['path']}"] = ("application/octet-stream", cache)
        else:
            expected[f"/{NAME}/{path}"] = (STRICT_TYPES.get(Path(path).suffix, entry["mediaType"]), cache)
    request = {"headersFile": str(tmp_path / "netlify" / NAME / "_headers"), "vercelFile": str(tmp_path / "vercel" / NAME / "vercel.json"), "urls": ["/index.html", *expected]}
    done = subprocess.run(["node", str(host_servers.HOST_TOOLS / "check_configs.mjs"), str(host_servers.host_tools())], input=json.dumps(request), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout)
    assert answer["errors"] == []
    page = {"cross-origin-opener-policy": ["same-origin"], "cross-origin-embedder-policy": ["require-corp"]}
    for host in ("netlify", "vercel"):
        assert answer[host]["/index.html"] == page, host
        for url, (media, cache) in expected.items():
            assert answer[host][url] == {**page, "cross-origin-resource-policy": ["cross-origin"], "content-type": [media], "cache-control": [cache]}, (host, url)


# --- in Chromium ----------------------------------------------------------------------------

def _result(url: str, isolated: bool) -> dict:
    from pipeline.verify.engines.browser.chromium import launch_browser

    with launch_browser(webgpu=False) as browser:
        return host_servers.page_result(browser, url, isolated)


def _assert_threads_and_outputs(result: dict) -> None:
    assert result["isolated"] is True and result["ep"] == "wasm", result
    # the loader's own plan: every core up to 4, more than one wherever the machine has them
    assert result["threads"] == min(result["cores"], 4) and (result["threads"] > 1 or result["cores"] == 1), result
    assert result["threadsWhy"].startswith("cross-origin isolated"), result
    assert result["passed"] is True, result["text"]


@pytest.mark.browser
def test_chromium_through_nginx_is_isolated_runs_wasm_threads_and_gets_brotli(nginx_site):
    base, site = nginx_site
    host_servers.app_page(site)
    result = _result(f"{base}index.html?package={NAME}/", isolated=True)
    _assert_threads_and_outputs(result)
    # the model came as brotli on the wire and was decoded by the browser
    assert result["onnx"] and all(0 < entry["encoded"] < entry["decoded"] for entry in result["onnx"]), result["onnx"]


@pytest.mark.browser
@pytest.mark.network_registry
def test_coi_shim_isolates_a_page_on_a_plain_static_server(package, site):
    """GitHub Pages' case: a server that sends no COOP/COEP; the shim's service worker adds them."""
    result = export(str(package), str(site / NAME), "--host", "github-pages", "--coi-shim")
    assert result.exit_code == 0, result.output
    assert "coi-serviceworker.js" in result.output
    shutil.copy(site / NAME / "coi-serviceworker.js", site / "coi-serviceworker.js")  # next to the page, as the command says
    host_servers.app_page(site, shim=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_PlainHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _status, headers, _ = _get(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        assert "cross-origin-opener-policy" not in headers  # the server itself sends none
        result = _result(f"http://127.0.0.1:{server.server_address[1]}/index.html?package={NAME}/", isolated=True)
    finally:
        server.shutdown()
    _assert_threads_and_outputs(result)


class _PlainHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class _IsolatedPageHandler(SimpleHTTPRequestHandler):
    """The app's own origin: its pages cross-origin isolated, the package on another origin."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.mark.browser
@pytest.mark.parametrize("host", ["nginx", "apache", pytest.param("serve", marks=pytest.mark.network_registry)])
def test_a_page_on_another_origin_loads_the_export_through_its_cors_headers(package, site, tmp_path, host):
    """The page on one 127.0.0.1 port, the package on another: the host's configuration from
    `--cors` lets the page import the loader and fetch every file, cross-origin isolated (COEP
    accepts CORS answers), wasm on threads. nginx and Apache answer each of several origins with
    itself and a foreign origin with nothing; serve takes one origin."""
    pages = tmp_path / "pages"
    pages.mkdir()
    host_servers.app_page(pages)
    page_server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_IsolatedPageHandler, directory=str(pages)))
    threading.Thread(target=page_server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{page_server.server_address[1]}"
    origins = [origin] if host == "serve" else ["https://app.example.com", origin]
    result = export(str(package), str(site / NAME), "--host", host, "--cors", ",".join(origins))
    assert result.exit_code == 0, result.output
    run = tmp_path / "run"
    run.mkdir()
    servers = {
        "nginx": lambda: host_servers.nginx(site, [site / "pack-site.nginx.conf", site / f"{NAME}.nginx.conf"], run),
        "apache": lambda: host_servers.apache(site, run),
        "serve": lambda: host_servers.serve(site, site / f"{NAME}.serve.json"),
    }
    try:
        with servers[host]() as base:
            url = f"{base}{NAME}/manifest.json"
            _, headers, _ = _get(url, origin)
            assert headers.get("access-control-allow-origin") == origin, headers
            assert "Content-Encoding" in headers.get("access-control-expose-headers", ""), headers
            if host != "serve":
                _, foreign, _ = _get(url, "https://elsewhere.example.com")
                assert "access-control-allow-origin" not in foreign, foreign
                assert "Origin" in headers.get("vary", ""), headers  # answers differ by Origin: caches must know
            page = _result(f"{origin}/index.html?package={base}{NAME}/", isolated=True)
    finally:
        page_server.shutdown()
    _assert_threads_and_outputs(page)


def _header_counts(url: str, accept: str | None = "br, gzip") -> tuple[int, dict[str, list[str]]]:
    """Status and every value of every header, as sent (a header sent twice has two values)."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        connection.request("GET", parts.path, headers={"Accept-Encoding": accept} if accept else {"Accept-Encoding": ""})
        answer = connection.getresponse()
        answer.read()
        values: dict[str, list[str]] = {}
        for name, value in answer.getheaders():
            values.setdefault(name.lower(), []).append(value)
        return answer.status, values
    finally:
        connection.close()


@pytest.mark.browser
@pytest.mark.parametrize("host", ["nginx", "apache"])
def test_two_packages_on_one_site_send_each_header_once_and_the_page_runs_wasm_threads(package, site, tmp_path, host):
    """Two exports under one site's /models/: every answer carries COOP/COEP once (the page is
    cross-origin isolated, wasm on threads), no configuration file is served, and X's brotli body
    goes only to a client that accepts brotli (others get 404 for X and the loader's X.br)."""
    for name in ("first", "second"):
        result = export(str(package), str(site / "models" / name), "--host", host, "--url-path", f"/models/{name}/")
        assert result.exit_code == 0, result.output
    (site / "models").chmod(0o755)
    if host == "apache":  # the pages' folder takes the two lines, as the .htaccess says
        (site / ".htaccess").write_text("Header always set Cross-Origin-Opener-Policy \"same-origin\"\nHeader always set Cross-Origin-Embedder-Policy \"require-corp\"\n")
    else:
        assert not any(path.name.endswith("nginx.conf") for path in (site / "models").rglob("*") if path.parent != site / "models")
    host_servers.app_page(site)
    manifest = json.loads((site / "models" / "first" / "manifest.json").read_text())
    encoded = next(path for path, entry in manifest["files"].items() if entry.get("stored") == "br" and path.endswith(".onnx"))
    run = tmp_path / "run"
    run.mkdir()
    snippets = [site / "models" / "pack-site.nginx.conf", site / "models" / "first.nginx.conf", site / "models" / "second.nginx.conf"]
    server = host_servers.nginx(site, snippets, run) if host == "nginx" else host_servers.apache(site, run)
    with server as base:
        for url in (f"{base}index.html", f"{base}models/second/manifest.json", f"{base}models/first/{encoded}", f"{base}models/second/loader.js"):
            status, headers = _header_counts(url)
            assert status == 200, url
            assert headers.get("cross-origin-opener-policy") == ["same-origin"] and headers.get("cross-origin-embedder-policy") == ["require-corp"], (url, headers)
        status, headers = _header_counts(f"{base}models/first/{encoded}")
        assert headers.get("content-encoding") == ["br"] and headers.get("cross-origin-resource-policy") == ["cross-origin"], headers
        status, headers = _header_counts(f"{base}models/first/{encoded}", accept=None)
        assert status == 404 and "content-encoding" not in headers, (status, headers)
        assert _header_counts(f"{base}models/first/{encoded}.br", accept=None)[0] == 200
        if host == "nginx":
            for config in ("models/first.nginx.conf", "models/pack-site.nginx.conf", "models/first/nginx.conf"):
                assert _header_counts(base + config)[0] == 404, config
        page = _result(f"{base}index.html?package=models/second/", isolated=True)
    _assert_threads_and_outputs(page)
