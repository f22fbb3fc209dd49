"""fp16 conversion on generated models, one per failure class measured on real models."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from pipeline.graph.passes.detach_consumed_outputs import detach_consumed_outputs
from pipeline.graph.passes.topo_sort import topological_sort
from pipeline.precision.detect import detect_precision
from pipeline.precision.fp16 import FP16Refused, convert_to_fp16, upcast_to_fp32
from build_helpers import CAST_TO_FLOAT, IF_MODEL, OUTPUT_ALSO_CONSUMED, conv_model, model_from_text, run
from onnxconverter_common import float16


def _fp16_weights(model: onnx.ModelProto) -> int:
    return sum(t.data_type == TensorProto.FLOAT16 for t in model.graph.initializer)


def test_plain_converter_breaks_cast_model_and_pack_repairs_it():
    model = model_from_text(CAST_TO_FLOAT)
    feeds = {"idx": np.array([1, 2, 3, 4], np.int64), "x": np.linspace(-1, 1, 4, dtype=np.float32)}
    plain = float16.convert_float_to_float16(model, keep_io_types=True)
    with pytest.raises(Exception, match="does not match expected type|type"):
        run(plain, feeds)
    converted, _ = convert_to_fp16(model)
    # The typing makes the Cast write fp16 itself: no repair after the conversion
    casts = [n for n in converted.graph.node if n.op_type == "Cast" and n.input[0] != "x" and n.output[0] != "y"]
    assert [a.i for n in casts for a in n.attribute if a.name == "to"] == [TensorProto.FLOAT16]
    np.testing.assert_allclose(run(converted, feeds)["y"], run(model, feeds)["y"], rtol=2e-3)


def test_plain_converter_breaks_consumed_output_and_pack_repairs_it():
    model = model_from_text(OUTPUT_ALSO_CONSUMED)
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7}
    plain = float16.convert_float_to_float16(model, keep_io_types=True)
    with pytest.raises(Exception):
        run(plain, feeds)
    converted, steps = convert_to_fp16(model)
    assert any(s["name"] == "detach_consumed_outputs" and s["changed"] for s in steps)
    expected, actual = run(model, feeds), run(converted, feeds)
    for name in ("h", "y"):
        np.testing.assert_allclose(actual[name], expected[name], rtol=2e-3)
    assert _fp16_weights(converted) == 1


@pytest.mark.parametrize("repair, text", [(detach_consumed_outputs, OUTPUT_ALSO_CONSUMED), (topological_sort, OUTPUT_ALSO_CONSUMED)])
def test_fp16_readiness_passes_are_idempotent_and_equal(repair, text):
    model = model_from_text(text)
    feeds = {"x": np.ones((2, 3), np.float32)}
    once = repair(model)
    twice = repair(once.model)
    assert not twice.changed
    for name, value in run(model, feeds).items():
        np.testing.assert_array_equal(run(once.model, feeds)[name], value)


def test_fp16_readiness_passes_are_no_ops_on_clean_models():
    model = conv_model()
    for repair in (detach_consumed_outputs, topological_sort):
        result = repair(model)
        assert not result.changed and result.records == []
        assert result.model.SerializeToString() == model.SerializeToString()


def test_topological_sort_orders_shuffled_nodes():
    model = conv_model()
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    result = topological_sort(model)
    assert result.changed
    onnx.checker.check_model(result.model)


def test_if_model_is_converted_correctly_or_refused_with_reason():
    model = model_from_text(IF_MODEL)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    try:
        converted, _ = convert_to_fp16(model)
    except FP16Refused as refusal:
        assert str(refusal)
        return
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_allclose(run(converted, feeds)["y"], run(model, feeds)["y"], rtol=2e-3)


def test_already_fp16_is_detected_and_upcast_back():
    model = conv_model()
    converted, _ = convert_to_fp16(model)
    assert detect_precision(converted)[0] == "fp16"
    with pytest.raises(Exception, match="already"):
        float16.convert_float_to_float16(converted, keep_io_types=True)
    upcast, step = upcast_to_fp32(converted)
    assert step["changed"] and detect_precision(upcast)[0] == "fp32"
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(upcast, feeds)["y"], run(model, feeds)["y"], atol=5e-3)


def test_quantized_model_is_detected():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    q (float[4] x) => (float[4] y) {
      qx, scale, zp = DynamicQuantizeLinear (x)
      y = DequantizeLinear (qx, scale, zp)
    }
    """
    precision, why = detect_precision(model_from_text(text))
    assert precision == "quantized" and "DynamicQuantizeLinear" in why


def test_ir_version_cap_lowers_onnx_default_and_is_a_no_op_below():
    from pipeline.graph.passes.ir_version import ir_version_cap
    from pipeline.stages.repair import repair_settings
    from pipeline.recipe import Recipe

    settings = repair_settings(Recipe(name="m"))  # the default runtime, its ceiling measured from the release
    ceiling = settings.max_ir_version
    model = conv_model()
    model.ir_version = 14  # what onnx 1.23 writes by default
    result = ir_version_cap(model, settings)
    assert result.changed and result.model.ir_version == ceiling and model.ir_version == 14
    assert not ir_version_cap(result.model, settings).changed
    feeds = {"x": np.ones((1, 3, 16, 16), np.float32)}
    np.testing.assert_array_equal(run(result.model, feeds)["y"], run(model, feeds)["y"])
    clean = conv_model()
    assert clean.ir_version <= ceiling and not ir_version_cap(clean).changed


def test_upcast_model_converts_again():
    """The converter is not idempotent: a re-conversion must not meet its own cast names."""
    model = conv_model()
    converted, _ = convert_to_fp16(model)
    upcast, step = upcast_to_fp32(converted)
    assert not any(n.op_type == "Cast" for n in upcast.graph.node)
    again, _ = convert_to_fp16(upcast)
    feeds = {"x": np.random.default_rng(2).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(again, feeds)["y"], run(model, feeds)["y"], atol=1e-2)


def test_second_conversion_around_blocked_ops_keeps_single_assignment():
    """A model converted before (Resize kept fp32 behind `*_output_cast_0` tensors) and upcast
    converts again: the converter would otherwise reuse those names."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    up (float[1,2,4,4] x) => (float[1,2,8,8] y) <float[4] scales = {1.0, 1.0, 2.0, 2.0}, float[1] w = {0.5}> {
      h = Mul (x, w)
      r = Resize <mode = "nearest"> (h, , scales)
      y = Relu (r)
    }
    """
    model = model_from_text(text)
    converted, _ = convert_to_fp16(model)
    upcast, _ = upcast_to_fp32(converted)
    again, steps = convert_to_fp16(upcast)
    assert steps[0]["name"] == "rename_converter_names"
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 2, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(again, feeds)["y"], run(model, feeds)["y"], atol=2e-3)


def test_rename_converter_names_is_idempotent_and_a_no_op_on_clean_models():
    from pipeline.graph.passes.rename_converter_names import rename_converter_names

    assert not rename_converter_names(conv_model()).changed
    converted, _ = convert_to_fp16(model_from_text(OUTPUT_ALSO_CONSUMED))
    once = rename_converter_names(converted)
    assert not rename_converter_names(once.model).changed
