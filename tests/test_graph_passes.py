"""Each repair pass on tiny graphs: same numbers as the original on onnxruntime, idempotent, and a
no-op on models without its pattern."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_helpers import (
    FFC_FLIP_MODEL,
    FFC_MODEL,
    assert_no_op,
    assert_repair,
    clean_conv_model,
    constant_if_model,
    decoder_head_model,
    neg_slice_model,
    positive_slice_model,
    random_inputs,
    run_host,
    shape_if_model,
)
from pipeline.graph import repairs
from pipeline.graph.passes.util import constant_values


@pytest.mark.parametrize("name", repairs.names())
@pytest.mark.parametrize("make", [clean_conv_model, positive_slice_model, lambda: decoder_head_model(stale=False)])
def test_every_repair_is_a_no_op_on_models_without_its_pattern(name, make):
    assert_no_op(name, make())


# --- stale_shapes -------------------------------------------------------------------------------

def test_stale_shapes_replaces_the_squeeze_value_info_and_reports_it():
    model = decoder_head_model(stale=True)
    repaired = assert_repair("stale_shapes", model)
    record, = repairs.get("stale_shapes")(model).records
    assert record["value"] == "audio_1d" and record["recorded"] == [1, 1, 36] and record["inferred"] == [36]
    assert record["node"] == "Squeeze#1"
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in repaired.graph.value_info}
    assert shapes["audio_1d"] == [36]


def test_stale_shapes_reports_every_disagreeing_shape_and_wrong_outputs():
    model = decoder_head_model(stale=True)
    extra = onnx.helper.make_tensor_value_info("normalised", onnx.TensorProto.FLOAT, [7])
    model.graph.value_info.append(extra)
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 99
    result = repairs.get("stale_shapes")(model)
    found = {(r["value"], r["where"], tuple(r["recorded"]), tuple(r["inferred"])) for r in result.records}
    assert found == {("audio_1d", "value_info", (1, 1, 36), (36,)), ("normalised", "value_info", (7,), (36,)),
                     ("audio", "output", (99,), (36,))}
    assert result.model.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 36


def test_stale_shapes_keeps_symbolic_dims_that_inference_makes_concrete():
    model = neg_slice_model(length="N")
    model.graph.value_info.append(onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 1, "N"]))
    assert not repairs.get("stale_shapes")(model).changed


# --- neg_step_slice -----------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [10, 11, 17, 18])
def test_neg_step_slice_static_length_reads_through_index_zero(opset):
    model = neg_slice_model(opset=opset)
    repaired = assert_repair("neg_step_slice", model)
    slice_node = next(n for n in repaired.graph.node if n.op_type == "Slice")
    values = constant_values(repaired.graph)
    assert values[slice_node.input[2]].tolist() == [0]  # an in-range end on every build
    assert [n.op_type for n in repaired.graph.node] == ["Pad", "Slice"]


@pytest.mark.parametrize("length", [1, 2, 31, 64])
def test_neg_step_slice_dynamic_length(length):
    model = neg_slice_model(length="N")
    record, = repairs.get("neg_step_slice")(model).records
    assert record["dynamic_length"] is True and record["padded_axes"] == [3]
    assert_repair("neg_step_slice", model, dims={"N": length})


@pytest.mark.parametrize(("start", "end", "step"), [
    (5, -9223372036854775807, -2),
    (9223372036854775807, -9223372036854775807, -1),
    (-3, -100, -1),
    (9223372036854775807, 2, -1),  # only the start is out of range: no pad needed
    (-40, -9223372036854775807, -1),  # start before index 0 on a static axis: clamps to 0
])
def test_neg_step_slice_other_bounds(start, end, step):
    model = neg_slice_model(start=start, end=end, step=step)
    repaired = assert_repair("neg_step_slice", model)
    values = constant_values(repaired.graph)
    slice_node = next(n for n in repaired.graph.node if n.op_type == "Slice")
    padded = any(n.op_type == "Pad" for n in repaired.graph.node)
    length = 31 + padded
    assert all(-length <= v < length for v in values[slice_node.input[1]].tolist() + values[slice_node.input[2]].tolist())


def test_neg_step_slice_leaves_in_range_reversals_alone():
    # end -32 on a 31-long axis is "through index 0" too; end -31 stops before it and is in range.
    assert repairs.get("neg_step_slice")(neg_slice_model(end=-32)).changed
    assert not repairs.get("neg_step_slice")(neg_slice_model(end=-31)).changed


def test_neg_step_slice_repairs_the_ffc_flip_and_keeps_its_numbers():
    model = onnx.load(FFC_FLIP_MODEL)
    repaired = assert_repair("neg_step_slice", model)
    assert sum(n.op_type == "Pad" for n in repaired.graph.node) == 1
    assert not repairs.get("neg_step_slice")(onnx.load(FFC_MODEL)).changed


# --- fold_if ------------------------------------------------------------------------------------

def test_fold_if_on_a_static_shape_condition_inlines_the_then_branch():
    repaired = assert_repair("fold_if", shape_if_model(batch=1))
    assert [n.op_type for n in repaired.graph.node] == ["Mul", "Add"]  # the condition's nodes are gone
    assert [i.name for i in repaired.graph.initializer] == ["If4/k"]  # the condition's constants are gone


def test_fold_if_takes_the_else_branch_when_the_condition_is_false():
    repaired = assert_repair("fold_if", shape_if_model(batch=3))
    assert [n.op_type for n in repaired.graph.node] == ["Neg"]


def test_fold_if_leaves_run_time_conditions_alone():
    assert not repairs.get("fold_if")(shape_if_model(batch="N")).changed


def test_fold_if_folds_nested_constant_conditions_and_pass_through_outputs():
    model = constant_if_model()
    repaired = assert_repair("fold_if", model)
    assert not any(n.op_type == "If" for n in repaired.graph.node)
    assert len(repairs.get("fold_if")(model).records) == 2
