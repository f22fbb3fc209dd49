"""The build verifies the package as an app loads it: the default-load checks
from a page's answer, the verdict they give, the summary's one line (no browser); and a real
`pack build` whose default load runs in Chromium, passing, then made to fail (exit 1)."""

from __future__ import annotations

import base64
import contextlib
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.verify.engines.browser import default_load
from pipeline.verify.engines.browser.default_load import (
    default_load_lines, default_load_problems, default_load_stage, failing_pairs, judge_default_load, memory_budget_lines, memory_text, narrowed_chain,
    narrowed_lines,
)

MANIFEST = {
    "executionProviders": {"desktop": ["webgpu", "wasm"]},
    "loader": {"watchdogMs": 60000, "prewarm": True, "select": "measured"},
    "thresholds": {"wasm": {"fp32": {"y": {"max_abs_of_range": 1e-3, "rel_l2": 1e-3}}}},
    "outputs": [{"name": "y", "kind": "tensor"}],
    "verification": {"passed": True},
}
REFERENCE = {"y": np.linspace(-1, 1, 100, dtype=np.float32)}


def answer(y: np.ndarray, **info) -> dict:
    encoded = {"type": "float32", "dims": list(y.shape), "bytes": base64.b64encode(y.astype("<f4").tobytes()).decode()}
    return {"ok": True, "outputs": {"y": encoded}, "loadMs": 812.3,
            "info": {"ep": "wasm", "variant": "fp32", "bundle": "wasm", "fallbacks": [], "prewarmError": None, "threads": 2, "threadsWhy": "x", **info}}


def test_a_right_default_load_passes_with_its_figure_and_bound():
    checks = judge_default_load(MANIFEST, REFERENCE, answer(REFERENCE["y"] + 1e-5))
    [only] = checks
    assert (only["stage"], only["check"], only["ep"], only["variant"], only["bundle"], only["output"], only["status"]) == (
        "default-load", "default-load", "wasm", "fp32", "wasm", "y", "passed")
    assert only["threshold"] == {"max_abs_of_range": 1e-3, "rel_l2": 1e-3} and only["chain"] == ["webgpu", "wasm"] and only["select"] == "measured"
    assert default_load_problems(checks) == []
    [line] = default_load_lines(checks)
    assert line.startswith("default load: ok   wasm/fp32 (desktop chain webgpu > wasm, pre-warm on, select measured; 2 threads): y ")
    assert "(<= 0.001)" in line and "\n" not in line


def test_wrong_outputs_or_a_failed_load_fail_the_package():
    wrong = judge_default_load(MANIFEST, REFERENCE, answer(REFERENCE["y"] + 0.5, fallbacks=[{"ep": "webgpu", "variant": "fp16", "phase": "prewarm", "error": "e"}]))
    assert [c["status"] for c in wrong] == ["failed"]
    [line] = default_load_lines(wrong)
    assert "passed over webgpu/fp16 (prewarm)" in line and line.startswith("default load: FAIL")
    failed = judge_default_load(MANIFEST, REFERENCE, {"ok": False, "message": "no execution provider worked (webgpu/fp32: sr = 0)", "fallbacks": []})
    assert [(c["status"], c["ep"], c["variant"]) for c in failed] == [("failed", "webgpu", "*")]
    assert "load() with the manifest's defaults failed: no execution provider worked" in failed[0]["detail"]
    problems = default_load_problems(failed)
    assert problems and problems[0].startswith("default load (webgpu/*): load() with the manifest's defaults failed")


def test_without_a_browser_the_default_load_is_recorded_skipped():
    out = default_load_stage("unused", MANIFEST, [], {"passed": True, "verdict": []}, REFERENCE, enabled=False, gpu=False)
    [only] = out["checks"]
    assert (only["stage"], only["status"], only["detail"]) == ("default-load", "skipped", "--no-browser")
    assert out["verdict"]["passed"] is True and out["manifest"]["verification"]["passed"] is True


@pytest.mark.browser
@pytest.mark.slow
def test_pack_build_loads_the_package_with_its_defaults_and_fails_when_that_fails(tmp_path, monkeypatch, capsys):
    from test_loader_defaults_browser import sample, sr_model
    import onnx

    onnx.save(sr_model(), str(tmp_path / "sr_model.onnx"))
    np.savez(tmp_path / "sample.npz", **sample())
    args = ["build", str(tmp_path / "sr_model.onnx"), "--inputs", str(tmp_path / "sample.npz"), "--json", "--no-reuse"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "ok")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    mine = [c for c in report["checks"] if c["stage"] == "default-load"]
    assert mine and {c["status"] for c in mine} == {"passed"}, mine
    assert mine[0]["check"] == "default-load" and mine[0]["output"] == "y" and mine[0]["prewarmError"] is None
    assert report["timings"]["default_load_s"] < 30
    # the build's summary: one human line with the figure and the bound
    from pipeline.commands.summary import print_summary

    print_summary(report, tmp_path / "ok" / "sr_model")
    [line] = [text for text in capsys.readouterr().out.splitlines() if text.startswith("default load:")]
    assert line.startswith("default load: ok   ") and "(<= " in line, line
    # A load that fails (here: a page whose load() throws) fails the package: exit 1, the verdict says why.
    monkeypatch.setattr(default_load, "EVALUATE", "() => ({ ok: false, message: 'no execution provider worked (injected)', fallbacks: [] })")
    failed = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "bad")])
    assert failed.exit_code == 1, failed.output
    report = json.loads(failed.stdout)
    assert report["passed"] is False
    assert any(line.startswith("default load (webgpu/*): load() with the manifest's defaults failed: no execution provider worked (injected)") for line in report["verdict"]), report["verdict"]
    manifest = json.loads((tmp_path / "bad" / "sr_model" / "manifest.json").read_text())
    assert manifest["verification"]["passed"] is False


def test_firefox_not_installed_is_not_verifiable_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PACK_FIREFOX", str(tmp_path / "no-firefox"))
    out = default_load_stage(tmp_path, MANIFEST, [], {"passed": True, "verdict": []}, REFERENCE, enabled=True, gpu=False, remote_only=True,
                             engines=("chromium", "firefox"))
    chromium, firefox = out["checks"]
    assert (chromium["engine"] if "engine" in chromium else "chromium", chromium["status"]) == ("chromium", "skipped")
    assert (firefox["engine"], firefox["status"], firefox["install"]) == ("firefox", "not-verifiable", "apt-get install firefox-esr")
    assert "Firefox is not installed" in firefox["detail"] and "apt-get install firefox-esr" in firefox["detail"]
    assert out["verdict"]["passed"] is True  # an engine that is absent is not verifiable, not failed
    lines = default_load_lines(out["checks"])
    assert lines[1].startswith("default load in firefox: n/v  Firefox is not installed")


def test_webkit_not_installed_is_not_verifiable_with_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PACK_MINIBROWSER", str(tmp_path / "no-minibrowser"))
    out = default_load_stage(tmp_path, MANIFEST, [], {"passed": True, "verdict": []}, REFERENCE, enabled=True, gpu=False, remote_only=True,
                             engines=("webkit",))
    [webkit] = out["checks"]
    assert (webkit["engine"], webkit["status"], webkit["install"]) == ("webkit", "not-verifiable", "apt-get install webkit2gtk-driver xvfb")
    assert webkit["detail"].startswith("WebKit is not installed") and webkit["detail"].endswith("install it: apt-get install webkit2gtk-driver xvfb")
    assert out["verdict"]["passed"] is True
    [line] = default_load_lines(out["checks"])
    assert line.startswith("default load in webkit: n/v  WebKit is not installed")


def test_one_thread_is_shown_with_its_reason_and_the_page_facts_are_kept():
    why = "this browser has no SharedArrayBuffer although the page is cross-origin isolated"
    result = {**answer(REFERENCE["y"], threads=1, threadsWhy=why), "page": {"crossOriginIsolated": True, "sharedArrayBuffer": False}, "warnings": ["w"]}
    [only] = judge_default_load(MANIFEST, REFERENCE, result, engine="webkit")
    assert (only["threads"], only["threadsWhy"], only["page"]["sharedArrayBuffer"], only["warnings"]) == (1, why, False, ["w"])
    [line] = default_load_lines([only])
    assert line.startswith(f"default load in webkit: ok   wasm/fp32 (desktop chain webgpu > wasm, pre-warm on, select measured; 1 thread: {why}): y ")


def test_an_unknown_engine_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["build", "nothing.onnx", "--engines", "chromium,safari", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--engines 'chromium,safari': use a comma-separated list of chromium, firefox, webkit" in result.output


def _row(status: str, ep: str, variant: str, **facts) -> dict:
    return {"stage": "default-load", "ep": ep, "variant": variant, "status": status, **facts}


def test_the_narrowing_rule_drops_the_eps_of_the_pairs_that_failed():
    wrong_outputs = _row("failed", "webgpu", "fp16", output="y", detail="rel_l2 0.4 > 0.03", engine="firefox")
    threw = _row("failed", "webgpu", "*", fallbacks=[{"ep": "webgpu", "variant": None, "phase": "select", "error": "no adapter"},
                                                    {"ep": "webgpu", "variant": "fp32", "phase": "create", "error": "shader"},
                                                    {"ep": "wasm", "variant": "fp32", "phase": "run", "error": "OOM"}])
    assert failing_pairs([wrong_outputs, _row("passed", "wasm", "fp32", output="y")]) == [
        {"engine": "firefox", "ep": "webgpu", "variant": "fp16", "error": "y: rel_l2 0.4 > 0.03"}]
    # a provider passed over before it was tried (no adapter) is no failed pair; one that failed creating or running is
    assert [(p["ep"], p["variant"], p["error"]) for p in failing_pairs([threw])] == [("webgpu", "fp32", "create: shader"), ("wasm", "fp32", "run: OOM")]
    both = ["webgpu", "wasm"]
    assert narrowed_chain(both, failing_pairs([wrong_outputs]), ["webgpu", "wasm"]) == ["wasm"]
    assert narrowed_chain(both, failing_pairs([threw]), ["webgpu", "wasm"]) is None  # nothing left
    assert narrowed_chain(both, failing_pairs([wrong_outputs]), ["webgpu"]) is None  # [wasm] needs the wasm bundle
    assert narrowed_chain(["wasm"], failing_pairs([wrong_outputs]), ["webgpu", "wasm"]) is None  # drops nothing


def test_a_narrowed_chain_is_evidence_not_a_failure_and_the_summary_says_so():
    narrowed = _row("failed", "webgpu", "fp16", output="y", detail="d", narrowedTo=["wasm"], platform="desktop")
    kept = _row("passed", "wasm", "fp32", output="y", platform="desktop", chain=["wasm"], metrics={}, threshold={})
    assert default_load_problems([narrowed, kept]) == []
    assert [line.split(":")[0] for line in default_load_lines([narrowed, kept])] == ["default load"]  # the row of the chain as shipped
    manifest = {"verification": {"narrowedChains": [{"platform": "desktop", "from": ["webgpu", "wasm"], "to": ["wasm"], "evidence": "default load in firefox failed on webgpu/fp16: y: d"}]}}
    assert narrowed_lines(manifest) == ["NARROWED CHAIN: desktop webgpu > wasm -> wasm (default load in firefox failed on webgpu/fp16: y: d)"]


def test_the_apple_mobile_memory_budget_warns_and_names_the_key():
    memory = {"first": {"peakMb": 1300.5, "pid": 7, "samples": 40, "processes": 1}, "reload": {"peakMb": 900.0, "pid": 7, "samples": 30, "processes": 1}}
    rows = [_row("passed", "wasm", "fp32", output="y", platform="apple-mobile", engine="webkit", memory=memory),
            _row("passed", "wasm", "fp32", output="y", platform="desktop", engine="webkit", memory=memory)]
    [line] = memory_budget_lines(rows, 1024)
    assert line.startswith("the apple-mobile default load in webkit peaked at 1300.5 MB (peak 1300.5 MB first load, 900.0 MB reload), over [verify] apple_mobile_memory_mb 1024")
    assert memory_budget_lines(rows, 2048) == []
    assert memory_text({"first": {"why": "no /proc here"}}) == ""


def test_recipe_key_apple_mobile_memory_mb_is_checked(tmp_path):
    from pipeline.errors import PackError
    from pipeline.recipe import load_recipe_file

    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[source]\nuri = "m.onnx"\n')
    assert load_recipe_file(recipe).verify_apple_mobile_memory_mb == 1024
    recipe.write_text('name = "r"\n[source]\nuri = "m.onnx"\n[verify]\napple_mobile_memory_mb = 1500\n')
    assert load_recipe_file(recipe).verify_apple_mobile_memory_mb == 1500
    for bad in ("0", "-5", '"1GB"', "true"):
        recipe.write_text(f'name = "r"\n[source]\nuri = "m.onnx"\n[verify]\napple_mobile_memory_mb = {bad}\n')
        with pytest.raises(PackError, match=r"r.toml: key 'verify.apple_mobile_memory_mb': expected a positive number of MB|r.toml: key 'verify.apple_mobile_memory_mb': expected a number of MB"):
            load_recipe_file(recipe)


def test_memory_is_read_from_the_processes_own_accounting():
    import os
    import time

    from pipeline.verify.engines.browser import memory

    if not memory.PROC.is_dir():
        pytest.skip("no /proc")
    assert memory.rss_kib(os.getpid()) > 1000  # this Python holds more than 1 MB
    assert os.getpid() in memory.descendants(os.getppid())
    assert memory.is_content("chromium", ["/usr/lib/chromium/chromium --type=renderer --lang=en-US"])
    assert memory.is_content("firefox", ["firefox-esr", "-contentproc", "-isForBrowser", "tab"]) and not memory.is_content("firefox", ["firefox-esr", "-contentproc", "socket"])
    assert memory.is_content("webkit", ["/usr/lib/x86_64-linux-gnu/webkit2gtk-4.1/WebKitWebProcess", "7"])
    with memory.PeakSampler(os.getppid(), "nothing") as sampler:  # no content process of that engine: a phase says why
        sampler.start_phase("first")
        time.sleep(0.2)
        sampler.end_phase()
    assert sampler.peaks() == {"first": {"why": "no nothing content process was found"}}


@pytest.fixture(scope="module")
def three_engines(tmp_path_factory):
    """One `pack build --engines chromium,firefox,webkit` of the tiny scalar-selector model: (its
    report, its summary's lines). Where Firefox or WebKit is absent its check says not-verifiable.
    A stored build of the same key is reused (its key holds the code and each engine's version)."""
    from test_loader_defaults_browser import sample, sr_model
    import onnx

    from pipeline.commands.summary import print_summary

    folder = tmp_path_factory.mktemp("engines")
    onnx.save(sr_model(), str(folder / "sr_model.onnx"))
    np.savez(folder / "sample.npz", **sample())
    result = CliRunner().invoke(app, ["build", str(folder / "sr_model.onnx"), "--inputs", str(folder / "sample.npz"), "--json",
                                      "--engines", "chromium,firefox,webkit", "--out", str(folder / "d")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_summary(report, folder / "d" / "sr_model")
    return report, printed.getvalue().splitlines(), folder / "d" / "sr_model"


def _engine_checks(report: dict, engine: str, platform: str = "desktop") -> list[dict]:
    return [c for c in report["checks"] if c["stage"] == "default-load" and c.get("engine") == engine and c.get("platform") == platform]


@pytest.mark.browser
@pytest.mark.slow
def test_firefox_loads_the_package_with_its_defaults(three_engines):
    """Debian's firefox-esr through puppeteer-core over WebDriver BiDi (scripts/setup.sh installs
    it); where it is absent the check says not-verifiable with the install line."""
    from pipeline.verify.engines.browser.firefox import unavailable

    report, _, _ = three_engines
    firefox = _engine_checks(report, "firefox")
    if unavailable():
        assert [(c["status"], c["install"]) for c in firefox] == [("not-verifiable", "apt-get install firefox-esr")]
        return
    assert [(c["output"], c["status"]) for c in firefox] == [("y", "passed")], firefox
    assert firefox[0]["browser"].startswith("firefox/") and firefox[0]["prewarmError"] is None
    # WebGPU: Debian 12's firefox-esr 140 has none ("not yet available in Release"); the loader says so and runs wasm
    assert firefox[0]["ep"] in ("webgpu", "wasm")
    if firefox[0]["ep"] == "wasm":
        assert firefox[0]["threads"] >= 1


@pytest.mark.browser
@pytest.mark.slow
def test_webkit_loads_the_package_with_its_defaults_on_wasm_with_one_thread(three_engines):
    """WebKitGTK's MiniBrowser through WebKitWebDriver and selenium, under Xvfb (scripts/setup.sh
    installs them); where they are absent the check says not-verifiable with the install line."""
    from pipeline.verify.engines.browser.webkit import unavailable

    report, lines, _ = three_engines
    webkit = _engine_checks(report, "webkit")
    if unavailable():
        assert [(c["status"], c["install"]) for c in webkit] == [("not-verifiable", "apt-get install webkit2gtk-driver xvfb")]
        return
    # the sample's outputs, right, with the bounds of the pair it landed on
    assert [(c["output"], c["status"]) for c in webkit] == [("y", "passed")], webkit
    [only] = webkit
    assert only["browser"].startswith("webkitgtk/") and only["prewarmError"] is None
    assert only["metrics"]["max_abs_of_range"] <= only["threshold"]["max_abs_of_range"]
    # no WebGPU here: the loader passes over webgpu, says why, and lands on wasm
    assert (only["ep"], only["variant"]) == ("wasm", "fp32")
    assert [(f["ep"], f["phase"]) for f in only["fallbacks"]] == [("webgpu", "select")] and "navigator.gpu is undefined" in only["fallbacks"][0]["error"]
    # isolated without SharedArrayBuffer: one thread, and the reason
    assert (only["page"]["crossOriginIsolated"], only["page"]["sharedArrayBuffer"], only["page"]["webgpu"]) == (True, False, False)
    assert only["threads"] == 1 and "no SharedArrayBuffer although the page is cross-origin isolated" in only["threadsWhy"]
    [line] = [text for text in lines if text.startswith("default load in webkit:")]
    assert line.startswith("default load in webkit: ok   wasm/fp32 (desktop chain webgpu > wasm, pre-warm on, select measured; 1 thread: this browser has no SharedArrayBuffer"), line
    # the three engines, one line each per platform chain
    assert [text.split(":")[0] for text in lines if text.startswith("default load")] == [
        f"default load{engine}{platform}" for platform in ("", " (apple-mobile)", " (android)") for engine in ("", " in firefox", " in webkit")]


@pytest.mark.browser
@pytest.mark.slow
def test_each_platform_chain_loads_in_each_engine_with_the_peak_memory_of_its_content_process(three_engines):
    """One row per (engine, platform): the page presents itself as an iPhone or an Android phone to
    the loader, which takes that platform's chain and thread rule; each row has the peak memory of
    the engine's content process for the first load and for the reload from Cache Storage."""
    from pipeline.verify.engines.browser import firefox, webkit

    report, lines, package = three_engines
    engines = ["chromium"] + [name for name, driver in (("firefox", firefox), ("webkit", webkit)) if not driver.unavailable()]
    for engine in engines:
        for platform, chain in (("desktop", ["webgpu", "wasm"]), ("apple-mobile", ["wasm"]), ("android", ["webgpu", "wasm"])):
            [row] = _engine_checks(report, engine, platform)
            assert (row["status"], row["chain"], row["output"]) == ("passed", chain, "y"), (engine, platform, row)
            if platform == "apple-mobile":  # the loader's Apple rule: one wasm thread
                assert row["threads"] == 1 and row["ep"] == "wasm", row
            # the first load fetched the model it landed on; the reload read every package file from Cache Storage
            model = json.loads((package / "manifest.json").read_text())["variants"][row["variant"]]["model"]
            assert any(name.startswith(model) for name in row["fetched"]["first"]) and row["fetched"]["reload"] == [], (engine, platform, row["fetched"])
            for phase in ("first", "reload"):
                figure = row["memory"][phase]
                # a browser content process holding onnxruntime-web's wasm heap: tens to hundreds of MB, never 0 or tens of GB
                assert 20 < figure["peakMb"] < 8192 and figure["pid"] > 0 and figure["samples"] >= 1, (engine, platform, figure)
            [line] = [text for text in lines if text.startswith("default load" + ("" if engine == "chromium" else f" in {engine}") + ("" if platform == "desktop" else f" ({platform})") + ":")]
            assert f"peak {row['memory']['first']['peakMb']} MB first load, {row['memory']['reload']['peakMb']} MB reload" in line, line


def _with_a_wrong_variant(package, wasm_too: bool = False) -> tuple[dict, dict]:
    """The package's manifest with a variant "bad" (gain 1.5 where the model has 0.75: every output
    twice the reference) first for webgpu (and for wasm with `wasm_too`), chain selection and no
    priors: the loader's default path lands on webgpu/bad where there is an adapter. Returns
    (manifest, reference)."""
    import hashlib

    from onnx import numpy_helper
    from test_loader_defaults_browser import reference, sample, sr_model

    model = sr_model()
    [gain] = [t for t in model.graph.initializer if t.name == "gain"]
    gain.CopyFrom(numpy_helper.from_array(np.array(1.5, np.float32), "gain"))
    data = model.SerializeToString()
    (package / "model.bad.onnx").write_bytes(data)
    manifest = json.loads((package / "manifest.json").read_text())
    digest = hashlib.sha256(data).digest()
    manifest["files"]["model.bad.onnx"] = {"sha256": digest.hex(), "integrity": "sha256-" + base64.b64encode(digest).decode(), "size": len(data),
                                           "mediaType": "application/octet-stream", "encodings": {}, "cache": "immutable"}
    manifest["variants"]["bad"] = {"precision": "fp32", "model": "model.bad.onnx", "requires": []}
    manifest["variantFor"]["webgpu"] = ["bad"]
    if wasm_too:
        manifest["variantFor"]["wasm"] = ["bad"]
    for ep in ("webgpu", "wasm"):
        manifest["thresholds"][ep]["bad"] = manifest["thresholds"][ep]["fp32"]
    manifest["loader"]["select"] = "chain"
    manifest["measurements"] = []
    manifest["executionProviders"] = {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]}
    return manifest, {"y": reference(sample())}


@pytest.mark.browser
@pytest.mark.slow
def test_a_chain_whose_default_load_fails_is_narrowed_where_a_narrower_chain_passes(three_engines, tmp_path):
    """A pair wrong by construction (webgpu/bad: twice the reference) that the desktop chain lands
    on in Chromium (SwiftShader has an adapter): the chain is narrowed to wasm, which passes, with
    the evidence; the package passes. With wasm wrong too no narrower chain passes: it fails."""
    import shutil

    from pipeline.manifest import validate

    _, _, built_package = three_engines
    package = tmp_path / "p"
    shutil.copytree(built_package, package)
    manifest, reference = _with_a_wrong_variant(package)
    out = default_load_stage(package, manifest, [], {"passed": True, "verdict": []}, reference, enabled=True, gpu=False)
    rows = out["checks"]
    [evidence] = [c for c in rows if "narrowedTo" in c]
    assert (evidence["platform"], evidence["ep"], evidence["variant"], evidence["status"], evidence["narrowedTo"]) == ("desktop", "webgpu", "bad", "failed", ["wasm"])
    desktop = [c for c in rows if c["platform"] == "desktop" and "narrowedTo" not in c]
    assert [(c["ep"], c["variant"], c["status"], c["chain"]) for c in desktop] == [("wasm", "fp32", "passed", ["wasm"])]
    assert out["verdict"]["passed"] is True and out["manifest"]["verification"]["passed"] is True
    assert out["manifest"]["executionProviders"] == {"desktop": ["wasm"], "apple-mobile": ["wasm"]}
    [narrowing] = out["manifest"]["verification"]["narrowedChains"]
    assert (narrowing["platform"], narrowing["from"], narrowing["to"]) == ("desktop", ["webgpu", "wasm"], ["wasm"])
    assert narrowing["evidence"].startswith("default load failed on webgpu/bad: y: max_abs_of_range ")
    validate(out["manifest"], "manifest.json")  # the schema knows narrowedChains
    assert [line.split(":")[0] for line in default_load_lines(rows)] == ["default load", "default load (apple-mobile)"]
    # wasm wrong too: nothing narrower passes; the package fails on both loads and the chain stays
    manifest, reference = _with_a_wrong_variant(package, wasm_too=True)
    manifest["executionProviders"] = {"desktop": ["webgpu", "wasm"]}
    out = default_load_stage(package, manifest, [], {"passed": True, "verdict": []}, reference, enabled=True, gpu=False)
    assert out["verdict"]["passed"] is False and out["manifest"]["executionProviders"]["desktop"] == ["webgpu", "wasm"]
    assert "narrowedChains" not in out["manifest"]["verification"]
    problems = [line for line in out["verdict"]["verdict"] if line.startswith("default load (")]
    assert [line.split(":")[0] for line in problems] == ["default load (webgpu/bad y)", "default load (wasm/bad y)"], problems


def test_each_virtual_display_takes_a_free_number_and_ends_with_its_block():
    from pipeline.verify.engines.browser.xvfb import virtual_display, xvfb_executable

    if xvfb_executable() is None:
        pytest.skip("no Xvfb (apt-get install xvfb)")
    with virtual_display() as (first, first_process), virtual_display() as (second, second_process):
        assert first.startswith(":") and second.startswith(":") and first != second
        assert first_process.poll() is None and second_process.poll() is None
    assert first_process.poll() is not None and second_process.poll() is not None


@pytest.mark.browser
def test_a_webkit_page_that_never_yields_ends_as_a_failed_load_within_its_limit(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading
    import time

    from pipeline.verify.engines.browser import webkit

    if webkit.unavailable():
        pytest.skip(webkit.unavailable())
    (tmp_path / "index.html").write_text("<script>window.__packStartDefaultLoad = () => setTimeout(() => { for (;;); }, 10);</script>")
    monkeypatch.setattr(webkit, "LAUNCH_S", 3)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/index.html"
        started = time.monotonic()
        answer = webkit.run_visits(url, url, [{"name": "first"}], 2000)["first"]
    finally:
        server.shutdown()
    assert answer == {"ok": False, "message": "WebKit did not answer within 5 s (its page never yielded)", "fallbacks": []}
    assert time.monotonic() - started < 20
