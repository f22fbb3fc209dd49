"""A chunked, byte-plane-coded package through loader.js in headless Chromium (SwiftShader WebGPU
and wasm): the same outputs as the one-file package, chunks fetched in parallel, a cut connection
resumed from the failed chunk only, a corrupted chunk caught by its hash; the same for fp16w,
whose fp16 chunks the loader widens into place (about half of fp32's bytes on the wire).

Both packages come from `pack build` of one small model (tests/conftest.py chunked_packages)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX
from pipeline.package_server import running_server
from static_helpers import first_visit, plain_static_server

pytestmark = pytest.mark.browser

# Counts the chunk downloads the page has open at once (fetch called, response not yet in).
COUNT_CHUNK_FETCHES = """
(() => {
  const realFetch = window.fetch;
  let open = 0;
  window.__chunkFetches = { peak: 0, calls: 0 };
  window.fetch = async function (input, init) {
    const chunk = String((input && input.url) || input).includes('.part');
    if (chunk) { open += 1; window.__chunkFetches.calls += 1; window.__chunkFetches.peak = Math.max(window.__chunkFetches.peak, open); }
    try { return await realFetch.call(this, input, init); } finally { if (chunk) open -= 1; }
  };
})();
"""


def manifest_of(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def chunk_files(package: Path, variant: str = "fp32") -> list[str]:
    return [c["file"] for c in manifest_of(package)["variants"][variant]["externalData"]["chunks"]]


def load(browser, server, options: dict, *, init_script: str | None = None, route=None, run: bool = True, more: tuple = ()):
    """LOAD_AND_RUN in a fresh context; `more` are further (base URL, options) loads in the same page."""
    context = browser.new_context()
    try:
        if init_script:
            context.add_init_script(init_script)
        page = context.new_page()
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url.rsplit("/", 1)[-1]))
        if route:
            page.route("**/*.part*", route)
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        result = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": options, "run": run})
        result["requested"] = requested
        if init_script:
            result["chunkFetches"] = page.evaluate("window.__chunkFetches")
        result["more"] = [page.evaluate(LOAD_AND_RUN, {"base": base, "options": opts, "run": run}) for base, opts in more]
        return result
    finally:
        context.close()


SINGLE = "/single/"  # the one-file package, mounted beside the chunked one (one origin: one page loads both)


@pytest.fixture(scope="module")
def server(chunked_packages, pages):
    with running_server(chunked_packages["chunked"], {TEST_PREFIX: pages, SINGLE: chunked_packages["single"]}) as running:
        yield running


@pytest.mark.parametrize("ep", ["wasm", "webgpu"])
def test_chunked_outputs_equal_the_one_file_package_and_chunks_download_in_parallel(browser, server, ep):
    """On wasm the connection of one chunk is also cut once: that chunk alone is fetched again."""
    chunked, single = server, server.url + SINGLE[1:]
    parts = chunk_files(Path(chunked.root))
    cut, state = parts[1], {"cut": 0}

    def cut_once(route):
        if ep == "wasm" and route.request.url.endswith(cut) and state["cut"] == 0:
            state["cut"] += 1
            route.abort("connectionreset")
        else:
            route.continue_()

    mark = len(chunked.requests)
    options = {"executionProviders": [ep], "variant": "fp32", "prewarm": False}
    # wasm also runs fp16, whose chunks are coded in two byte planes (SwiftShader has no shader-f16)
    more = [(single, options)] + ([(chunked.url, {**options, "variant": "fp16"}), (single, {**options, "variant": "fp16"})] if ep == "wasm" else [])
    ours = load(browser, chunked, options, init_script=COUNT_CHUNK_FETCHES, route=cut_once, more=more)
    assert ours["ok"], ours
    assert all(other["ok"] for other in ours["more"]), ours["more"]
    theirs = ours["more"][0]
    assert ours["info"]["ep"] == theirs["info"]["ep"] == ep
    assert ours["outputs"]["y"]["bytes"] == theirs["outputs"]["y"]["bytes"]
    if ep == "wasm":
        assert {c["coding"]["planes"] for c in manifest_of(Path(chunked.root))["variants"]["fp16"]["externalData"]["chunks"]} == {2}
        assert ours["more"][1]["info"]["variant"] == "fp16"
        assert ours["more"][1]["outputs"]["y"]["bytes"] == ours["more"][2]["outputs"]["y"]["bytes"]
    # every fp32 chunk served once, brotli-encoded, and more than one was open at a time
    served = [r for r in chunked.requests[mark:] if r.path.lstrip("/") in parts]
    assert sorted(r.path.lstrip("/") for r in served) == sorted(parts)
    assert {r.encoding for r in served} == {"br"}
    assert ours["chunkFetches"]["peak"] >= 2, ours["chunkFetches"]
    # the cut chunk was requested again, alone; the others were not refetched
    requested = Counter(name for name in ours["requested"] if name in parts)
    retries = [(e["file"], e["attempt"]) for e in ours["events"] if e["type"] == "retry"]
    if ep == "wasm":
        assert state["cut"] == 1
        assert requested == Counter({cut: 2, **{p: 1 for p in parts if p != cut}}), requested
        assert retries == [(cut, 1)]
    else:
        assert requested == Counter(parts) and retries == []
    # progress counts the bytes of the graph and every chunk, against the manifest's sizes
    manifest = manifest_of(Path(chunked.root))
    last = ours["progress"][-1]
    assert last["loaded"] == last["total"]
    assert last["total"] >= sum(manifest["files"][f]["size"] for f in parts) + manifest["files"][manifest["variants"]["fp32"]["model"]]["size"]


def wire_bytes(result: dict, manifest: dict, variant: str) -> int:
    """Bytes on the wire (Content-Length: the brotli body) of a load's downloads of a variant's files."""
    spec = manifest["variants"][variant]
    files = {spec["model"], *(c["file"] for c in spec["externalData"]["chunks"])}
    downloads = [e for e in result["events"] if e["type"] == "download" and e["file"] in files]
    assert {e["file"] for e in downloads} == files, downloads
    return sum(e["wireBytes"] for e in downloads)


@pytest.mark.parametrize("ep", ["wasm", "webgpu"])
def test_chunked_fp16w_equals_the_one_file_fp16w_with_half_the_bytes_of_fp32(browser, server, ep):
    """fp16w in chunks: widened chunk by chunk into place in a Worker, the same outputs as the
    one-file fp16w package (widened whole, in a Worker), and about half of fp32's bytes on the wire."""
    chunked, single = server, server.url + SINGLE[1:]
    manifest = manifest_of(Path(chunked.root))
    assert manifest["variants"]["fp16w"]["externalData"]["widened"]
    options = {"executionProviders": [ep], "variant": "fp16w", "prewarm": False}
    ours = load(browser, chunked, options, more=[(single, options), (chunked.url, {**options, "variant": "fp32"})])
    assert ours["ok"], ours
    assert all(other["ok"] for other in ours["more"]), ours["more"]
    theirs, fp32 = ours["more"]
    assert (ours["info"]["ep"], ours["info"]["variant"]) == (theirs["info"]["ep"], theirs["info"]["variant"]) == (ep, "fp16w")
    assert ours["outputs"]["y"]["bytes"] == theirs["outputs"]["y"]["bytes"]
    widen = [e for e in ours["events"] if e["type"] == "widen"]
    # 3 in the chunks, b1 in the graph; chunks and graph widened in the page's Worker
    assert [(e["variant"], e["where"], e["tensors"], e.get("why")) for e in widen] == [("fp16w", "worker", 4, None)], widen
    assert widen[0]["bytes"] > manifest["variants"]["fp16w"]["externalData"]["widened"]["size"]
    assert [e["where"] for e in theirs["events"] if e["type"] == "widen"] == ["worker"]
    ratio = wire_bytes(ours, manifest, "fp16w") / wire_bytes(fp32, manifest, "fp32")
    assert 0.45 < ratio < 0.55, ratio


# The loader's widening Worker fails: its script throws as it loads (as under a CSP that forbids
# it). onnxruntime-web's own thread Workers are left alone.
BROKEN_WORKER = """
window.__chunkFetches = null;
const RealWorker = window.Worker;
window.Worker = function (url, options) {
  if (!options || options.name !== 'pack-widen') return new RealWorker(url, options);
  return new RealWorker('data:text/javascript,throw new Error("no worker here")', options);
};
"""


def test_chunked_fp16w_widens_on_the_main_thread_when_the_worker_fails(browser, server):
    """The Worker fails after chunks were sent to it: they are widened here instead, to the same outputs."""
    options = {"executionProviders": ["wasm"], "variant": "fp16w", "prewarm": False}
    broken = load(browser, server, options, init_script=BROKEN_WORKER)
    working = load(browser, server, options)
    assert broken["ok"] and working["ok"], (broken, working)
    assert broken["outputs"]["y"]["bytes"] == working["outputs"]["y"]["bytes"]
    widen = [e for e in broken["events"] if e["type"] == "widen"]
    assert [(e["where"], e["tensors"]) for e in widen] == [("main thread", 4)], widen
    assert widen[0]["why"].startswith("worker failed to start"), widen


@pytest.mark.parametrize("variant", ["fp32", "fp16w"])
def test_a_corrupted_chunk_is_caught_by_its_hash(browser, chunked_packages, pages, tmp_path, variant):
    package = shutil.copytree(chunked_packages["chunked"], tmp_path / "corrupt")
    bad = chunk_files(package, variant)[-1]
    data = bytearray((package / bad).read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, one bit changed
    (package / bad).write_bytes(bytes(data))
    (package / f"{bad}.br").unlink()
    with running_server(package, {TEST_PREFIX: pages}) as server:
        result = load(browser, server, {"executionProviders": ["wasm"], "variant": variant}, run=False)
    assert not result["ok"]
    assert result["name"] == "PackIntegrityError", result
    assert f"{bad}: sha256 mismatch" in result["message"] and "re-publish" in result["message"]
    assert Counter(result["requested"])[bad] == 1  # an integrity failure is not retried


def test_an_export_with_br_bodies_alone_loads_to_the_same_outputs(browser, server, chunked_packages, pages, tmp_path):
    """`pack export --bodies br` keeps each .br body alone (served under the decoded name with
    Content-Encoding: br, as pack serve and a configured host do): the loader runs it unchanged."""
    from pipeline.publish.export import export_package

    exported = export_package(chunked_packages["chunked"], tmp_path / "app", None, bodies="br")
    app = exported.destination
    assert all((app / path).is_file() != (app / f"{path}.br").is_file() for path in manifest_of(app)["files"])  # one body each
    options = {"executionProviders": ["wasm"], "variant": "fp32", "prewarm": False}
    with running_server(tmp_path / "app", {TEST_PREFIX: pages}) as app_server:
        ours = load(browser, app_server, options)
        served = {r.path.lstrip("/"): r.encoding for r in app_server.requests}
    theirs = load(browser, server, options)
    assert ours["ok"] and theirs["ok"], (ours, theirs)
    assert ours["outputs"]["y"]["bytes"] == theirs["outputs"]["y"]["bytes"]
    assert {served[part] for part in chunk_files(tmp_path / "app")} == {"br"}


def test_a_plain_static_host_moves_brotli_bytes_too(browser, chunked_packages, pages, tmp_path):
    """The default export (one .br body where there is one) on python's http.server, which serves
    `.br` files as they are (also with a single-page app's fallback to index.html for unknown
    paths), and on pack serve's server, which decodes them for the browser: the
    same outputs, and the plain host's first visit moves at most 1.15x the brotli host's bytes (the
    loader probes the host once, fetches the .br bodies and decodes them with the package's decoder
    in its Worker: Chromium has no DecompressionStream('brotli')). A raw export has nothing to
    decode and ships no decoder."""
    from pipeline.publish.export import export_package

    root = tmp_path / "site"
    export_package(chunked_packages["chunked"], root / "app", None)
    shutil.copytree(pages, root / TEST_PREFIX.strip("/"))
    manifest = manifest_of(root / "app")
    decoder = manifest["runtime"]["decoder"]
    assert decoder["package"] == "brotli-dec-wasm" and not manifest["files"][decoder["wasm"]]["encodings"]
    options = {"executionProviders": ["wasm"], "variant": "fp32", "prewarm": False}
    with plain_static_server(root) as plain:
        on_plain = first_visit(browser, plain + TEST_PREFIX[1:] + "blank.html", plain + "app/", options)
    (root / "index.html").write_text("<!doctype html><title>an app</title><p>every unknown path answers with this page")
    with plain_static_server(root, fallback="index.html") as app_host:
        on_app_host = first_visit(browser, app_host + TEST_PREFIX[1:] + "blank.html", app_host + "app/", options)
    with running_server(root / "app", {TEST_PREFIX: pages}) as brotli_host:
        # Chromium 150 drops loadingFinished for some `Cache-Control: no-store` responses (the test
        # server's default): a CDN's caching headers here, none
        brotli_host.cache_control = None
        on_brotli = first_visit(browser, brotli_host.url + TEST_PREFIX[1:] + "blank.html", brotli_host.url, options)
    assert on_plain["ok"] and on_brotli["ok"], (on_plain, on_brotli)
    assert on_plain["unfinished"] == on_brotli["unfinished"] == [], (on_plain["unfinished"], on_brotli["unfinished"])
    # no red 404 in the console: the host probe asks for X.br, which every host has, never the missing X
    assert on_plain["failed"] == on_app_host["failed"] == on_brotli["failed"] == [], (on_plain["failed"], on_app_host["failed"], on_brotli["failed"])
    assert on_plain["outputs"] == on_brotli["outputs"]
    # a single-page app's host answers the missing X with its index.html and 200: read as a plain host
    assert on_app_host["ok"], on_app_host
    assert on_app_host["outputs"] == on_brotli["outputs"]
    assert [e["decodesBrotli"] for e in on_app_host["events"] if e["type"] == "host"] == [False]
    assert sum(on_app_host["wire"].values()) <= 1.15 * sum(on_brotli["wire"].values())
    hosts = [[(e["decodesBrotli"], e["decoder"]) for e in r["events"] if e["type"] == "host"] for r in (on_plain, on_brotli)]
    assert hosts == [[(False, "brotli-dec-wasm")], [(True, None)]], hosts
    decoded = {e["file"] for e in on_plain["events"] if e["type"] == "download" and e.get("decodedBy") == "brotli-dec-wasm"}
    assert decoded == {path for path, entry in manifest["files"].items() if entry.get("stored") == "br" and any(path in url for url in on_plain["wire"])}
    assert decoded and manifest["variants"]["fp32"]["model"] in decoded
    # the decoder only where it is needed
    assert any(url.endswith(decoder["wasm"]) for url in on_plain["wire"]) and not any(url.endswith(decoder["wasm"]) for url in on_brotli["wire"])
    plain_bytes, brotli_bytes = sum(on_plain["wire"].values()), sum(on_brotli["wire"].values())
    raw = export_package(chunked_packages["chunked"], tmp_path / "raw", None, bodies="raw")
    assert "decoder" not in raw.manifest["runtime"] and not (tmp_path / "raw" / "decoder").exists()
    print(f"first visit on the wire: plain static host {plain_bytes} B, brotli host {brotli_bytes} B, ratio {plain_bytes / brotli_bytes:.3f}")
    assert plain_bytes <= 1.15 * brotli_bytes, (plain_bytes, brotli_bytes, on_plain["wire"], on_brotli["wire"])
