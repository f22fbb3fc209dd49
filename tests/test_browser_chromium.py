"""Chromium launch: flags, a missing browser, and a browser without a WebGPU adapter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from browser_helpers import Variant, negative_step_slice_model, reference_of, thresholds_for, write_package
from pipeline.errors import PackError
from pipeline.verify.engines.browser.chromium import chromium_path, launch_browser, launch_flags
from pipeline.verify.engines.browser.harness import verify_in_browser


def test_gpu_flags_select_a_hardware_vulkan_adapter_with_f16() -> None:
    assert "--enable-unsafe-webgpu" in launch_flags() and "--use-angle=vulkan" not in launch_flags()
    gpu = launch_flags(gpu=True)
    assert {"--use-angle=vulkan", "--use-vulkan=native", "--enable-features=Vulkan"} <= set(gpu)
    assert any("vulkan_enable_f16_on_nvidia" in flag for flag in gpu)
    assert "--enable-unsafe-webgpu" not in launch_flags(webgpu=False)


def test_missing_chromium_is_bad_input_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACK_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(PackError, match=r"chromium: not found.*apt-get install chromium.*--no-browser"):
        chromium_path()


@pytest.mark.browser
def test_without_an_adapter_webgpu_runs_are_not_verifiable_after_retries(tmp_path: Path) -> None:
    model = negative_step_slice_model()
    feeds = {"x": np.arange(31, dtype=np.float32).reshape(1, 1, 1, 31)}
    package = write_package(tmp_path / "slice", {"fp32": Variant(model)}, feeds)
    with launch_browser(webgpu=False) as browser:
        result = verify_in_browser(package, reference_of(model, feeds, tmp_path), thresholds_for(package), browser=browser)
    adapter = result.report["adapter"]
    assert adapter["available"] is False and adapter["attempts"] == 5
    statuses = {(c["ep"], c["status"]) for c in result.checks}
    assert statuses == {("webgpu", "not-verifiable"), ("wasm", "passed")}
    webgpu = next(c for c in result.checks if c["ep"] == "webgpu")
    assert "no WebGPU adapter" in webgpu["detail"] and "returned null 5 times" in webgpu["detail"]
    assert not result.failed
