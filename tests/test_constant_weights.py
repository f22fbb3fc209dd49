"""Weights wherever they live: paddle2onnx and tf2onnx store them in Constant nodes; lifted to
initializers they are counted, converted and searched like any exporter's; and no narrowed
variant ships larger than the fp32 model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from build_helpers import conv_model, model_from_text, run, save
from pipeline.cli import app
from pipeline.graph.passes.lift_constant_weights import find, lift_constant_weights
from pipeline.precision.variants import SIZE_RULE_MIN_BYTES, Variant, VariantSet, _drop_larger_than_fp32

# tf2onnx's convention: the weights of a dense layer as Constant nodes; the scalar stays a node
CONSTANT_WEIGHTS = """
<ir_version: 8, opset_import: ["" : 17]>
dense (float[2, 4] x) => (float[2, 4] y) {
  w = Constant <value = float[4, 4] {0.5, -1.0, 0.25, 2.0, 1.5, 0.0, -0.5, 1.0, 0.1, 0.2, 0.3, 0.4, -2.0, 1.0, 0.5, 0.75}> ()
  b = Constant <value = float[16] {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}> ()
  eps = Constant <value = float {0.001}> ()
  shape = Constant <value = int64[2] {2, 4}> ()
  h = MatMul (x, w)
  start = Constant <value = int64[1] {0}> ()
  end = Constant <value = int64[1] {8}> ()
  half = Slice (b, start, end)
  bb = Reshape (half, shape)
  s = Add (h, bb)
  y = Add (s, eps)
}
"""


def test_lifted_constant_weights_compute_the_same_and_the_rest_stays():
    model = model_from_text(CONSTANT_WEIGHTS)
    assert [h["hazard"] for h in find(model)] == ["constant-weights"]
    result = lift_constant_weights(model)
    assert result.changed and sorted(r["value"] for r in result.records) == ["b", "w"]
    lifted = result.model
    onnx.checker.check_model(lifted)
    assert sorted(t.name for t in lifted.graph.initializer) == ["b", "w"]
    # scalars, shape values and the small Slice bounds stay Constant nodes
    assert sum(n.op_type == "Constant" for n in lifted.graph.node) == sum(n.op_type == "Constant" for n in model.graph.node) - 2
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(lifted, {"x": x})["y"], run(model, {"x": x})["y"])
    # idempotent, and the input is not mutated
    again = lift_constant_weights(lifted)
    assert not again.changed and again.model.SerializeToString() == lifted.SerializeToString()
    assert not model.graph.initializer


def test_a_model_without_constant_weights_is_left_alone():
    model = conv_model()
    assert find(model) == [] and not lift_constant_weights(model).changed


def paddle_style_conv() -> onnx.ModelProto:
    """Two convs whose weights are Constant nodes (paddle2onnx), 16 channels: weights dominate."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.2, (16, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.1, (3, 16, 3, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["w1"], value=w1, name="w1_const"),
         helper.make_node("Constant", [], ["w2"], value=w2, name="w2_const"),
         helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")],
        "paddle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_paddle_style_build_counts_converts_and_keeps_its_constant_weights(tmp_path):
    """With conv2 kept in fp32 (a recipe's fp16.keep_nodes, as the search keeps nodes), the size
    accounting counts the Constant weights (it printed "weights 0 B vs all-fp16 ideal 0 B"), conv1's
    weight ships in fp16 and the kept conv2's in fp32."""
    model_path = save(paddle_style_conv(), tmp_path / "paddle-conv.onnx")
    recipe = tmp_path / "paddle-conv.toml"
    recipe.write_text(f'name = "paddle-conv"\n[source]\nuri = "{model_path}"\n[fp16]\nkeep_nodes = ["conv2"]\n')
    result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    fp32_bytes = (16 * 3 * 9 + 3 * 16 * 9) * 4
    ideal = fp32_bytes // 2
    assert f"weights {ideal + 3 * 16 * 9 * 2} B vs all-fp16 ideal {ideal} B (+{3 * 16 * 9 * 2} B) and fp32 {fp32_bytes} B" in result.output
    assert "step lift_constant_weights: w1: Constant weight of 432 values lifted to an initializer; w2: Constant weight of 432 values lifted to an initializer" in result.output
    package = tmp_path / "d" / "paddle-conv"
    manifest = json.loads((package / "manifest.json").read_text())
    fp16 = onnx.load(str(package / manifest["variants"]["fp16"]["model"]))
    assert {t.name: t.data_type for t in fp16.graph.initializer if t.name in ("w1", "w2")} == {"w1": TensorProto.FLOAT16, "w2": TensorProto.FLOAT}


def test_a_variant_not_smaller_than_fp32_is_not_shipped():
    fp32 = conv_model(channels=5000)  # 1.08 MB of weights: over SIZE_RULE_MIN_BYTES
    bigger = conv_model(channels=5200)
    assert fp32.ByteSize() >= SIZE_RULE_MIN_BYTES
    made = VariantSet([Variant("fp16", "fp16", bigger, "converted", ["shader-f16"]), Variant("fp16w", "fp16w", fp32, "narrowed"),
                       Variant("fp16", "smaller", conv_model(channels=8), "converted")], fp32, "fp32", "fp32 weights")
    _drop_larger_than_fp32(made, fp32)
    assert [v.precision for v in made.variants] == ["smaller"]
    assert made.refused["fp16"] == f"{bigger.ByteSize():,} B, not smaller than the fp32 model's {fp32.ByteSize():,} B: it saves nothing"
    assert made.refused["fp16w"].startswith(f"{fp32.ByteSize():,} B, not smaller")
    # a tiny model's casts may outweigh its halved weights: under the limit the rule does not apply
    tiny = VariantSet([Variant("fp16", "fp16", conv_model(channels=8), "converted")], conv_model(), "fp32", "fp32 weights")
    _drop_larger_than_fp32(tiny, conv_model())
    assert len(tiny.variants) == 1 and not tiny.refused
