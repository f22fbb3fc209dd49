"""The measured choice of EP and variant (loader select: 'measured' | 'chain'): the build's default
rule, the recipe key, the build summary's speed line, and in headless Chromium (SwiftShader, where
WebGPU is slow): wasm is picked with the times named, the decision is reused from storage without
trials and invalidated when the adapter or the package changes, a corrupted candidate is never
chosen, priors skip a far slower candidate, and the demo page reports choice and comparison."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, fp16_of, image_model, make_package, read_manifest, write_manifest
from pipeline.commands.summary import chain_speed_lines
from pipeline.errors import PackError
from pipeline.web.select import CHEAP_SAMPLE_MS, default_select
from pipeline.recipe import parse_recipe

SWIFTSHADER = {"vendor": "google", "architecture": "swiftshader", "description": ""}


def test_default_select_rule():
    assert default_select("chain", [1.0]) == ("chain", "recipe key loader.select")
    assert default_select(None, [3.2, 40.0])[0] == "measured"
    assert "3.2 ms < 200 ms" in default_select(None, [3.2, 40.0])[1]
    assert default_select(None, [CHEAP_SAMPLE_MS, 900.0])[0] == "chain"
    assert default_select(None, [None]) == ("chain", "no browser timing of the sample run (--no-browser)")


def test_recipe_key_loader_select(tmp_path):
    recipe = parse_recipe({"name": "m", "source": {"uri": "m.onnx"}, "loader": {"select": "measured"}}, tmp_path / "m.toml")
    assert recipe.loader_select == "measured"
    assert parse_recipe({"name": "m", "source": {"uri": "m.onnx"}}, tmp_path / "m.toml").loader_select is None
    with pytest.raises(PackError, match="key 'loader.select': expected one of measured, chain, got 'fastest'"):
        parse_recipe({"name": "m", "source": {"uri": "m.onnx"}, "loader": {"select": "fastest"}}, tmp_path / "m.toml")


def test_summary_says_when_the_chain_is_measured_slower():
    measured = lambda ep, variant, ms, adapter=SWIFTSHADER: {"source": "build", "adapter": adapter, "bundle": "webgpu", "ep": ep, "variant": variant, "steadyMs": ms}  # noqa: E731
    manifest = {
        "executionProviders": {"desktop": ["webgpu", "wasm"]},
        "variantFor": {"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        "loader": {"select": "measured"},
        "measurements": [measured("webgpu", "fp32", 12.0), measured("wasm", "fp32", 2.0),
                         measured("webgpu", "fp32", 1.0, {"vendor": "nvidia", "architecture": "hopper"}), measured("wasm", "fp32", 1.2, {"vendor": "nvidia", "architecture": "hopper"})],
    }
    # As the build records them: wasm without an adapter, beside the same machine's webgpu run.
    recorded = {**manifest, "measurements": [{**measured("webgpu", "fp32", 12.0), "browser": "Chromium/150"}, {**measured("wasm", "fp32", 2.0, None), "browser": "Chromium/150"}]}
    [line] = chain_speed_lines(recorded)
    assert line.startswith("  speed: wasm/fp32 6.0× faster than webgpu/fp32 (the chain's first choice) on google swiftshader: 2.0 vs 12.0 ms")
    [line] = chain_speed_lines(manifest)
    assert line.startswith("  speed: wasm/fp32 6.0× faster than webgpu/fp32 (the chain's first choice) on google swiftshader: 2.0 vs 12.0 ms")
    assert "measured choice picks it" in line
    assert chain_speed_lines({**manifest, "measurements": []}) == []


# ---------------------------------------------------------------------------------------------
# In the browser

browser_only = pytest.mark.browser


@pytest.fixture(scope="module")
def measured_package(tmp_path_factory) -> Path:
    return make_package(tmp_path_factory.mktemp("pkg") / "loader-test-conv", "conv", select="measured", prewarm=False)


def _serve(package: Path, pages: Path):
    from pipeline.package_server import running_server

    return running_server(package, {TEST_PREFIX: pages})


def _load(page, base: str, options: dict | None = None, run: bool = False) -> dict:
    return page.evaluate(LOAD_AND_RUN, {"base": base, "options": {"cache": False, **(options or {})}, "run": run})


def _kinds(result: dict, kind: str) -> list[dict]:
    return [e for e in result["events"] if e["type"] == kind]


@browser_only
def test_measured_choice_picks_wasm_reuses_the_decision_and_invalidates_it(browser, measured_package, pages, tmp_path):
    package = shutil.copytree(measured_package, tmp_path / "pkg")
    with _serve(package, pages) as server:
        context = browser.new_context()
        page = context.new_page()
        try:
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            first = _load(page, server.url, run=True)
            page.reload()
            again = _load(page, server.url)
            # Another adapter (same browser profile): the stored decision does not hold for it.
            context.add_init_script("Object.defineProperty(GPUAdapter.prototype, 'info', { get: () => ({ vendor: 'acme', architecture: 'rdna9', description: 'Acme GPU' }) });")
            page.reload()
            other_adapter = _load(page, server.url)
            page.reload()
            other_adapter_again = _load(page, server.url)
            # Another package (its EP options changed, as a rebuild's layout retry may: the decision
            # follows the models, runtime files and EP options, not the report or the demo): trials again.
            manifest = read_manifest(package)
            manifest["epOptions"] = {**manifest.get("epOptions", {}), "webgpu": {"preferredLayout": "NCHW"}}
            write_manifest(package, manifest)
            page.reload()
            other_package = _load(page, server.url)
        finally:
            context.close()

    assert first["ok"], first
    # The first result never waits on trials: no build measurements here, so the load starts on the
    # chain's first choice and the trials run after load() resolved.
    started = first["firstInfo"]
    assert (started["ep"], started["selection"]["pending"], started["selection"]["startedFrom"]) == ("webgpu", True, "chain"), started["selection"]
    types = [e["type"] for e in first["events"]]
    assert types.index("ready") < types.index("select") < types.index("trial")
    selection = first["info"]["selection"]
    assert selection["mode"] == "measured" and selection["fromCache"] is False and selection["pending"] is False
    # wasm won on the webgpu bundle: later runs switch to it, later visits load the wasm-only bundle
    assert selection["switched"] is True and selection["bundle"] == "wasm" and selection["trialMs"] > 0
    # SwiftShader runs WebGPU on the CPU at ~0.2 GFLOP/s: wasm wins, and the times say so.
    assert selection["choice"] == {"ep": "wasm", "variant": "fp32"} == {"ep": first["info"]["ep"], "variant": first["info"]["variant"]}, selection["candidates"]
    by_pair = {(c["ep"], c["variant"]): c for c in selection["candidates"]}
    assert set(by_pair) == {("webgpu", "fp32"), ("wasm", "fp32")}  # fp16 needs shader-f16
    for candidate in by_pair.values():
        assert candidate["result"] == "ok" and candidate["steadyMs"] > 0 and candidate["runs"] >= 1, candidate
        assert candidate["comparison"].startswith("y: max_abs_of_range "), candidate
    assert by_pair[("wasm", "fp32")]["steadyMs"] < by_pair[("webgpu", "fp32")]["steadyMs"]
    assert selection["key"]["adapter"]["vendor"] and selection["key"]["browser"].startswith(("Chromium/", "HeadlessChrome/", "Google Chrome/"))
    assert [e["phase"] for e in _kinds(first, "select")] == ["start", "done"]
    assert {(e["ep"], e["variant"]) for e in _kinds(first, "trial")} == set(by_pair)
    assert first["info"]["verified"] == "unverified" and first["outputs"]["y"]["dims"] == [1, 3, 64, 64]

    # The reload reuses the decision: no trial, one session (the chosen one).
    assert again["ok"], again
    assert again["info"]["selection"]["fromCache"] is True and again["info"]["selection"]["choice"] == selection["choice"]
    assert again["info"]["selection"]["candidates"] == selection["candidates"]
    assert not _kinds(again, "trial")
    assert [(e["ep"], e["variant"]) for e in _kinds(again, "session")] == [("wasm", "fp32")]
    assert again["info"]["bundle"] == "wasm" and [e["bundle"] for e in _kinds(again, "bundle")] == ["wasm"]

    assert other_adapter["ok"] and other_adapter["info"]["selection"]["fromCache"] is False, other_adapter
    assert other_adapter["info"]["selection"]["key"]["adapter"] == {"vendor": "acme", "architecture": "rdna9", "description": "acme gpu"}
    assert _kinds(other_adapter, "trial")
    assert other_adapter_again["info"]["selection"]["fromCache"] is True
    assert other_package["ok"] and other_package["info"]["selection"]["fromCache"] is False, other_package
    assert other_package["info"]["selection"]["key"]["package"] != selection["key"]["package"]


@browser_only
def test_a_candidate_whose_outputs_disagree_is_never_chosen(browser, pages, tmp_path):
    # The fp16 variant is a wrong model (blur weight 1/8): wasm may run fp16 here, and its trial must drop it.
    package = make_package(
        tmp_path / "loader-test-image", "image", select="measured", prewarm=False,
        variant_for={"webgpu": ["fp16", "fp32"], "wasm": ["fp16", "fp32"]}, fp16_model=fp16_of(image_model(weight=1 / 8)),
    )
    with _serve(package, pages) as server:
        page = browser.new_context().new_page()
        try:
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            result = _load(page, server.url)
        finally:
            page.context.close()
    assert result["ok"], result
    by_pair = {(c["ep"], c["variant"]): c for c in result["info"]["selection"]["candidates"]}
    corrupted = by_pair[("wasm", "fp16")]
    assert corrupted["result"] == "mismatch" and "outputs disagree with the build's fp32 reference: y: " in corrupted["detail"], corrupted
    assert result["info"]["selection"]["choice"] == {"ep": result["info"]["ep"], "variant": result["info"]["variant"]}
    assert result["info"]["variant"] == "fp32" and by_pair[(result["info"]["ep"], "fp32")]["result"] == "ok"


@browser_only
def test_priors_skip_a_far_slower_candidate_and_order_the_chain(browser, measured_package, pages, tmp_path):
    package = shutil.copytree(measured_package, tmp_path / "pkg")
    with _serve(package, pages) as server:
        page = browser.new_context().new_page()
        try:
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            adapter = page.evaluate("(async () => { const a = await navigator.gpu.requestAdapter(); return { vendor: a.info.vendor, architecture: a.info.architecture, description: a.info.description }; })()")
            manifest = read_manifest(package)
            manifest["measurements"] = [
                {"source": "build", "browser": "Chromium/150", "adapter": adapter, "bundle": "webgpu", "ep": ep, "variant": "fp32", "createMs": 10, "firstMs": 5, "steadyMs": ms}
                for ep, ms in (("webgpu", 50.0), ("wasm", 1.0))
            ]
            write_manifest(package, manifest)
            measured = _load(page, server.url, {"storage": None})
            page.reload()
            chain = _load(page, server.url, {"select": "chain"})
        finally:
            page.context.close()
    assert measured["ok"], measured
    by_pair = {(c["ep"], c["variant"]): c for c in measured["info"]["selection"]["candidates"]}
    assert by_pair[("webgpu", "fp32")]["result"] == "skipped" and "50.0× slower" in by_pair[("webgpu", "fp32")]["detail"]
    # The build's measurements on this adapter class are the best-known choice: the first visit
    # starts on wasm, on the wasm-only bundle (the webgpu bundle is never fetched), with no trial.
    assert by_pair[("wasm", "fp32")]["result"] == "prior"
    assert [(e["ep"], e["variant"]) for e in _kinds(measured, "session")] == [("wasm", "fp32")]
    assert _kinds(measured, "trial") == [] and measured["firstInfo"]["bundle"] == "wasm"
    assert not any("webgpu" in e["file"] for e in _kinds(measured, "download"))
    # select: 'chain' follows the measurements: wasm first although the chain says webgpu.
    assert chain["ok"] and chain["info"]["selection"]["mode"] == "chain", chain
    assert (chain["info"]["ep"], chain["info"]["chain"]) == ("wasm", ["webgpu", "wasm"])
    assert [c["priorMs"] for c in chain["info"]["selection"]["candidates"]] == [1.0, 50.0]


@browser_only
def test_demo_page_reports_choice_verified_and_the_comparison(browser, measured_package, pages):
    with _serve(measured_package, pages) as server:
        context = browser.new_context()
        page = context.new_page()
        console_errors: list[str] = []
        page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
        try:
            page.goto(server.url + "index.html?select=measured")
            page.wait_for_function("window.packDemo && window.packDemo.trials", timeout=120_000)
            measured = page.evaluate("window.packDemo")
            shown = page.inner_text("#info")
            page.goto(server.url + "index.html?select=measured")
            page.wait_for_function("window.packDemo && window.packDemo.trials", timeout=120_000)
            cached = page.evaluate("window.packDemo")
            cached_shown = page.inner_text("#info")
            page.goto(server.url + "index.html?select=chain")
            page.wait_for_function("window.packDemo", timeout=120_000)
            chain = page.evaluate("window.packDemo")
            page.goto((measured_package / "index.html").as_uri())
            page.wait_for_function("window.packDemo", timeout=30_000)
            from_file = page.evaluate("window.packDemo")
            file_status = page.inner_text("#status")
        finally:
            context.close()
    assert measured["ok"], measured["error"]
    # the demo page's own listeners (trial progress on the status line) must not throw
    assert not [text for text in console_errors if "listener threw" in text], console_errors
    # The first result came from the chain's first choice; the trials ran after it and chose wasm.
    assert (measured["ep"], measured["verified"], measured["selection"]["mode"], measured["selection"]["fromCache"]) == ("webgpu", "unverified", "measured", False)
    assert measured["selection"]["choice"] == {"ep": "wasm", "variant": "fp32"} and measured["trials"]["ran"] is True and measured["trials"]["ms"] > 0
    assert measured["firstResultMs"] > 0 and measured["fetched"]["files"] >= 4 and measured["fetched"]["wireBytes"] > 0
    assert "first result" in shown and " ms after the page opened" in shown and "on the wire" in shown
    assert " ms in the background (" in shown and "later visits the wasm bundle" in shown
    assert measured["comparison"]["passed"] is True
    assert measured["comparison"]["text"].startswith("matches the build's fp32 reference: y: max_abs_of_range ")
    assert "≤ 0.001, rel_l2 " in measured["comparison"]["text"]
    assert "wasm/fp32 by measured now; candidates: " in shown and "matches the build's fp32 reference" in shown and "unverified" in shown
    assert cached["ok"] and cached["selection"]["fromCache"] is True and cached["ep"] == "wasm" and cached["trials"]["ran"] is False
    assert "measured earlier on this device (cached decision)" in cached_shown
    assert chain["ok"] and (chain["ep"], chain["selection"]["mode"]) == ("webgpu", "chain")
    assert chain["comparison"]["passed"] is True and "rel_l2" in chain["comparison"]["text"]
    assert from_file["ok"] is False and "pack serve dist/loader-test-conv" in from_file["error"]
    assert "opened from a file:// URL" in file_status and "pack serve dist/loader-test-conv" in file_status
