"""Converter failures become nodes kept in fp32: each class of failure on a generated model ends
with a valid fp16 model, close to fp32, and the expected kept nodes."""

import re

import numpy as np
import onnx
import pytest
from onnxconverter_common import float16

from pipeline.graph.passes.topo_sort import topological_sort
from pipeline.precision.fp16 import FP16Refused, SAFE_BLOCK_LIST, convert_with_keeps
from pipeline.precision.converter_errors import ConversionError, convert_keeping, mixed_float_nodes, name_unnamed_nodes, offending_nodes
from build_helpers import model_from_text, run
from fp16_models import mask_model, pad_in_if_model


def _plain_conversion_error(model: onnx.ModelProto) -> str:
    named = name_unnamed_nodes(model).model
    converted = float16.convert_float_to_float16(named, keep_io_types=True, op_block_list=SAFE_BLOCK_LIST)
    converted = topological_sort(converted).model
    with pytest.raises(Exception) as error:
        onnx.checker.check_model(converted, full_check=True)
    return str(error.value)


def test_mask_constant_read_by_fp16_and_fp32_nodes_gets_one_copy_per_precision():
    model = mask_model()
    assert "B has inconsistent type" in _plain_conversion_error(model)
    result = convert_with_keeps(model)
    # Typed by construction: Max (block-listed) reads `zero` in fp32, Equal, Less and Where an fp16
    # copy of it; no node is kept from an error.
    assert result.kept == []
    assert not any(s["name"] == "fp16_keep" for s in result.steps)
    zeros = {t.name: t.data_type for t in result.model.graph.initializer if t.name.startswith("zero")}
    assert sorted(zeros.values()) == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16]
    onnx.checker.check_model(result.model, full_check=True)
    feeds = {"x": np.array([[0, 1, -2, 3], [-1, 0, 0.5, 2]], np.float32)}
    np.testing.assert_allclose(run(result.model, feeds)["y"], run(model, feeds)["y"], rtol=2e-3)


def test_pad_with_fp32_value_inside_if_converts_both_pads_with_an_fp16_copy_of_the_value():
    model = pad_in_if_model()
    # onnx 1.2x words this class "constant_value has inconsistent type"; older onnx said
    # "Inferred elem type differs from existing elem type" (the mapping test below covers it).
    assert re.search("inconsistent type|Inferred elem type differs", _plain_conversion_error(model))
    result = convert_with_keeps(model)
    assert result.kept == []  # the branches read the fp16 copy of `v` that the outer graph makes
    assert not mixed_float_nodes(result.model)
    onnx.checker.check_model(result.model, full_check=True)
    x = np.array([[1, 2, 3, 4]], np.float32)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_allclose(run(result.model, feeds)["y"], run(model, feeds)["y"], rtol=2e-3)


def test_error_text_maps_inferred_type_mismatch_to_the_node_and_its_readers():
    """onnx's "Inferred elem type differs from existing elem type" names the tensor: its producer
    and readers are the nodes to keep."""
    model = model_from_text("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) <float[2] w = {1.0, 2.0}> {
      a = Mul (x, w)
      y = Relu (a)
    }
    """)
    named = name_unnamed_nodes(model).model
    error = "[ShapeInferenceError] Inferred elem type differs from existing elem type: (FLOAT16) vs (FLOAT) for 'a'"
    assert set(offending_nodes(error, named, named)) == {"Mul_0", "Relu_1"}


def test_onnxruntime_refusal_is_retried_and_an_unfixable_model_is_refused_with_the_reason():
    model = name_unnamed_nodes(mask_model()).model
    calls = []

    def convert(m, keep):
        calls.append(set(keep))
        return m

    def refuse(m):
        return "Type Error: Type (tensor(float16)) of input arg (e) of node (Where_2) does not match"

    with pytest.raises(Exception, match="names no further node"):
        convert_keeping(model, convert, validate=refuse)
    assert calls[0] == set() and {"Where_2", "Equal_1"} <= calls[1]

    def always_broken(m, keep):
        raise ConversionError("onnxconverter-common failed: something without names")

    with pytest.raises(Exception, match="names no further node"):
        convert_keeping(model, always_broken)


def test_keep_nodes_are_a_no_op_on_a_clean_model():
    from build_helpers import conv_model

    result = convert_with_keeps(conv_model())
    assert result.kept == [] and not any(s["name"] == "fp16_keep" for s in result.steps)


def test_refused_conversion_names_the_reason():
    model = pad_in_if_model()
    with pytest.raises(FP16Refused, match="invalid"):
        convert_with_keeps(model, keep=None, validate=lambda m: "onnxruntime refused: no node names at all")
