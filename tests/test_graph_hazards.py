"""Hazard detection: what it finds, which repairs it picks, the webgpu layout choice, fp16 readiness."""

from __future__ import annotations

import onnx

from graph_helpers import (
    FFC_FLIP_MODEL,
    FFC_MODEL,
    clean_conv_model,
    constant_if_model,
    decoder_head_model,
    neg_slice_model,
    parse,
    shape_if_model,
)
from pipeline.graph import repairs
from pipeline.graph.hazards import detect_hazards, preferred_layout
from pipeline.precision.readiness import fp16_readiness
from pipeline.graph.repairs import auto_repairs


def _kinds(model: onnx.ModelProto) -> list[tuple[str, str, str | None]]:
    return [(h["node"], h["hazard"], h["repair"]) for h in detect_hazards(model)]


def test_clean_models_have_no_hazards_and_need_no_repairs():
    for model in (clean_conv_model(), decoder_head_model(stale=False), onnx.load(FFC_MODEL)):
        assert detect_hazards(model) == []
        assert auto_repairs(model) == []
        assert preferred_layout(model) is None


def test_negative_step_slice_affects_only_the_root_webgpu_pair():
    hazard, = detect_hazards(neg_slice_model())
    assert hazard["op"] == "Slice" and hazard["hazard"] == "neg-step-slice" and hazard["affects"] == ["root/webgpu"]
    assert _kinds(onnx.load(FFC_FLIP_MODEL)) == [("node_flip", "neg-step-slice", "neg_step_slice")]


def test_negative_step_slice_with_run_time_bounds_is_reported_without_a_repair():
    model = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,31] x, int64[1] end) => (float[1,?] y) <int64[1] starts = {-1}, int64[1] axes = {1}, int64[1] steps = {-1}>
{ y = Slice(x, starts, end, axes, steps) }""")
    assert _kinds(model) == [("Slice#0", "neg-step-slice-dynamic-bounds", None)]
    assert auto_repairs(model) == []


def test_stale_shape_names_the_squeeze_and_every_bundle_ep_pair():
    hazard, = detect_hazards(decoder_head_model())
    assert (hazard["node"], hazard["op"], hazard["repair"]) == ("Squeeze#1", "Squeeze", "stale_shapes")
    assert sorted(hazard["affects"]) == ["root/wasm", "root/webgpu", "webgpu/wasm", "webgpu/webgpu"]
    assert "[1, 1, 36]" in hazard["detail"] and "[36]" in hazard["detail"]


def test_preferred_layout_is_nchw_only_while_the_stale_rank_remains():
    model = decoder_head_model()
    assert preferred_layout(model) == "NCHW"
    assert preferred_layout(repairs.get("stale_shapes")(model).model) is None


def test_if_conditions_known_from_shapes_are_folded_others_reported():
    assert _kinds(shape_if_model(batch=1)) == [("If#4", "if-known-condition", "fold_if")]
    assert _kinds(shape_if_model(batch="N")) == [("If#4", "if-subgraph", None)]
    assert auto_repairs(constant_if_model()) == ["fold_if"]


def test_auto_repairs_orders_structure_before_shapes():
    model = decoder_head_model()
    slice_model = neg_slice_model()
    # one model with two patterns: the head and a reversal, side by side
    both = onnx.compose.add_prefix(slice_model, "s_")
    merged = onnx.compose.merge_models(model, both, io_map=[])
    assert auto_repairs(merged) == ["neg_step_slice", "stale_shapes"]
    repaired = merged
    for name in auto_repairs(merged):
        repaired = repairs.get(name)(repaired).model
    assert detect_hazards(repaired) == []


def test_fp16_readiness_names_the_repairs_the_converter_needs():
    model = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y, float[4] z) <int64[1] shape = {4}>
{
    h = Cast <to = 10> (x)
    y = Cast <to = 1> (h)
    z = Neg(y)
}""")
    readiness = fp16_readiness(model)
    found = {(f["hazard"], f["repair"]) for f in readiness["findings"]}
    assert found == {("output-also-consumed", "detach_consumed_outputs")}  # a Cast to FLOAT needs none: the conversion types it
    assert readiness["ready"] and readiness["precision"] == "fp32"
    assert not fp16_readiness(shape_if_model(batch="N"))["ready"]


def test_fp16_readiness_refuses_quantized_models():
    model = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (uint8[4] q, uint8 s_zero) <float scale = {0.1}, uint8 zero = {0}>
{ q = QuantizeLinear(x, scale, zero)  s_zero = Identity(zero) }""")
    readiness = fp16_readiness(model)
    assert readiness["precision"] == "quantized" and not readiness["ready"]


def test_fp16_readiness_flags_overflow_and_wholesale_underflow_only():
    model = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[3] x) => (float[3] y)
<float[3] big = {1e5, 1, 2}, float eps = {1e-12}, float[200] mostly_fine = {""" + ", ".join(["1e-9"] + ["0.5"] * 199) + """}>
{ a = Add(x, big)  b = Add(a, eps)  c = ReduceSum(mostly_fine)  y = Add(b, c) }""")
    found = {f["node"]: f["detail"] for f in fp16_readiness(model)["findings"] if f["hazard"] == "outside-fp16-range"}
    assert set(found) == {"big", "eps"}
    assert found["big"].startswith("1 values above 65504") and "1 of 1 non-zero values below 6e-8" in found["eps"]
