"""Browser checks in headless Chromium (SwiftShader WebGPU + wasm) on tiny packages.

One browser for the module; each package is built once. Models are tiny (SwiftShader ~0.2 GFLOP/s).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from browser_helpers import (
    ALL_PLATFORMS, Variant, conv_model, cpu_fallback_model, matmul_models, negative_step_slice_model,
    reference_of, thresholds_for, write_package,
)
from pipeline.verify.engines.browser.chromium import launch_browser
from pipeline.verify.engines.browser.harness import verify_in_browser

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    with launch_browser() as shared:
        yield shared


@pytest.fixture(scope="module")
def slice_package(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("slice")
    model = negative_step_slice_model()
    feeds = {"x": np.arange(31, dtype=np.float32).reshape(1, 1, 1, 31)}
    package = write_package(tmp / "slice", {"fp32": Variant(model)}, feeds, chains=ALL_PLATFORMS)
    return package, reference_of(model, feeds, tmp)


@pytest.fixture(scope="module")
def fp16_package(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("fp16")
    fp32, fp16 = matmul_models()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)}
    package = write_package(tmp / "mm", {"fp16": Variant(fp16, "fp16", ["shader-f16"]), "fp32": Variant(fp32)}, feeds)
    return package, reference_of(fp32, feeds, tmp)


def _by_run(result) -> dict[tuple[str, str, str], list[dict]]:
    runs: dict[tuple[str, str, str], list[dict]] = {}
    for check in result.checks:
        runs.setdefault((check["bundle"], check["ep"], check["variant"]), []).append(check)
    return runs


def test_negative_step_slice_gives_31_elements_on_the_webgpu_build_and_wasm(browser, slice_package) -> None:
    package, reference = slice_package
    result = verify_in_browser(package, reference, thresholds_for(package), browser=browser)
    runs = _by_run(result)
    # desktop/android: the webgpu build on webgpu and on wasm; apple-mobile: the wasm build on wasm
    assert set(runs) == {("webgpu", "webgpu", "fp32"), ("webgpu", "wasm", "fp32"), ("wasm", "wasm", "fp32")}
    assert [c["status"] for c in result.checks] == ["passed"] * 3
    for run in result.report["runs"]:
        assert run["output_shapes"] == {"y": [1, 1, 1, 31]}
        assert run["crossOriginIsolated"] is True
        assert run["timings_ms"]["session_create_ms"] > 0 and run["timings_ms"]["steady_runs"] >= 1
        assert run["info"]["ep"] == run["ep"]  # the loader ran the EP it was asked for
        # times come from production settings; verbose logs and the profiler only in the labelled pass
        assert run["timed_pass"]["verbose_log_lines"] == 0
        assert run["profile_pass"]["ok"] is True and "not production" in run["profile_pass"]["settings"]
    assert result.report["adapter"]["available"] and "shader-f16" not in result.report["adapter"]["features"]
    assert not result.failed


def test_root_build_drops_an_element_and_is_caught(browser, slice_package) -> None:
    package, reference = slice_package
    result = verify_in_browser(package, reference, thresholds_for(package), browser=browser, bundle="root")
    webgpu = [c for c in result.checks if c["ep"] == "webgpu"]
    assert [c["status"] for c in webgpu] == ["failed"]
    assert webgpu[0]["metrics"]["shape"] == [1, 1, 1, 30]
    assert "output-size mismatch" in webgpu[0]["detail"] and "{1,1,1,30}" in webgpu[0]["detail"]
    assert {c["status"] for c in result.checks if c["ep"] == "wasm"} == {"passed"}  # JSEP's bug is WebGPU-only
    assert result.failed


def test_fp16_without_shader_f16_is_not_verifiable_on_the_native_build(browser, fp16_package) -> None:
    package, reference = fp16_package
    result = verify_in_browser(package, reference, thresholds_for(package), browser=browser)
    runs = _by_run(result)
    fp16 = runs[("webgpu", "webgpu", "fp16")]
    assert [c["status"] for c in fp16] == ["not-verifiable"]
    assert "requires shader-f16" in fp16[0]["detail"] and "requires f16 but the device does not support it" in fp16[0]["detail"]
    assert [c["status"] for c in runs[("webgpu", "webgpu", "fp32")]] == ["passed"]
    assert [c["status"] for c in runs[("webgpu", "wasm", "fp32")]] == ["passed"]
    # every variant an EP can be asked for runs: wasm x fp16 too, though no chain picks it by default
    assert [c["status"] for c in runs[("webgpu", "wasm", "fp16")]] == ["passed"]
    wasm_fp16 = next(r for r in result.report["runs"] if (r["ep"], r["variant"]) == ("wasm", "fp16"))
    assert wasm_fp16["default"] is False and wasm_fp16["info"]["variant"] == "fp16"
    assert not result.failed


def test_root_build_silent_zeros_for_fp16_are_caught(browser, fp16_package) -> None:
    package, reference = fp16_package
    result = verify_in_browser(package, reference, thresholds_for(package), browser=browser, bundle="root")
    fp16 = [c for c in result.checks if c["variant"] == "fp16" and c["ep"] == "webgpu"]
    assert [c["status"] for c in fp16] == ["failed"]
    assert "'f16' type used without 'f16' extension enabled" in fp16[0]["detail"]
    assert fp16[0]["metrics"]["rel_l2"] == pytest.approx(1.0)  # all zeros
    run = next(r for r in result.report["runs"] if r["variant"] == "fp16" and r["ep"] == "webgpu")
    assert any(s.startswith("WebGPU GPUValidationError") for s in run["signals"])


def test_node_without_webgpu_kernel_is_listed_as_cpu_fallback(browser, tmp_path) -> None:
    model = cpu_fallback_model()
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 3, 3)).astype(np.float32)}
    package = write_package(tmp_path / "det", {"fp32": Variant(model)}, feeds)
    result = verify_in_browser(package, reference_of(model, feeds, tmp_path), thresholds_for(package), browser=browser)
    webgpu = next(r for r in result.report["runs"] if r["ep"] == "webgpu")
    assert webgpu["cpu_fallback"] == [{"op": "Det", "node": "determinant", "reason": "no kernel on the EP"}]
    assert result.report["eps"]["webgpu/fp32"]["cpu_fallback_nodes"] == ["Det (determinant)"]
    assert next(r for r in result.report["runs"] if r["ep"] == "wasm")["cpu_fallback"] == []
    assert {c["status"] for c in result.checks} == {"passed"}
    assert all(k["op"] in {"Relu", "Neg", "Det"} for k in webgpu["slowest_kernels"])


def test_wrong_fp32_conv_on_webgpu_fails_and_the_manifest_ep_option_fixes_it(browser, tmp_path) -> None:
    model = conv_model(in_channels=9)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 9, 8, 8)).astype(np.float32)}
    reference = reference_of(model, feeds, tmp_path)
    default = write_package(tmp_path / "nhwc", {"fp32": Variant(model)}, feeds)
    nchw = write_package(tmp_path / "nchw", {"fp32": Variant(model)}, feeds, ep_options={"webgpu": {"preferredLayout": "NCHW"}})
    broken = _by_run(verify_in_browser(default, reference, thresholds_for(default), browser=browser))
    assert broken[("webgpu", "webgpu", "fp32")][0]["status"] == "failed"
    assert broken[("webgpu", "webgpu", "fp32")][0]["metrics"]["max_abs_of_range"] > 0.1
    assert broken[("webgpu", "wasm", "fp32")][0]["status"] == "passed"
    fixed = verify_in_browser(nchw, reference, thresholds_for(nchw), browser=browser)
    assert {c["status"] for c in fixed.checks} == {"passed"}


def test_watchdog_turns_a_slow_run_into_a_failed_check(browser, slice_package) -> None:
    package, reference = slice_package
    result = verify_in_browser(package, reference, thresholds_for(package), browser=browser, watchdog_ms=50)
    assert {c["status"] for c in result.checks} == {"failed"}
    assert all("watchdog" in c["detail"] and "inputs {'x': [1, 1, 1, 31]}" in c["detail"] for c in result.checks), [c["detail"] for c in result.checks]
