"""loader.js in headless Chromium (SwiftShader WebGPU: no shader-f16), served like production.

One browser per module; every test gets a fresh context (empty Cache Storage) unless it is about
the cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, decode_output, image_sample, make_package, read_manifest, reference
from pipeline.runtime import resolve_runtime
from pipeline.verify.engines.browser.chromium import new_watched_page, probe_adapter
from pipeline.package_server import running_server

pytestmark = pytest.mark.browser

RUNTIME_PREFIX = "/__loader_runtime__/"


@pytest.fixture(scope="module")
def image_package(tmp_path_factory) -> Path:
    return make_package(tmp_path_factory.mktemp("pkg") / "image", "image")


@pytest.fixture(scope="module")
def audio_package(tmp_path_factory) -> Path:
    return make_package(tmp_path_factory.mktemp("pkg") / "audio", "audio")


@pytest.fixture(scope="module")
def server(image_package, pages):
    runtime_dist = resolve_runtime(read_manifest(image_package)["runtime"]["version"]).bundles["root"].module.parent
    with running_server(image_package, {TEST_PREFIX: pages, RUNTIME_PREFIX: runtime_dist}) as running:
        yield running


@pytest.fixture(scope="module")
def adapter_features(browser, server) -> list[str]:
    page, _ = new_watched_page(browser)
    try:
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        facts = probe_adapter(page)
    finally:
        page.context.close()
    assert facts["available"], f"no WebGPU adapter in this Chromium: {facts}"
    return facts["features"]


def blank_page(browser, server, **context_options):
    context = browser.new_context(**context_options)
    page = context.new_page()
    page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
    return page


def load_and_run(page, base: str, options: dict | None = None, run: bool = True) -> dict:
    return page.evaluate(LOAD_AND_RUN, {"base": base, "options": options or {}, "run": run})


def served_since(server, mark: int) -> list[str]:
    return [request.path for request in server.requests[mark:] if request.status == 200]


def test_demo_page_runs_image_model_and_draws_input_and_output(browser, server, adapter_features):
    page = blank_page(browser, server)
    try:
        page.goto(server.url + "index.html")
        page.wait_for_function("window.packDemo", timeout=60_000)
        demo = page.evaluate("window.packDemo")
        assert demo["ok"], demo["error"]
        assert demo["ep"] == "webgpu"
        # SwiftShader has no shader-f16, so the webgpu EP must get fp32.
        assert "shader-f16" not in adapter_features
        assert demo["variant"] == "fp32"
        assert demo["ms"] > 0 and demo["error"] is None
        kinds = page.evaluate("[...document.querySelectorAll('figure')].map(f => [f.dataset.name, f.dataset.kind])")
        assert kinds == [["x", "image"], ["y", "image"]]
        # The canvases show the sample and the model's output (scaled from [0, 1] to bytes).
        drawn = page.evaluate(
            """[...document.querySelectorAll('figure canvas')].map(c =>
                 Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data))"""
        )
        sample = image_sample()[0]
        expected_out = reference("image", image_sample())[0]
        for pixels, expected in zip(drawn, [sample, expected_out]):
            rgb = np.array(pixels, dtype=np.float64).reshape(64, 64, 4)[..., :3].transpose(2, 0, 1)
            assert np.abs(rgb - expected * 255).max() <= 1.0
    finally:
        page.context.close()


def test_demo_page_draws_waveforms_for_an_audio_model(browser, audio_package, pages):
    with running_server(audio_package, {TEST_PREFIX: pages}) as audio_server:
        page = blank_page(browser, audio_server)
        try:
            page.goto(audio_server.url + "index.html")
            page.wait_for_function("window.packDemo", timeout=60_000)
            demo = page.evaluate("window.packDemo")
            assert demo["ok"], demo["error"]
            kinds = page.evaluate("[...document.querySelectorAll('figure')].map(f => f.dataset.kind)")
            assert kinds == ["audio", "audio"]
            # A waveform: the middle row of the output canvas is painted where the signal crosses it.
            painted = page.evaluate(
                """(() => { const c = document.querySelectorAll('figure canvas')[1];
                   const row = c.getContext('2d').getImageData(0, c.height / 2, c.width, 1).data;
                   let n = 0; for (let i = 3; i < row.length; i += 4) n += row[i] > 0; return n / c.width; })()"""
            )
            assert painted > 0.9
            # the output and the build's fp32 reference can be heard side by side (WAV, one second)
            from report_helpers import AUDIO_FACTS

            audio = page.evaluate(AUDIO_FACTS)
            assert [a["label"] for a in audio] == ["sample input", "this run", "build's fp32 reference"]
            assert all(a["ready"] >= 3 and abs(a["duration"] - 1.0) < 0.01 for a in audio), audio
            # the loader's events as a readable timeline, not JSON
            timeline = page.eval_on_selector_all("#log li", "items => items.map(i => i.textContent)")
            assert any("ready on " in line for line in timeline) and not any("{" in line for line in timeline), timeline
        finally:
            page.context.close()


def test_fp16_failing_on_webgpu_falls_back_to_wasm_and_says_why(browser, server):
    page = blank_page(browser, server)
    try:
        result = load_and_run(page, server.url, {"variant": {"webgpu": "fp16"}})
        assert result["ok"], result
        info = result["infoAfterRun"]
        assert (info["ep"], info["variant"], info["bundle"]) == ("wasm", "fp32", "webgpu")
        [failure] = info["fallbacks"]
        assert (failure["ep"], failure["variant"]) == ("webgpu", "fp16")
        assert "requires f16" in failure["error"]
        assert failure["inputShapes"] == {"x": [1, 3, 64, 64]}
        assert failure["outputShapes"] == {"y": [1, 3, 64, 64]}
        # Logged once, with provider, error and shapes.
        [warning] = [w for w in result["warnings"] if w.startswith("[pack]")]
        assert "webgpu/fp16" in warning and "requires f16" in warning and "[1,3,64,64]" in warning
        assert [e["type"] for e in result["events"]].count("fallback") == 1
        output = decode_output(result["outputs"]["y"])
        np.testing.assert_allclose(output, reference("image", image_sample()), atol=1e-5)
    finally:
        page.context.close()


def test_variant_choice_follows_shader_f16_and_the_recipe(browser, server):
    page = blank_page(browser, server)
    try:
        picks = page.evaluate(
            """async (base) => {
                 const { pickVariant } = await import(base + 'loader.js');
                 const manifest = await (await fetch(base + 'manifest.json')).json();
                 const f16 = new Set(['shader-f16', 'timestamp-query']);
                 const none = new Set(['timestamp-query']);
                 return [pickVariant(manifest, 'webgpu', f16), pickVariant(manifest, 'webgpu', none),
                         pickVariant(manifest, 'wasm', f16), pickVariant(manifest, 'wasm', none),
                         pickVariant(manifest, 'webgpu', none, 'fp16'),
                         pickVariant({ ...manifest, variantFor: { webgpu: ['fp16'] } }, 'webgpu', none)];
               }""",
            server.url,
        )
        assert picks == ["fp16", "fp32", "fp32", "fp32", "fp16", "fp32"]
    finally:
        page.context.close()


def test_tampered_file_is_rejected_with_a_clear_error(browser, image_package, pages, tmp_path):
    tampered = shutil.copytree(image_package, tmp_path / "tampered")
    manifest = read_manifest(tampered)
    model = manifest["variants"]["fp32"]["model"]
    data = bytearray((tampered / model).read_bytes())
    data[-1] ^= 0x01  # same size, different bytes
    (tampered / model).write_bytes(bytes(data))
    (tampered / f"{model}.br").unlink(missing_ok=True)
    with running_server(tampered, {TEST_PREFIX: pages}) as tampered_server:
        page = blank_page(browser, tampered_server)
        try:
            result = load_and_run(page, tampered_server.url, {"executionProviders": ["wasm"]}, run=False)
        finally:
            page.context.close()
    assert not result["ok"]
    assert result["name"] == "PackIntegrityError"
    assert model in result["message"] and "sha256 mismatch" in result["message"]
    assert "re-publish" in result["message"]


def test_second_load_comes_from_cache_storage_without_network_bytes(browser, server):
    page = blank_page(browser, server)
    try:
        first = load_and_run(page, server.url, {"executionProviders": ["wasm"]})
        assert first["ok"], first
        manifest = read_manifest(Path(server.root))
        bundle = manifest["runtime"]["bundles"][first["info"]["bundle"]]
        cached = {bundle["module"], bundle["wasm"], manifest["variants"]["fp32"]["model"]}
        assert cached <= set(e["file"] for e in first["events"] if e["type"] == "download")

        page.reload()
        mark = len(server.requests)
        network = []
        page.on("requestfinished", lambda request: network.append(request.url))
        second = load_and_run(page, server.url, {"executionProviders": ["wasm"]})
        assert second["ok"], second
        served = served_since(server, mark)
        assert not [path for path in served if path.lstrip("/") in cached], served
        assert not [url for url in network if any(url.endswith(path) for path in cached)], network
        assert {e["file"] for e in second["events"] if e["type"] == "cache-hit"} >= cached
        # The cache answers with the same, re-checked bytes: same output.
        assert second["outputs"]["y"]["bytes"] == first["outputs"]["y"]["bytes"]
    finally:
        page.context.close()


USER_AGENTS = {
    "chrome-windows": ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", "Win32", 0, "desktop"),
    "edge-windows": ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0", "Win32", 10, "desktop"),
    "firefox-linux": ("Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0", "Linux x86_64", 0, "desktop"),
    "chrome-mac": ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", "MacIntel", 0, "desktop"),
    "safari-mac": ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15", "MacIntel", 0, "desktop"),
    "safari-iphone": ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1", "iPhone", 5, "apple-mobile"),
    "chrome-iphone": ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1", "iPhone", 5, "apple-mobile"),
    "safari-ipad": ("Mozilla/5.0 (iPad; CPU OS 17_7 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.7 Mobile/15E148 Safari/604.1", "iPad", 5, "apple-mobile"),
    "ipados-desktop-mode": ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Safari/605.1.15", "MacIntel", 5, "apple-mobile"),
    "chrome-android": ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36", "Linux armv81", 5, "android"),
    "firefox-android": ("Mozilla/5.0 (Android 14; Mobile; rv:133.0) Gecko/133.0 Firefox/133.0", "Linux aarch64", 5, "android"),
}


def test_platform_detection_and_chains_for_real_user_agents(browser, server):
    page = blank_page(browser, server)
    try:
        got = page.evaluate(
            """async ({ base, agents }) => {
                 const { detectPlatform, chainFor } = await import(base + 'loader.js');
                 const manifest = await (await fetch(base + 'manifest.json')).json();
                 const bare = { ...manifest, executionProviders: { desktop: ['wasm'] } };
                 const out = {};
                 for (const [name, [userAgent, platform, maxTouchPoints]] of Object.entries(agents)) {
                   const detected = detectPlatform({ userAgent, platform, maxTouchPoints });
                   out[name] = [detected, chainFor(manifest, detected), chainFor(bare, detected)];
                 }
                 return out;
               }""",
            {"base": server.url, "agents": {name: list(agent[:3]) for name, agent in USER_AGENTS.items()}},
        )
    finally:
        page.context.close()
    manifest_chains = read_manifest(Path(server.root))["executionProviders"]
    for name, (_, _, _, expected) in USER_AGENTS.items():
        detected, chain, bare_chain = got[name]
        assert detected == expected, name
        assert chain == manifest_chains[expected], name
        # A manifest without the platform's chain: the built-in defaults (Apple mobile: wasm only).
        expected_bare = {"desktop": ["wasm"], "apple-mobile": ["wasm"], "android": ["webgpu", "wasm"]}[expected]
        assert bare_chain == expected_bare, name


def test_ipados_desktop_mode_page_loads_the_wasm_bundle_without_threads(browser, server):
    user_agent, platform, touch_points, _ = USER_AGENTS["ipados-desktop-mode"]
    context = browser.new_context(user_agent=user_agent)
    # What iPadOS Safari reports in desktop mode; Chromium cannot emulate platform/maxTouchPoints.
    context.add_init_script(
        f"""Object.defineProperty(Navigator.prototype, 'platform', {{ get: () => {json.dumps(platform)} }});
            Object.defineProperty(Navigator.prototype, 'maxTouchPoints', {{ get: () => {touch_points} }});"""
    )
    page = context.new_page()
    try:
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        mark = len(server.requests)
        result = load_and_run(page, server.url, {"cache": False})
        assert result["ok"], result
        info = result["infoAfterRun"]
        assert (info["platform"], info["chain"], info["bundle"], info["ep"]) == ("apple-mobile", ["wasm"], "wasm", "wasm")
        assert result["crossOriginIsolated"] and info["threads"] == 1 and info["threadsWhy"].startswith("Apple mobile: one thread")
        bundles = read_manifest(Path(server.root))["runtime"]["bundles"]
        served = served_since(server, mark)
        assert "/" + bundles["wasm"]["module"] in served and "/" + bundles["webgpu"]["wasm"] not in served
        np.testing.assert_allclose(decode_output(result["outputs"]["y"]), reference("image", image_sample()), atol=1e-5)
    finally:
        context.close()


def test_hung_run_hits_the_watchdog_and_falls_back(browser, server):
    page = blank_page(browser, server)
    try:
        # A first load starts onnxruntime's WebGPU device in this page (seconds on a loaded machine), so
        # the short watchdog of the second one times the hung run below, not SwiftShader's start-up.
        warm = load_and_run(page, server.url, {"cache": False, "prewarm": False}, run=False)
        assert warm["ok"] and warm["info"]["ep"] == "webgpu", warm["info"]["fallbacks"]
        loaded = load_and_run(page, server.url, {"watchdogMs": 1500, "cache": False, "prewarm": False}, run=False)
        assert loaded["ok"] and loaded["info"]["ep"] == "webgpu", loaded["info"]["fallbacks"]
        result = page.evaluate(
            """async () => {
                 const model = window.__packModel;
                 model.session.run = () => new Promise(() => {});  // a run that never ends
                 const started = performance.now();
                 const outputs = await model.run(await model.sampleFeeds());
                 return { ms: performance.now() - started, info: model.info, dims: Array.from(outputs.y.dims) };
               }"""
        )
    finally:
        page.context.close()
    assert result["info"]["ep"] == "wasm" and result["dims"] == [1, 3, 64, 64]
    [failure] = result["info"]["fallbacks"]
    assert failure["phase"] == "run" and "watchdog" in failure["error"] and "1500 ms" in failure["error"]
    assert failure["inputShapes"] == {"x": [1, 3, 64, 64]}
    assert result["ms"] >= 1500


def test_progress_totals_are_the_manifest_decoded_sizes_and_phases_cover_the_wait(browser, server):
    page = blank_page(browser, server)
    try:
        result = load_and_run(page, server.url, {})
    finally:
        page.context.close()
    assert result["ok"], result
    manifest = read_manifest(Path(server.root))
    bundle = manifest["runtime"]["bundles"][result["info"]["bundle"]]
    needed = [bundle["module"], bundle["wasm"], manifest["variants"][result["info"]["variant"]]["model"]]
    expected_total = sum(manifest["files"][path]["size"] for path in needed)
    downloads = [p for p in result["progress"] if p["phase"] == "download"]
    # the sample file sampleFeeds() fetched after load() adds to the total then
    assert {p["total"] for p in downloads if p["file"] in needed} == {expected_total}
    loaded = [p["loaded"] for p in downloads if p["file"] in needed]
    assert loaded == sorted(loaded) and loaded[-1] == expected_total
    assert {p["file"] for p in downloads} - {manifest["sample"]["file"]} == set(needed)
    # after the downloads: the session's creation, the pre-warm and the first run, each begun and
    # done with its time, the elapsed time never going back, the last event the first result
    ep, variant = result["info"]["ep"], result["info"]["variant"]
    phases = [(p["phase"], p["state"]) for p in result["progress"] if p["phase"] != "download"]
    assert phases == [("create", "start"), ("create", "done"), ("prewarm", "start"), ("prewarm", "done"), ("run", "start"), ("run", "done")], phases
    waits = [p for p in result["progress"] if p["phase"] != "download"]
    assert all((p["ep"], p["variant"]) == (ep, variant) for p in waits) and all(p["ms"] >= 0 for p in waits if p["state"] == "done"), waits
    elapsed = [p["elapsedMs"] for p in result["progress"]]
    assert elapsed == sorted(elapsed) and result["progress"][-1]["phase"] == "run"
    created = next(e["ms"] for e in result["events"] if e["type"] == "session")
    assert next(p["ms"] for p in waits if p["phase"] == "create" and p["state"] == "done") == round(created)


def test_abort_signal_stops_the_load(browser, server):
    page = blank_page(browser, server)
    try:
        result = page.evaluate(
            """async (base) => {
                 const { load } = await import(base + 'loader.js');
                 const controller = new AbortController();
                 try {
                   await load({ signal: controller.signal, cache: false, onProgress: () => controller.abort() });
                   return { ok: true };
                 } catch (error) { return { ok: false, name: error.name }; }
               }""",
            server.url,
        )
    finally:
        page.context.close()
    assert result == {"ok": False, "name": "AbortError"}


def test_bad_feeds_are_the_callers_error_not_a_fallback(browser, server):
    page = blank_page(browser, server)
    try:
        load_and_run(page, server.url, {"executionProviders": ["wasm"], "cache": False}, run=False)
        result = page.evaluate(
            """async () => {
                 const model = window.__packModel;
                 const attempt = async (feeds) => { try { await model.run(feeds); return 'ran'; } catch (e) { return `${e.name}: ${e.message}`; } };
                 const wrongDims = await attempt({ x: { data: new Float32Array(12), dims: [1, 3, 2, 2], type: 'float32' } });
                 const missing = await attempt({});
                 const wrongType = await attempt({ x: { data: new Int32Array(12288), dims: [1, 3, 64, 64], type: 'int32' } });
                 const fallbacks = model.info.fallbacks.length;
                 await model.release();
                 const afterRelease = await attempt(await model.sampleFeeds());
                 return { wrongDims, missing, wrongType, fallbacks, afterRelease, session: model.session };
               }"""
        )
    finally:
        page.context.close()
    assert result["wrongDims"].startswith("TypeError") and "[1,3,2,2]" in result["wrongDims"]
    assert result["missing"].startswith("TypeError") and 'missing input "x"' in result["missing"]
    assert result["wrongType"].startswith("TypeError") and "int32" in result["wrongType"]
    assert result["fallbacks"] == 0
    assert "released" in result["afterRelease"] and result["session"] is None


def test_runtime_override_urls(browser, server):
    manifest = read_manifest(Path(server.root))
    root = resolve_runtime(manifest["runtime"]["version"]).bundles["root"]
    shipped = manifest["runtime"]["bundles"]["webgpu"]
    page = blank_page(browser, server)
    try:
        # URLs of a shipped bundle are that bundle (sha256-checked); other URLs are a custom build.
        as_shipped = load_and_run(page, server.url, {"runtime": {"module": server.url + shipped["module"], "wasm": server.url + shipped["wasm"]}, "cache": False})
        page.reload()
        custom = load_and_run(
            page,
            server.url,
            {"runtime": {"module": server.url + RUNTIME_PREFIX[1:] + root.module.name, "wasm": server.url + RUNTIME_PREFIX[1:] + root.wasm.name}, "cache": False},
        )
    finally:
        page.context.close()
    assert as_shipped["ok"] and as_shipped["info"]["bundle"] == "webgpu", as_shipped
    assert any(e["type"] == "download" and e["file"] == shipped["module"] for e in as_shipped["events"])
    assert custom["ok"] and custom["info"]["bundle"] == "custom", custom
    # The root (JSEP) build of onnxruntime-web 1.30.0 rejects this Conv (no `dilations` attribute)
    # on WebGPU at the first run: the pre-warm catches it and the loader falls back to wasm.
    [failure] = custom["info"]["fallbacks"]
    assert (failure["ep"], failure["phase"]) == ("webgpu", "prewarm") and "dilations" in failure["error"]
    assert custom["info"]["ep"] == "wasm"
    np.testing.assert_allclose(decode_output(custom["outputs"]["y"]), reference("image", image_sample()), atol=1e-5)


# Init scripts that stand in for browsers: one without WebGPU, one whose first adapter requests
# return null (seen on real GPUs in a fresh browser).
NO_WEBGPU = "Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined });"
NULL_ADAPTER_ONCE = """
(() => {
  const request = GPU.prototype.requestAdapter;
  let calls = 0;
  GPU.prototype.requestAdapter = function (...args) { calls += 1; return calls <= 1 ? Promise.resolve(null) : request.apply(this, args); };
})();
"""


@pytest.mark.parametrize(
    ("script", "expected"),
    [(NO_WEBGPU, ("wasm", "wasm", 0)), (NULL_ADAPTER_ONCE, ("webgpu", "webgpu", 2))],
    ids=["no-webgpu", "null-adapter-once"],
)
def test_webgpu_adapter_is_retried_and_its_absence_means_the_wasm_bundle(browser, server, script, expected):
    context = browser.new_context()
    context.add_init_script(script)
    page = context.new_page()
    try:
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        result = load_and_run(page, server.url, {"cache": False})
    finally:
        context.close()
    assert result["ok"], result
    info = result["infoAfterRun"]
    [adapter] = [e for e in result["events"] if e["type"] == "adapter"]
    assert (info["ep"], info["bundle"], adapter["attempts"]) == expected
    assert info["chain"] == ["webgpu", "wasm"]
    if info["ep"] == "wasm":
        [skipped] = info["fallbacks"]
        assert (skipped["ep"], skipped["phase"]) == ("webgpu", "select") and "navigator.gpu is undefined" in skipped["error"]
    else:
        assert info["fallbacks"] == []


def test_webgpu_ep_options_and_session_options_reach_onnxruntime(browser, image_package, pages, tmp_path):
    package = shutil.copytree(image_package, tmp_path / "nchw")
    manifest = read_manifest(package)
    manifest["epOptions"] = {"webgpu": {"preferredLayout": "NCHW"}}
    (package / "manifest.json").write_text(json.dumps(manifest))
    with running_server(package, {TEST_PREFIX: pages}) as nchw_server:
        page = blank_page(browser, nchw_server)
        try:
            first = load_and_run(page, nchw_server.url, {"cache": False}, run=False)
            assert first["ok"], first
            # The second load reuses the page's onnxruntime module: record what it is asked for.
            created = page.evaluate(
                """async (base) => {
                     const ort = window.__packModel.ort;
                     const create = ort.InferenceSession.create;
                     const seen = [];
                     ort.InferenceSession.create = (model, options) => { seen.push(options); return create.call(ort.InferenceSession, model, options); };
                     const { load } = await import(base + 'loader.js');
                     const model = await load({ executionProviders: ['webgpu', 'wasm'], cache: false,
                                                sessionOptions: { logSeverityLevel: 3, executionProviders: ['cpu'] } });
                     return { seen: JSON.parse(JSON.stringify(seen)), ep: model.info.ep };
                   }""",
                nchw_server.url,
            )
        finally:
            page.context.close()
    assert created["ep"] == "webgpu"
    [options] = created["seen"]
    assert options["executionProviders"] == [{"name": "webgpu", "preferredLayout": "NCHW"}]
    assert options["logSeverityLevel"] == 3


def _with_verification_runs(image_package: Path, folder: Path, failed: set[tuple[str, str, str]]) -> Path:
    """A copy of the image package whose manifest records the build's browser runs, `failed` among them."""
    package = shutil.copytree(image_package, folder)
    manifest = read_manifest(package)
    pairs = [("wasm", "wasm", "fp32"), ("webgpu", "wasm", "fp32"), ("webgpu", "webgpu", "fp16"), ("webgpu", "webgpu", "fp32")]
    statuses = {("webgpu", "webgpu", "fp16"): "not-verifiable"}

    def entry(b, e, v):
        if (b, e, v) in failed:
            return {"stage": "browser", "bundle": b, "ep": e, "variant": v, "status": "failed", "detail": f"y: rel_l2 0.5 > 0.001 ({b} bundle)"}
        return {"stage": "browser", "bundle": b, "ep": e, "variant": v, "status": statuses.get((b, e, v), "passed")}

    manifest["verification"] = {"browser": True, "passed": not failed, "runs": [entry(*pair) for pair in pairs]}
    (package / "manifest.json").write_text(json.dumps(manifest))
    return package


def test_pair_the_build_refused_is_skipped_and_a_forced_one_is_refused_naming_the_check(browser, image_package, pages, tmp_path):
    package = _with_verification_runs(image_package, tmp_path / "failed-webgpu", {("webgpu", "webgpu", "fp32")})
    bundles = read_manifest(package)["runtime"]["bundles"]
    with running_server(package, {TEST_PREFIX: pages}) as failed_server:
        page = blank_page(browser, failed_server)
        try:
            mark = len(failed_server.requests)
            skipped = load_and_run(page, failed_server.url, {"cache": False})
            served = served_since(failed_server, mark)
            page.reload()
            forced_variant = load_and_run(page, failed_server.url, {"variant": {"webgpu": "fp32"}, "cache": False})
            page.reload()
            forced_pair = load_and_run(page, failed_server.url, {"executionProviders": ["webgpu"], "variant": "fp32", "cache": False}, run=False)
            page.reload()
            forced_runtime = load_and_run(page, failed_server.url, {"executionProviders": ["webgpu"], "runtime": "webgpu", "cache": False}, run=False)
            page.reload()
            # What the build's verification harness passes: one EP, a variant, a runtime key and allowRefused.
            harness_like = load_and_run(
                page, failed_server.url, {"executionProviders": ["webgpu"], "variant": "fp32", "runtime": "webgpu", "allowRefused": True, "cache": False}, run=False
            )
            page.reload()
            picks = page.evaluate(
                """async (base) => {
                     const { pickVariant, verificationStatus } = await import(base + 'loader.js');
                     const manifest = await (await fetch(base + 'manifest.json')).json();
                     const f16 = new Set(['shader-f16']);
                     const none = new Set();
                     const fp16Failed = { ...manifest, verification: { runs: manifest.verification.runs.map((r) =>
                       r.ep === 'webgpu' ? { ...r, status: r.variant === 'fp16' ? 'failed' : 'passed' } : r) } };
                     return [pickVariant(manifest, 'webgpu', none, undefined, 'webgpu'),  // fp32 failed, fp16 needs f16
                             pickVariant(manifest, 'webgpu', none),                      // no bundle: no skipping
                             pickVariant(manifest, 'webgpu', f16, undefined, 'webgpu'),   // not-verifiable is allowed
                             pickVariant(fp16Failed, 'webgpu', f16, undefined, 'webgpu'), // falls to the next variant
                             pickVariant(manifest, 'webgpu', none, 'fp32', 'webgpu'),     // forced: refused all the same
                             verificationStatus(manifest, 'webgpu', 'webgpu', 'fp32'),
                             verificationStatus(manifest, 'webgpu', 'webgpu', 'fp16'),
                             verificationStatus(manifest, 'wasm', 'wasm', 'fp32'),
                             verificationStatus(manifest, 'custom', 'wasm', 'fp32'),
                             verificationStatus({ verification: { browser: false, passed: true } }, 'wasm', 'wasm', 'fp32')];
                   }""",
                failed_server.url,
            )
        finally:
            page.context.close()

    # Lands on wasm/fp32 (the wasm bundle, as without an adapter) without trying webgpu.
    assert skipped["ok"], skipped
    info = skipped["infoAfterRun"]
    assert (info["ep"], info["variant"], info["bundle"], info["verified"]) == ("wasm", "fp32", "wasm", "passed")
    refusing_run = {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "status": "failed", "detail": "y: rel_l2 0.5 > 0.001 (webgpu bundle)"}
    expected_skip = {"ep": "webgpu", "variant": "fp32", "bundle": "webgpu", "reason": "failed its browser check at build time: y: rel_l2 0.5 > 0.001 (webgpu bundle)", "run": refusing_run, "forced": False}
    assert info["skipped"] == [expected_skip] and info["fallbacks"] == []
    assert [e for e in skipped["events"] if e["type"] == "skip"] == [{"type": "skip", **expected_skip}]
    assert [(e["ep"], e["variant"]) for e in skipped["events"] if e["type"] == "session"] == [("wasm", "fp32")]
    assert not [e for e in skipped["events"] if e["type"] in ("error", "fallback")]
    assert "/" + bundles["webgpu"]["module"] not in served and "/" + bundles["wasm"]["module"] in served
    np.testing.assert_allclose(decode_output(skipped["outputs"]["y"]), reference("image", image_sample()), atol=1e-5)

    # A forced variant the build refused is never run: the EP is skipped (the chain goes on) ...
    assert forced_variant["ok"], forced_variant
    forced = forced_variant["infoAfterRun"]
    assert (forced["ep"], forced["variant"], forced["verified"]) == ("wasm", "fp32", "passed")
    assert forced["skipped"] == [{**expected_skip, "forced": True}]
    assert ("webgpu", "fp32") not in [(e["ep"], e["variant"]) for e in forced_variant["events"] if e["type"] == "session"]
    # ... and when nothing is left, load() says which check failed, whatever the app forced.
    for refused in (forced_pair, forced_runtime):
        assert not refused["ok"] and refused["name"] == "PackRefusedError", refused
        assert "webgpu/fp32 on the webgpu bundle: failed its browser check at build time: y: rel_l2 0.5 > 0.001" in refused["message"]
        assert not [e for e in refused["events"] if e["type"] == "session"]
    # Verification itself re-runs it, and the loader says what the build recorded.
    assert harness_like["ok"], harness_like
    assert (harness_like["info"]["ep"], harness_like["info"]["variant"], harness_like["info"]["verified"]) == ("webgpu", "fp32", "failed")

    assert picks == [None, "fp32", "fp16", "fp32", None, "failed", "not-verifiable", "passed", "unverified", "unverified"]


def test_skipping_keeps_the_bundle_whose_pair_passed_and_fails_clearly_when_nothing_is_left(browser, image_package, pages, tmp_path):
    # The wasm bundle failed wasm/fp32 but the webgpu bundle passed it: wasm runs on the webgpu bundle.
    package = _with_verification_runs(image_package, tmp_path / "two-failed", {("webgpu", "webgpu", "fp32"), ("wasm", "wasm", "fp32")})
    everything = _with_verification_runs(image_package, tmp_path / "all-failed", {("webgpu", "webgpu", "fp32"), ("wasm", "wasm", "fp32"), ("webgpu", "wasm", "fp32")})
    with running_server(package, {TEST_PREFIX: pages}) as two_server:
        page = blank_page(browser, two_server)
        try:
            kept = load_and_run(page, two_server.url, {"cache": False}, run=False)
        finally:
            page.context.close()
    with running_server(everything, {TEST_PREFIX: pages}) as all_server:
        page = blank_page(browser, all_server)
        try:
            nothing = load_and_run(page, all_server.url, {"cache": False}, run=False)
        finally:
            page.context.close()
    assert kept["ok"], kept
    assert (kept["info"]["ep"], kept["info"]["bundle"], kept["info"]["verified"]) == ("wasm", "webgpu", "passed")
    assert [(s["ep"], s["variant"], s["bundle"]) for s in kept["info"]["skipped"]] == [("webgpu", "fp32", "webgpu")]
    assert not nothing["ok"] and nothing["name"] == "PackRefusedError"
    assert "no execution provider can run here" in nothing["message"]
    assert "webgpu/fp32 on the webgpu bundle: failed its browser check at build time: y: rel_l2 0.5 > 0.001" in nothing["message"]
    assert "wasm/fp32 on the webgpu bundle: failed its browser check at build time" in nothing["message"]


CACHE_KEYS = "async () => (await (await caches.open('pack-files-v1')).keys()).map((request) => request.url)"
CACHE_STATE = "async (base) => (await import(base + 'loader.js')).cacheStatus({ baseUrl: base })"


def _settled(page, base: str, gone: str | None = None) -> dict:
    """cacheStatus() once the load's index is written ('cache' event: after 'ready', off the way to
    the first result) and, with `gone`, that sha256 has left Cache Storage."""
    page.wait_for_function(
        """async ([base, gone]) => {
          const { cacheStatus } = await import(base + 'loader.js');
          const keys = (await (await caches.open('pack-files-v1')).keys()).map((r) => r.url);
          return (await cacheStatus({ baseUrl: base })).cached && !(gone && keys.some((key) => key.endsWith(gone)));
        }""",
        arg=[base, gone], timeout=10_000,
    )
    return page.evaluate(CACHE_STATE, base)


def test_a_newer_version_evicts_the_older_ones_files_and_clear_cache_frees_the_rest(browser, image_package, pages, tmp_path):
    """One URL, two versions of its package: after the second loads, the first's model leaves
    Cache Storage (the runtime both list stays), cacheStatus() gives the bytes held, and
    clearCache() empties it."""
    newer = make_package(tmp_path / "newer", "conv")  # another model, the same runtime
    site = tmp_path / "site"
    shutil.copytree(image_package, site)
    old, new = read_manifest(image_package), read_manifest(newer)

    def sha(manifest: dict, path: str) -> str:
        return manifest["files"][path]["sha256"]

    old_model, new_model = (sha(m, m["variants"]["fp32"]["model"]) for m in (old, new))
    runtime = {sha(new, new["runtime"]["bundles"]["wasm"][part]) for part in ("module", "wasm")}
    assert old_model != new_model and runtime <= {entry["sha256"] for entry in old["files"].values()}
    with running_server(site, {TEST_PREFIX: pages}) as server:
        page = blank_page(browser, server)
        try:
            first = load_and_run(page, server.url, {"executionProviders": ["wasm"]}, run=False)
            assert first["ok"], first
            assert _settled(page, server.url)["files"] >= 3
            assert any(key.endswith(old_model) for key in page.evaluate(CACHE_KEYS))

            shutil.rmtree(site)
            shutil.copytree(newer, site)  # re-published at the same URL
            page.reload()
            second = load_and_run(page, server.url, {"executionProviders": ["wasm"]}, run=False)
            assert second["ok"], second
            state = _settled(page, server.url, gone=old_model)
            keys = page.evaluate(CACHE_KEYS)
            assert any(key.endswith(new_model) for key in keys) and all(any(key.endswith(h) for key in keys) for h in runtime), keys
            held = {entry["sha256"]: entry["size"] for entry in new["files"].values() if any(key.endswith(entry["sha256"]) for key in keys)}
            assert state == {"cached": True, "files": len(held), "bytes": sum(held.values())}, state

            freed = page.evaluate("async (base) => (await import(base + 'loader.js')).clearCache({ baseUrl: base })", server.url)
            assert freed == {"files": state["files"], "bytes": state["bytes"]}, (freed, state)
            assert page.evaluate("async (base) => (await import(base + 'loader.js')).isCached({ baseUrl: base })", server.url) is False
            assert page.evaluate(CACHE_KEYS) == []
        finally:
            page.context.close()
