"""fp16 typed by construction (pipeline/precision/typed_fp16.py), one tiny ONNX-text graph per
pattern that broke the converter on other exporters' graphs: each converts with no node kept from
an error, passes the full onnx.checker, runs on onnxruntime close to fp32, and casts only between
regions. And order holds after every rewrite: a repair that breaks it is named."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from pipeline.graph.passes.base import PassResult, Repair
from pipeline.graph.passes.topo_sort import OrderBroken, out_of_order
from pipeline.graph.passes.util import all_graphs
from pipeline.graph.repairs import run_passes
from pipeline.precision.converter_errors import name_unnamed_nodes
from pipeline.precision.fp16 import convert_with_keeps
from build_helpers import model_from_text, run

# LaMa's Fourier unit as the TorchScript exporter writes it: a float grid from
# Range(Constant, Cast(to=FLOAT)(Gather(Shape(x))), Constant); Range has no fp16 before opset 27.
RANGE_LIMIT_THROUGH_CAST = """
<ir_version: 8, opset_import: ["" : 17]>
grid (float[1,2,6] x) => (float[1,2,6] y) {
  shape = Shape (x)
  index = Constant <value = int64 {2}> ()
  width = Gather <axis = 0> (shape, index)
  limit = Cast <to = 1> (width)
  start = Constant <value = float {0.0}> ()
  delta = Constant <value = float {1.0}> ()
  ramp = Range (start, limit, delta)
  scale = Constant <value = float {0.125}> ()
  phase = Mul (ramp, scale)
  y = Add (x, phase)
}
"""

# ConstantOfShape with a float value, a Pad value and Where/Equal/Less beside fp32 constants.
CONSTANT_OF_SHAPE_AND_MASKS = """
<ir_version: 8, opset_import: ["" : 17]>
masks (float[2,4] x) => (float[2,4] y, float[2,4] z) <float zero = {0.0}> {
  shape = Shape (x)
  ones = ConstantOfShape <value = float[1] {1.0}> (shape)
  h = Mul (x, ones)
  low = Less (h, zero)
  clipped = Where (low, zero, h)
  y = Max (clipped, zero)
  pads = Constant <value = int64[4] {0, 1, 0, 1}> ()
  padded = Pad <mode = "constant"> (h, pads, zero)
  first = Constant <value = int64[1] {1}> ()
  last = Constant <value = int64[1] {5}> ()
  axis = Constant <value = int64[1] {1}> ()
  z = Slice (padded, first, last, axis)
}
"""

# A branch the source-stage fold_if inlined: a Cast to float inside it, and an If that still runs.
CAST_IN_BRANCH = """
<ir_version: 8, opset_import: ["" : 17]>
branch (bool c, int64[4] idx, float[4] x) => (float[4] y) <float[4] w = {0.5, 1.5, 2.5, 3.5}> {
  h = Mul (x, w)
  y = If (c) <
    then_branch = then_g () => (float[4] t) {
      f = Cast <to = 1> (idx)
      g = Mul (f, w)
      t = Add (g, h)
    },
    else_branch = else_g () => (float[4] e) {
      e = Sub (h, w)
    }
  >
}
"""

# One constant read by fp16 nodes and by block-listed (fp32) ones: Max and TopK.
CONSTANT_READ_BY_BOTH = """
<ir_version: 8, opset_import: ["" : 17]>
both (float[1,4] x) => (float[1,4] y, int64[1,2] k) <float[4] c = {0.1, 0.2, 0.3, 0.4}, int64[1] two = {2}> {
  a = Add (x, c)
  b = Max (a, c)
  values, k = TopK <axis = 1> (b, two)
  s = ReduceSum <keepdims = 1> (values)
  m = Mul (a, c)
  y = Add (m, s)
}
"""


def _converted(text: str):
    model = model_from_text(text)
    result = convert_with_keeps(model)
    onnx.checker.check_model(result.model, full_check=True)
    assert result.kept == []
    return model, result


def _casts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in all_graphs(model.graph) for n in g.node if n.op_type == "Cast"]


def _close(model, converted, feeds, rtol=2e-3):
    expected, actual = run(model, feeds), run(converted, feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=rtol * float(np.abs(value).max()))


def test_range_reads_an_exact_fp32_limit_when_its_cast_is_read_by_fp32_nodes_only():
    model, result = _converted(RANGE_LIMIT_THROUGH_CAST)
    nodes = {n.name: n for n in result.model.graph.node}
    made = {out: n for n in result.model.graph.node for out in n.output}
    range_node = next(n for n in nodes.values() if n.op_type == "Range")
    limit = made[range_node.input[1]]
    # the model's own Cast writes fp32 for Range: no fp16 round trip of the width
    assert limit.op_type == "Cast" and limit.attribute[0].i == TensorProto.FLOAT and made[limit.input[0]].op_type == "Gather"
    _close(model, result.model, {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 2, 6)})


def test_constant_of_shape_pad_value_and_masks_beside_fp32_constants_convert():
    model, result = _converted(CONSTANT_OF_SHAPE_AND_MASKS)
    fills = [n for n in result.model.graph.node if n.op_type == "ConstantOfShape"]
    assert [f.attribute[0].t.data_type for f in fills] == [TensorProto.FLOAT16]
    _close(model, result.model, {"x": np.array([[0.5, -1, 2, -0.25], [1, 0, -3, 4]], np.float32)})


def test_a_cast_inside_a_branch_sits_before_its_reader_and_the_branch_reads_an_fp16_copy():
    model, result = _converted(CAST_IN_BRANCH)
    assert out_of_order(result.model) is None
    if_node = next(n for n in result.model.graph.node if n.op_type == "If")
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert [a.i for n in then_branch.node if n.op_type == "Cast" for a in n.attribute] == [TensorProto.FLOAT16]
    assert if_node.output[0] != "y"  # the If writes fp16; one Cast makes the fp32 output
    feeds = {"idx": np.array([1, 2, 3, 4], np.int64), "x": np.linspace(-1, 1, 4, dtype=np.float32)}
    for c in (True, False):
        _close(model, result.model, {**feeds, "c": np.array(c)})


def test_a_constant_read_by_fp16_and_fp32_nodes_gets_one_exact_copy_per_precision():
    model, result = _converted(CONSTANT_READ_BY_BOTH)
    copies = {t.name: t for t in result.model.graph.initializer if t.name.startswith("c")}
    assert sorted(t.data_type for t in copies.values()) == [TensorProto.FLOAT, TensorProto.FLOAT16]
    exact = next(t for t in copies.values() if t.data_type == TensorProto.FLOAT)
    source = next(t for t in model.graph.initializer if t.name == "c")
    assert exact.name == "c" and np.array_equal(numpy_helper.to_array(exact), numpy_helper.to_array(source))
    # casts: x in, a to fp32 for TopK, values back... only on region edges, none on constants
    assert all(not n.input[0].startswith("c") for n in _casts(result.model))
    _close(model, result.model, {"x": np.array([[0.5, -1, 2, -0.25]], np.float32)})


@pytest.mark.parametrize("text", [RANGE_LIMIT_THROUGH_CAST, CONSTANT_OF_SHAPE_AND_MASKS, CAST_IN_BRANCH, CONSTANT_READ_BY_BOTH])
def test_keeping_every_node_is_the_fp32_model_with_no_cast(text):
    model = name_unnamed_nodes(model_from_text(text)).model
    names = {n.name for g in all_graphs(model.graph) for n in g.node}
    result = convert_with_keeps(model, keep={name: "all" for name in names})
    added = [n for n in _casts(result.model) if n.name not in names]
    assert added == []


def test_a_repair_that_breaks_order_is_named():
    model = model_from_text(CONSTANT_READ_BY_BOTH)

    def reverse(model, settings):
        broken = onnx.ModelProto.FromString(model.SerializeToString())
        nodes = list(broken.graph.node)[::-1]
        del broken.graph.node[:]
        broken.graph.node.extend(nodes)
        return PassResult(broken, True, [{"what": "reversed"}])

    with pytest.raises(OrderBroken, match="'repair reverse_nodes' broke topological order: node '.*' reads '.*' before the node that makes it"):
        run_passes(model, [Repair(name="reverse_nodes", order=999, stage="source", rewrite=reverse)], finish=False)


def test_the_fallback_reads_a_checker_error_on_a_block_listed_node_as_its_feeders():
    """Parsing errors is the fallback, never the mechanism; it reads the Range form the checker
    gives (`(op_type:Range, node name: …)`) and keeps what feeds the fp32 node."""
    from pipeline.precision.converter_errors import offending_nodes

    model = name_unnamed_nodes(model_from_text(RANGE_LIMIT_THROUGH_CAST)).model
    range_node = next(n for n in model.graph.node if n.op_type == "Range")
    error = f"[ShapeInferenceError] (op_type:Range, node name: {range_node.name}): limit typestr: T, has unsupported type: tensor(float16)"
    found = offending_nodes(error, None, model, blocked_ops={"Range"})
    ops = {n.name: n.op_type for n in model.graph.node}
    assert sorted(ops[name] for name in found) == ["Cast", "Constant", "Constant"]
    assert all(f"feeds the fp32 node '{range_node.name}'" in why for why in found.values())
    # onnxruntime's run-time form names the node too
    assert "Slice_3" in offending_nodes("Non-zero status code returned while running Slice node. Name:'Slice_3' Status Message: …", None, _slice_model(), set())


def _slice_model():
    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    s (float[4] x) => (float[2] y) <int64[1] s0 = {0}, int64[1] e0 = {2}> {
      a = Relu (x)
      b = Neg (a)
      c = Abs (b)
      y = Slice (c, s0, e0)
    }
    """)
    return name_unnamed_nodes(model).model
