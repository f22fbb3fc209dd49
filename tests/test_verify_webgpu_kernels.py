"""The webgpu-kernels stage: onnxruntime's WebGPU kernels outside the browser, on Mesa's lavapipe.

Tests that run kernels skip with the reason when the stage is not available here; in CI (CI=true)
its absence is a failure, so a broken set-up cannot hide behind skips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from pipeline.manifest import runs_from_checks
from pipeline.cli import app
from pipeline.assets.chunks import runnable_model
from pipeline.progress import Progress
from pipeline.sample_file import read_sample
from pipeline.verify.engines import webgpu_kernels
from pipeline.verify.stages import webgpu_kernel_checks
from pipeline.verify.engines.host import reference_outputs
from pipeline.verify.package import package_kernel_checks

runner = CliRunner()
REASON = webgpu_kernels.unavailable_reason()
needs_kernels = pytest.mark.skipif(REASON is not None, reason=f"webgpu-kernels not available: {REASON}")


def reduction_model(length: int, outputs: int = 16) -> onnx.ModelProto:
    """y[4, outputs] = x[4, length] @ w[length, outputs], with positive weights: a reduction whose
    partial sums grow with `length`, where fp16 accumulation loses the low bits."""
    w = np.random.default_rng(1).uniform(0, 1, (length, outputs)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="long_matmul")], "reduction",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, length])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, outputs])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def build_reduction(tmp_path: Path, name: str, length: int) -> tuple[object, dict, dict]:
    model_path = tmp_path / f"{name}.onnx"
    onnx.save(reduction_model(length), model_path)
    inputs = tmp_path / f"{name}.npz"
    np.savez(inputs, x=np.random.default_rng(2).uniform(0, 1, (4, length)).astype(np.float32))
    result = runner.invoke(app, ["build", str(model_path), "--no-browser", "--inputs", str(inputs), "--out", str(tmp_path / "dist")])
    package = tmp_path / "dist" / name
    return result, json.loads((package / "report.json").read_text()), json.loads((package / "manifest.json").read_text())


def stage_checks(report: dict, variant: str) -> list[dict]:
    return [c for c in report["checks"] if c["stage"] == "webgpu-kernels" and c["variant"] == variant]


def test_the_stage_is_available_in_ci():
    if os.environ.get("CI", "").lower() != "true":
        pytest.skip("only required in CI (CI=true)")
    assert REASON is None, f"scripts/setup.sh must install the webgpu-kernels stage in CI: {REASON}"


def test_missing_set_up_is_named_and_the_stage_is_skipped_with_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_LAVAPIPE_DIR", str(tmp_path / "nowhere"))
    reason = webgpu_kernels.unavailable_reason()
    assert reason and "scripts/setup.sh" in reason
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "unavailable").write_text("apt-get download mesa-vulkan-drivers failed\n")
    reason = webgpu_kernels.unavailable_reason()
    if "onnxruntime-ep-webgpu" not in reason:  # the plugin's absence is named first
        assert "apt-get download mesa-vulkan-drivers failed" in reason
    checks, facts = webgpu_kernel_checks({"fp16": tmp_path / "m.onnx"}, {}, {}, {}, {}, Progress.quiet())
    assert [c["status"] for c in checks] == ["skipped"] and checks[0]["detail"] == f"not available: {reason}"
    assert facts["adapter"] is None
    assert runs_from_checks(checks, "webgpu-kernels") == [{"stage": "webgpu-kernels", "bundle": "*", "ep": "webgpu", "variant": "fp16", "status": "skipped", "detail": f"not available: {reason}"}]
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    assert webgpu_kernels.unavailable_reason() == "turned off by PACK_WEBGPU_KERNELS=off"


def test_mesas_shader_cache_is_the_named_one_or_the_pack_caches(tmp_path, monkeypatch):
    from pipeline.cache import cache_dir

    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "pack"))
    monkeypatch.setenv("MESA_SHADER_CACHE_DIR", str(tmp_path / "shaders"))
    assert webgpu_kernels.worker_env()["MESA_SHADER_CACHE_DIR"] == str(tmp_path / "shaders")
    monkeypatch.delenv("MESA_SHADER_CACHE_DIR")
    monkeypatch.setenv("MESA_SHADER_CACHE_DISABLE", "true")  # a cache turned off elsewhere is on in the child
    env = webgpu_kernels.worker_env()
    assert env["MESA_SHADER_CACHE_DIR"] == str(cache_dir("mesa-shader-cache")) and "MESA_SHADER_CACHE_DISABLE" not in env
    assert Path(env["MESA_SHADER_CACHE_DIR"]).is_relative_to(tmp_path / "pack")


def test_a_tensor_over_lavapipes_buffer_limit_is_not_verifiable_without_running(tmp_path, monkeypatch):
    monkeypatch.setattr(webgpu_kernels, "unavailable_reason", lambda: None)
    monkeypatch.setattr(webgpu_kernels, "WORKER_MODULE", "tests.webgpu_crashing_worker")
    # An inferred intermediate: Expand to 6000x6000 fp32 (137 MiB) from a 4-element input.
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    big (float[1] x) => (float y) <int64[2] shape = {6000, 6000}, int64[2] axes = {0, 1}> {
      e = Expand (x, shape)
      y = ReduceSum <keepdims = 0> (e, axes)
    }
    """
    path = tmp_path / "big.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    run = webgpu_kernels.run_on_webgpu(path, {"x": np.ones(1, np.float32)})
    assert run.outputs is None and run.crashes == []
    assert run.not_verifiable == run.error and "tensor 'e' is 137.3 MiB, over lavapipe's 128 MiB" in run.not_verifiable
    # An initializer, sized from its dims (external data is not read).
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT16, dims=[70_000_000], data_location=onnx.TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value="w.bin")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["w"], ["y"])], "g", [], [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [70_000_000])], [tensor])
    path = tmp_path / "weights.onnx"
    onnx.save(onnx.helper.make_model(graph), path)
    assert webgpu_kernels.oversized_tensor(path, {}) == ("w", 140_000_000)
    assert webgpu_kernels.oversized_tensor(tmp_path / "big.onnx", {"x": np.ones(1, np.float32)})[0] == "e"


def test_a_crash_is_a_failed_run_naming_the_signal(tmp_path, monkeypatch):
    monkeypatch.setattr(webgpu_kernels, "unavailable_reason", lambda: None)
    monkeypatch.setattr(webgpu_kernels, "WORKER_MODULE", "tests.webgpu_crashing_worker")
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "small.onnx"
    onnx.save(reduction_model(8), path)
    run = webgpu_kernels.run_on_webgpu(path, {"x": np.ones((4, 8), np.float32)})
    assert run.outputs is None and "SIGSEGV" in run.error and run.crashes == ["all: SIGSEGV"]
    checks, _ = webgpu_kernel_checks({"fp32": path}, {"y": np.zeros((4, 16), np.float32)}, {"x": np.ones((4, 8), np.float32)}, {"fp32": {"y": {}}}, {}, Progress.quiet())
    assert [c["status"] for c in checks] == ["failed"] and "SIGSEGV" in checks[0]["detail"]
    assert runs_from_checks(checks, "webgpu-kernels")[0]["detail"].endswith("(SIGSEGV)")


@needs_kernels
def test_a_model_that_runs_entirely_on_the_cpu_ep_is_not_a_webgpu_result(tmp_path):
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    uniq (float[8] x) => (float[N] u) {
      u = Unique (x)
    }
    """
    path = tmp_path / "unique.onnx"
    onnx.save(onnx.parser.parse_model(text), path)
    run = webgpu_kernels.run_on_webgpu(path, {"x": np.array([1, 2, 2, 3, 1, 0, 5, 5], np.float32)})
    assert run.outputs is None and run.webgpu_nodes == 0
    assert len(run.cpu_fallback_nodes) == 1 and "(Unique)" in run.cpu_fallback_nodes[0]
    assert "no node ran on the WebGPU EP" in run.not_verifiable


@needs_kernels
def test_fp16_passes_on_webgpu_kernels_and_pack_verify_runs_the_stage(tmp_path):
    result, report, manifest = build_reduction(tmp_path, "short_reduction", 256)
    assert result.exit_code == 0, result.output
    for variant in ("fp16", "fp32"):
        [check] = stage_checks(report, variant)
        assert check["status"] == "passed" and check["ep"] == "webgpu", check
        assert report["webgpu_kernels"]["runs"][variant]["webgpu_nodes"] >= 1
        assert report["webgpu_kernels"]["runs"][variant]["cpu_fallback_nodes"] == []
    [fp16] = stage_checks(report, "fp16")
    assert fp16["threshold"] == {"max_abs_of_range": 3e-2, "rel_l2": 3e-2}  # WebGPU bounds: fp16 accumulates in fp16
    assert {"stage": "webgpu-kernels", "bundle": "*", "ep": "webgpu", "variant": "fp16", "status": "passed"} in manifest["verification"]["runs"]
    assert "webgpu-kernels: onnxruntime WebGPU kernels outside the browser, on lavapipe (Mesa 25" in result.output
    assert "fp16: 1 nodes on WebGPU, 0 on the CPU EP" in result.output or "fp16: 3 nodes on WebGPU, 0 on the CPU EP" in result.output
    assert "ok   webgpu-kernels webgpu/fp16" in result.output
    # `pack verify`'s part of the stage, on the built package, with the recorded bounds
    package = tmp_path / "dist" / "short_reduction"
    feeds = read_sample(package, manifest)[0]
    reference = reference_outputs(package / manifest["variants"]["fp32"]["model"], feeds)
    checks, facts = package_kernel_checks(package, manifest, feeds, reference, Progress.quiet(), runnable_model)
    assert [(c["variant"], c["status"]) for c in checks] == [("fp16", "passed"), ("fp32", "passed")]
    assert checks[0]["threshold"] == fp16["threshold"] and checks[0]["metrics"] == fp16["metrics"]


@needs_kernels
def test_a_planted_fp16_accumulation_failure_is_caught_where_the_cpu_ep_passes(tmp_path):
    result, report, manifest = build_reduction(tmp_path, "long_reduction", 4096)
    assert result.exit_code == 0, result.output  # fp16 refused on WebGPU; fp32 serves every chain
    [host] = [c for c in report["checks"] if c["stage"] == "host" and c["variant"] == "fp16"]
    assert host["status"] == "passed" and host["metrics"]["rel_l2"] < 1e-3
    [kernels] = stage_checks(report, "fp16")
    assert kernels["status"] == "failed"
    assert kernels["metrics"]["max_abs_of_range"] > 3e-2 and kernels["metrics"]["rel_l2"] > 3e-2
    assert kernels["metrics"]["rel_l2"] > 50 * host["metrics"]["rel_l2"]
    [fp32] = stage_checks(report, "fp32")
    assert fp32["status"] == "passed"
    run = next(r for r in manifest["verification"]["runs"] if r["stage"] == "webgpu-kernels" and r["variant"] == "fp16")
    assert run["bundle"] == "*" and run["ep"] == "webgpu" and run["status"] == "failed"
    assert run["detail"].startswith("y: max_abs_of_range") and "> 0.03" in run["detail"]
    assert "FAIL webgpu-kernels webgpu/fp16" in result.output and "REFUSED VARIANTS: fp16" in result.output
    assert report["passed"] and manifest["verification"]["passed"]
    assert any(item["variant"] == "fp16" and item["ep"] == "webgpu" for item in report["refused"])


def test_a_model_too_heavy_for_lavapipe_is_not_verifiable_without_running(tmp_path, monkeypatch):
    from build_helpers import conv_model

    monkeypatch.setattr(webgpu_kernels, "unavailable_reason", lambda: None)
    monkeypatch.setattr(webgpu_kernels, "WORKER_MODULE", "tests.webgpu_crashing_worker")
    path = tmp_path / "conv.onnx"
    onnx.save(conv_model(channels=64, size=256), path)
    feeds = {"x": np.zeros((1, 3, 256, 256), np.float32)}
    assert webgpu_kernels.estimated_macs(path, feeds) == 2 * 64 * 3 * 9 * 256 * 256  # two 3x3 convs, 3->64->3 channels
    monkeypatch.setenv("PACK_WEBGPU_KERNELS_MAX_GMAC", "0.1")
    run = webgpu_kernels.run_on_webgpu(path, feeds)
    assert run.outputs is None and run.crashes == []
    assert run.not_verifiable.startswith("about 0.2 GMAC per run, over the 0.1 GMAC lavapipe")


def test_nchw_is_adopted_when_it_fixes_a_variant_that_nhwc_fails_though_another_fails_either_way(monkeypatch):
    """One layout serves every variant: an fp16 that fails under both layouts must not keep an fp32
    that only NHWC breaks (a Silero VAD export: fp32 passes with NCHW, fp16 misses its bound either way)."""
    from pipeline.progress import Progress
    from pipeline.verify import stages
    from pipeline.verify.engines import webgpu_kernels as kernels

    monkeypatch.setattr(kernels, "unavailable_reason", lambda: None)
    monkeypatch.setattr(kernels, "adapter_name", lambda: "lavapipe")

    def fake_pass(models, reference, feeds, thresholds, kinds, progress, ep_options, reference_model, judging=None):
        nchw = ep_options.get("preferredLayout") == "NCHW"
        status = {"fp16": "failed", "fp32": "passed" if nchw else "failed"}
        return [{"stage": "webgpu-kernels", "ep": "webgpu", "variant": v, "output": "y", "status": s, "detail": "y: rel_l2 1 > 0.001"} for v, s in status.items()], {}, None

    monkeypatch.setattr(stages, "_kernel_pass", fake_pass)
    checks, facts = stages.webgpu_kernel_checks({"fp16": None, "fp32": None}, {}, {}, {}, {}, Progress.quiet())
    assert facts["ep_options"] == {"preferredLayout": "NCHW"}
    assert {c["variant"]: c["status"] for c in checks} == {"fp16": "failed", "fp32": "passed"}
    assert facts["layout"]["what"] == "webgpu preferredLayout NCHW: fp32 passes on webgpu-kernels where NHWC failed (fp16 fails either way)"
