"""The webgpu-kernels stage on GTCRN, the default recipe (a real speech enhancer fetched from PyPI):
its fp16 and fp32 variants on onnxruntime's WebGPU kernels on lavapipe."""

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.verify.engines import webgpu_kernels

pytestmark = pytest.mark.network_registry
REASON = webgpu_kernels.unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"webgpu-kernels not available: {REASON}")
def test_gtcrn_fp16_and_fp32_pass_on_webgpu_kernels(tmp_path):
    result = CliRunner().invoke(app, ["build", "gtcrn", "--no-browser", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "gtcrn" / "report.json").read_text())
    manifest = json.loads((tmp_path / "gtcrn" / "manifest.json").read_text())
    checks = [c for c in report["checks"] if c["stage"] == "webgpu-kernels"]
    assert {(c["variant"], c["output"]) for c in checks} == {(v, o) for v in ("fp16", "fp32") for o in ("enh", "conv_cache_out", "tra_cache_out", "inter_cache_out")}
    assert all(c["status"] == "passed" and c["ep"] == "webgpu" for c in checks), [c for c in checks if c["status"] != "passed"]
    [enh16] = [c for c in checks if c["variant"] == "fp16" and c["output"] == "enh"]
    assert enh16["threshold"]["snr_db"] == 15.0 and enh16["metrics"]["snr_db"] >= 15.0  # the audio WebGPU bound
    runs = report["webgpu_kernels"]["runs"]
    assert runs["fp32"]["webgpu_nodes"] > 300 and runs["fp32"]["cpu_fallback_nodes"] == []
    # onnxruntime's WebGPU EP has no fp16 GRU kernel: those fall back to the CPU EP, and the report says so
    assert runs["fp16"]["webgpu_nodes"] > 300 and runs["fp16"]["cpu_fallback_nodes"] and all("(GRU)" in n for n in runs["fp16"]["cpu_fallback_nodes"])
    # onnxruntime's NHWC layout breaks GTCRN's Conv on WebGPU; the stage found NCHW and the package ships it
    assert manifest["epOptions"]["webgpu"]["preferredLayout"] == "NCHW"
    assert any(s["name"] == "layout" and s["changed"] for s in report["steps"])
    assert [r["status"] for r in manifest["verification"]["runs"] if r["stage"] == "webgpu-kernels"] == ["passed", "passed"]
    assert "webgpu-kernels: onnxruntime WebGPU kernels outside the browser, on lavapipe" in result.output
    assert "CPU fallback: GRU_" in result.output
    # issue 22 #6: the search's webgpu-kernels evaluator applies the same NCHW retry, so the package
    # that passed never says its fp16 search failed
    assert not [line for line in result.output.splitlines() if "search" in line and "failed" in line], result.output
