"""The webgpu-kernels node audit: models over the whole-run limit checked node by node on
onnxruntime's WebGPU kernels (lavapipe), each node cut to a few outputs that keep their full
accumulation depth.

The cutting rules are checked on onnxruntime CPU (a cut node computes exactly the values of the
whole node it keeps); the audit itself needs the webgpu-kernels stage and skips without it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.commands.summary import webgpu_kernel_lines
from pipeline.manifest import runs_from_checks
from pipeline.progress import Progress
from pipeline.precision.fp16 import convert_with_keeps
from pipeline.verify.engines import node_audit, node_slicing, webgpu_kernels
from pipeline.verify.stages import webgpu_kernel_checks
from pipeline.verify.engines.host import reference_outputs
from pipeline.verify.judgement.thresholds import node_bounds, threshold_for

REASON = webgpu_kernels.unavailable_reason()
needs_kernels = pytest.mark.skipif(REASON is not None, reason=f"webgpu-kernels not available: {REASON}")
RNG = np.random.default_rng(0)


def _run(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int = 17) -> list[np.ndarray]:
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in feeds.items()],
                              [helper.make_value_info(o, onnx.TypeProto()) for o in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _cut_matches_whole(op: str, attrs: dict, arrays: list[np.ndarray], prefix_only: bool = False) -> str:
    """Run `op` whole and cut (by plan_node) on onnxruntime CPU; the cut's outputs must equal the
    whole node's values at the same positions (from index 0). Returns the plan's description."""
    names = [f"x{i}" for i in range(len(arrays))]
    plan = node_slicing.plan_node(op, {**attrs, "_opset": 17}, [list(a.shape) for a in arrays], {})
    assert isinstance(plan, node_slicing.Plan), plan
    whole = _run(helper.make_node(op, names, ["y"], **attrs), dict(zip(names, arrays)))[0]
    cut_arrays = [a if w is None else a[tuple(slice(0, n) for n in w)] for a, w in zip(arrays, plan.windows)]
    cut_attrs = {**attrs, **{k: v for k, v in plan.attributes.items() if not k.startswith("_")}}
    cut = _run(helper.make_node(op, names, ["y"], **cut_attrs), dict(zip(names, cut_arrays)))[0]
    assert cut.size < whole.size or whole.size <= 64, (op, cut.shape, whole.shape)
    assert cut.ndim == whole.ndim
    window = tuple(slice(0, n) for n in cut.shape)
    if prefix_only:  # ConvTranspose: the first outputs along each cut axis get all their taps
        spatial = tuple(slice(0, max(1, n // 2)) for n in cut.shape[2:])
        window = window[:2] + spatial
        cut = cut[window]
    np.testing.assert_allclose(cut, whole[window], rtol=1e-5, atol=1e-5 * float(np.abs(whole).max()), err_msg=f"{op} {attrs}")  # summation order
    return plan.how


@pytest.mark.parametrize("attrs", [
    {"pads": [1, 1, 1, 1]},
    {"strides": [2, 2], "pads": [3, 3, 3, 3], "dilations": [1, 1]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"dilations": [2, 2], "pads": [2, 2, 2, 2]},
    {"group": 16, "pads": [1, 1, 1, 1]},
])
def test_a_cut_conv_computes_the_whole_convs_values_with_every_input_channel(attrs):
    x = RNG.standard_normal((1, 16, 40, 36)).astype(np.float32)
    channels = 1 if attrs.get("group") else 16
    w = RNG.standard_normal((32, channels, 7 if "strides" in attrs else 3, 7 if "strides" in attrs else 3)).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32)
    how = _cut_matches_whole("Conv", attrs, [x, w, b])
    assert "output channels" in how


def test_a_cut_conv1d_and_conv_transpose_keep_their_taps():
    x = RNG.standard_normal((1, 8, 3000)).astype(np.float32)
    _cut_matches_whole("Conv", {"strides": [4], "pads": [2, 2]}, [x, RNG.standard_normal((16, 8, 8)).astype(np.float32)])
    w = RNG.standard_normal((8, 6, 8)).astype(np.float32)
    _cut_matches_whole("ConvTranspose", {"strides": [4], "pads": [2, 2]}, [x, w, RNG.standard_normal(6).astype(np.float32)], prefix_only=True)
    grouped = RNG.standard_normal((8, 3, 8)).astype(np.float32)
    _cut_matches_whole("ConvTranspose", {"strides": [4], "group": 2}, [x, grouped], prefix_only=True)


def test_cut_matmul_gemm_reductions_and_softmax_keep_the_reduced_axes_whole():
    a = RNG.standard_normal((2, 3, 50, 300)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 300, 40)).astype(np.float32)
    assert "K = 300 whole" in _cut_matches_whole("MatMul", {}, [a, b])
    assert "K = 300 whole" in _cut_matches_whole("Gemm", {"transB": 1}, [a[0, 0], RNG.standard_normal((40, 300)).astype(np.float32), RNG.standard_normal(40).astype(np.float32)])
    big = RNG.standard_normal((3, 2, 70000)).astype(np.float32)
    assert "70000 values per reduction" in _cut_matches_whole("ReduceMean", {"axes": [2], "keepdims": 1}, [big])
    _cut_matches_whole("Softmax", {"axis": -1}, [RNG.standard_normal((4, 64, 512)).astype(np.float32)])
    _cut_matches_whole("Add", {}, [RNG.standard_normal((1, 64, 80, 80)).astype(np.float32), RNG.standard_normal((64, 1, 1)).astype(np.float32)])
    _cut_matches_whole("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [RNG.standard_normal((1, 16, 64, 64)).astype(np.float32)])


def test_a_cut_dft_keeps_its_transform_axis_whole():
    # LaMa's FFC: a 2-D rfft as two DFTs over [1, C, 256, 256]; each runs whole otherwise (slow on lavapipe).
    real = RNG.standard_normal((1, 4, 64, 96, 1)).astype(np.float32)
    assert "64 values per transform" in _cut_matches_whole("DFT", {"axis": 2, "onesided": 1}, [real])
    spectrum = RNG.standard_normal((1, 4, 64, 96, 2)).astype(np.float32)
    assert "96 values per transform" in _cut_matches_whole("DFT", {"axis": 3, "inverse": 1}, [spectrum])


def hazard_model(k: int = 4096, n: int = 70000) -> onnx.ModelProto:
    """The two WebGPU fp16 failures the stage must catch, with harmless neighbours: a MatMul whose
    fp16 accumulation drifts over K = 4096 positive terms, and a ReduceMean over 70000 values
    (onnxruntime's WebGPU fp16 ReduceMean returns 0 from 65520 values on)."""
    w = np.random.default_rng(1).uniform(0, 1, (k, 16)).astype(np.float32)
    cw = np.random.default_rng(2).standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="long_matmul"),
        helper.make_node("Relu", ["y"], ["y_relu"], name="relu"),
        helper.make_node("ReduceMean", ["a"], ["mean"], name="long_mean", axes=[1], keepdims=1),
        helper.make_node("Sub", ["a", "mean"], ["centred"], name="centre"),
        helper.make_node("Conv", ["img", "cw"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "hazards", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, k]),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, n]),
        helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 4, 32, 32]),
    ], [
        helper.make_tensor_value_info("y_relu", TensorProto.FLOAT, [4, 16]),
        helper.make_tensor_value_info("centred", TensorProto.FLOAT, [2, n]),
        helper.make_tensor_value_info("conv", TensorProto.FLOAT, [1, 8, 32, 32]),
    ], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(cw, "cw")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def hazards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hazards")
    model = hazard_model()
    onnx.save(model, folder / "fp32.onnx")
    onnx.save(convert_with_keeps(model).model, folder / "fp16.onnx")
    rng = np.random.default_rng(3)
    feeds = {"x": rng.uniform(0, 1, (4, 4096)).astype(np.float32), "a": rng.uniform(0, 1, (2, 70000)).astype(np.float32),
             "img": rng.standard_normal((1, 4, 32, 32)).astype(np.float32)}
    return folder, feeds


@needs_kernels
def test_the_audit_names_the_fp16_matmul_and_reducemean_failures_and_passes_fp32(hazards, monkeypatch):
    monkeypatch.setattr(node_audit, "CHEAP_ELEMENTS", 0)  # every node cut, as in a large model
    folder, feeds = hazards
    verdicts = node_audit.node_verdicts(folder / "fp32.onnx", folder / "fp16.onnx", feeds)
    by_node = {v.node: v for v in verdicts}
    assert set(by_node) == {"long_matmul", "relu", "long_mean", "centre", "conv"}
    failed = {v.node for v in verdicts if v.status == "failed"}
    assert failed == {"long_matmul", "long_mean"}, [v.line() for v in verdicts]
    matmul, mean = by_node["long_matmul"], by_node["long_mean"]
    assert matmul.op == "MatMul" and matmul.shape == [[4, 4096], [4096, 16]] and "K = 4096 whole" in matmul.cut
    assert matmul.metrics["max_abs_of_scale"] > node_bounds("fp16")["max_abs_of_scale"]
    assert mean.metrics["rel_l2"] > 0.9  # the fp16 ReduceMean over 70000 values gives 0
    assert "70000 values per reduction" in mean.cut
    assert by_node["conv"].status == "passed" and "output channels" in by_node["conv"].cut
    fp32 = node_audit.node_verdicts(folder / "fp32.onnx", folder / "fp32.onnx", feeds, precision="fp32")
    assert all(v.status == "passed" for v in fp32), [v.line() for v in fp32]


def _stage_on_hazards(folder, feeds):
    """The webgpu-kernels stage's checks and facts for the hazards model's fp16 and fp32 variants."""
    models = {"fp16": folder / "fp16.onnx", "fp32": folder / "fp32.onnx"}
    reference = reference_outputs(folder / "fp32.onnx", feeds)
    thresholds = {v: {o: threshold_for("tensor", v, "webgpu") for o in reference} for v in models}
    return webgpu_kernel_checks(models, reference, feeds, thresholds, {}, Progress.quiet())


@needs_kernels
def test_the_stage_audits_models_over_the_whole_run_limit(hazards, monkeypatch):
    folder, feeds = hazards
    monkeypatch.setenv("PACK_WEBGPU_KERNELS_MAX_GMAC", "0.0001")  # this model is over it
    checks, facts = _stage_on_hazards(folder, feeds)
    by_variant = {c["variant"]: c for c in checks}
    assert by_variant["fp32"]["status"] == "passed" and "node audit of 5 nodes" in by_variant["fp32"]["detail"]
    failed = by_variant["fp16"]
    assert failed["status"] == "failed" and failed["node"] in ("long_matmul", "long_mean")
    assert set(failed["failed_ops"]) == {"MatMul", "ReduceMean"}
    assert "layout" not in facts  # neither op is one the NHWC layout rewrites: no NCHW retry
    assert facts["runs"]["fp16"]["audit"]["failed"] == 2
    json.dumps(facts)  # report.json holds them as they are
    assert {v["node"] for v in facts["audit"]["variants"]["fp16"]["failed"]} == {"long_matmul", "long_mean"}
    lines = webgpu_kernel_lines(facts)
    assert any(line.strip().startswith("fp16: node audit, 5 nodes on WebGPU (2 failed") for line in lines), lines
    assert any(line.strip().startswith("long_mean (ReduceMean) at [[2, 70000]]") for line in lines), lines
    run = next(r for r in runs_from_checks(checks, "webgpu-kernels") if r["variant"] == "fp16")
    assert run["status"] == "failed" and failed["node"] in run["detail"] and "at [[" in run["detail"]


@needs_kernels
def test_a_whole_run_that_does_not_finish_in_time_is_audited_instead(hazards, monkeypatch):
    folder, feeds = hazards
    monkeypatch.setenv("PACK_WEBGPU_KERNELS_TIMEOUT_S", "0.05")  # no whole run can finish
    checks, facts = _stage_on_hazards(folder, feeds)
    assert [(c["variant"], c["status"]) for c in checks] == [("fp16", "failed"), ("fp32", "passed")]
    assert "did not finish within 0.05 s" in checks[0]["detail"] and checks[0]["op"] in ("MatMul", "ReduceMean")


@needs_kernels
def test_a_node_that_crashes_the_worker_is_named_and_the_others_are_still_audited(hazards, monkeypatch):
    folder, feeds = hazards
    monkeypatch.setattr(node_audit, "WORKER_MODULE", "tests.node_audit_crashing_worker")
    verdicts = {v.node: v for v in node_audit.node_verdicts(folder / "fp32.onnx", folder / "fp16.onnx", feeds)}
    assert verdicts["relu"].status == "failed" and verdicts["relu"].detail == "crashed the worker (SIGSEGV)"
    assert {n for n, v in verdicts.items() if v.status == "failed"} == {"relu", "long_matmul", "long_mean"}
    assert verdicts["conv"].status == "passed" and verdicts["centre"].status == "passed"


SCALAR_INPUT_MODEL = """
<ir_version: 8, opset_import: ["" : 18]>
spectrum (float[2, 64, 1] x) => (float[2, 33, 2] y) <int64 length = {64}> {
    y = DFT <axis = 1, onesided = 1> (x, length)
}
"""


@needs_kernels
def test_a_scalar_constant_a_node_reads_stays_a_scalar_in_its_audit(tmp_path):
    # LaMa's rfft: DFT's dft_length is a 0-d initializer; the audit used to store it as shape [1]
    # (np.ascontiguousarray), which onnxruntime refuses ("dft_length input must be a scalar"),
    # so every node of a 512² LaMa export was left not verifiable.
    model = onnx.parser.parse_model(SCALAR_INPUT_MODEL)
    onnx.save(model, tmp_path / "fp32.onnx")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 64, 1)).astype(np.float32)}
    verdicts = node_audit.node_verdicts(tmp_path / "fp32.onnx", tmp_path / "fp32.onnx", feeds, precision="fp32")
    assert [(v.op, v.status) for v in verdicts] == [("DFT", "passed")], [v.line() for v in verdicts]


def conv_transpose_model(length: int, dtype: int = TensorProto.FLOAT16) -> onnx.ModelProto:
    """One stride-2 ConvTranspose over `length` input positions (2 × length outputs)."""
    w = np.random.default_rng(4).standard_normal((8, 4, 4)).astype(np.float32) / 6
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="upsample", strides=[2], pads=[1, 1], kernel_shape=[4])
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    graph = helper.make_graph([node], "upsample", [helper.make_tensor_value_info("x", dtype, [1, 8, length])],
                              [helper.make_tensor_value_info("y", dtype, [1, 4, 2 * length])], [numpy_helper.from_array(w.astype(np_type), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@needs_kernels
@pytest.mark.parametrize("length", [1024, 1030])
def test_a_cheap_node_runs_whole_so_an_error_far_along_its_axis_is_seen(tmp_path, monkeypatch, length):
    """onnxruntime's WebGPU fp16 ConvTranspose counts positions in fp16 (exact up to 2048): with
    1030 inputs at stride 2 its outputs from 2051 on are wrong, with 1024 they are right. A cut to
    the first positions never reaches them; a node this cheap runs whole at its real shapes."""
    onnx.save(conv_transpose_model(length, TensorProto.FLOAT), tmp_path / "fp32.onnx")
    onnx.save(conv_transpose_model(length), tmp_path / "fp16.onnx")
    feeds = {"x": np.random.default_rng(5).standard_normal((1, 8, length)).astype(np.float32)}
    [whole] = node_audit.node_verdicts(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx", feeds)
    assert whole.cut == "" and whole.shape == [[1, 8, length], [8, 4, 4]]
    assert whole.status == ("failed" if length > 1024 else "passed"), whole.line()
    if length > 1024:
        assert whole.metrics["max_abs_of_scale"] > 0.1  # 0.22 measured; fp16 rounding alone is ~1e-3
        monkeypatch.setattr(node_audit, "CHEAP_ELEMENTS", 0)
        [cut] = node_audit.node_verdicts(tmp_path / "fp32.onnx", tmp_path / "fp16.onnx", feeds)
        assert cut.cut and cut.status == "passed", cut.line()  # what a cut audit (a large node) sees
