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
from pipeline.verify.engines.browser.default_load import default_load_lines, default_load_problems, default_load_stage, judge_default_load

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


@pytest.fixture(scope="module")
def three_engines(tmp_path_factory):
    """One `pack build --engines chromium,firefox,webkit` of the tiny scalar-selector model: (its
    report, its summary's lines). Where Firefox or WebKit is absent its check says not-verifiable."""
    from test_loader_defaults_browser import sample, sr_model
    import onnx

    from pipeline.commands.summary import print_summary

    folder = tmp_path_factory.mktemp("engines")
    onnx.save(sr_model(), str(folder / "sr_model.onnx"))
    np.savez(folder / "sample.npz", **sample())
    result = CliRunner().invoke(app, ["build", str(folder / "sr_model.onnx"), "--inputs", str(folder / "sample.npz"), "--json", "--no-reuse",
                                      "--engines", "chromium,firefox,webkit", "--out", str(folder / "d")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_summary(report, folder / "d" / "sr_model")
    return report, printed.getvalue().splitlines()


def _engine_checks(report: dict, engine: str) -> list[dict]:
    return [c for c in report["checks"] if c["stage"] == "default-load" and c.get("engine") == engine]


@pytest.mark.browser
@pytest.mark.slow
def test_firefox_loads_the_package_with_its_defaults(three_engines):
    """Debian's firefox-esr through puppeteer-core over WebDriver BiDi (scripts/setup.sh installs
    it); where it is absent the check says not-verifiable with the install line."""
    from pipeline.verify.engines.browser.firefox import unavailable

    report, _ = three_engines
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

    report, lines = three_engines
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
    # the three engines, one line each
    assert [text.split(":")[0] for text in lines if text.startswith("default load")] == ["default load", "default load in firefox", "default load in webkit"]


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
