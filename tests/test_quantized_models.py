"""Quantized exports (onnxruntime's dynamic quantizer) and stale output declarations: judged and
declared the same way as their fp32 sibling; every quantized op named; no summary line prints None."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from pipeline.assets.delivery import delivery_lines
from pipeline.cli import app
from pipeline.commands.summary import print_summary
from pipeline.precision.detect import detect_precision, quantized_ops

H, F, S, O = 8, 16, 24, 10


def crnn_like() -> onnx.ModelProto:
    """An LSTM recognizer's head whose export declares its output `[1, 'seqlen']`; it gives [24, 1, 10]."""
    rng = np.random.default_rng(0)
    weights = {"W": rng.normal(0, 0.3, (1, 4 * H, F)), "R": rng.normal(0, 0.3, (1, 4 * H, H)), "B": np.zeros((1, 8 * H)), "P": rng.normal(0, 0.3, (H, O))}
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()] + [numpy_helper.from_array(np.array([1], np.int64), "axis")]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y"], hidden_size=H, name="lstm"),
         helper.make_node("Squeeze", ["Y", "axis"], ["Ys"], name="squeeze"),
         helper.make_node("MatMul", ["Ys", "P"], ["y"], name="proj")],
        "crnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, 1, F])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path_factory.mktemp("crnn")
    fp32 = folder / "crnn.onnx"
    onnx.save(crnn_like(), str(fp32))
    int8 = folder / "crnn-int8.onnx"
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return {"fp32": fp32, "int8": int8}


def build(*args: str):
    return CliRunner().invoke(app, ["build", *args])


def test_every_quantized_op_is_named_com_microsoft_ones_too(models):
    model = onnx.load(str(models["int8"]))
    assert quantized_ops(model) == {"DynamicQuantizeLinear": 1, "MatMulInteger": 1, "com.microsoft::DynamicQuantizeLSTM": 1}
    assert detect_precision(model) == ("quantized", "quantized ops: DynamicQuantizeLinear, MatMulInteger, com.microsoft::DynamicQuantizeLSTM")
    inspected = CliRunner().invoke(app, ["inspect", str(models["int8"]), "--no-browser"])
    assert inspected.exit_code == 0, inspected.output
    assert "quantized ops: DynamicQuantizeLinear 1, MatMulInteger 1, com.microsoft::DynamicQuantizeLSTM 1" in inspected.output


def test_a_stale_output_declaration_is_repaired_alike_for_the_fp32_and_the_quantized_export(models, tmp_path):
    """The fp32 sibling's declaration is repaired by stale_shapes (inference sees through LSTM);
    behind com.microsoft's DynamicQuantizeLSTM inference sees nothing, and the run decides: both
    packages declare [24, 1, 10], and the quantized one is no longer refused for its declaration."""
    declared = {}
    for name, path in models.items():
        out = tmp_path / name
        result = build(str(path), "--no-browser", "--out", str(out))
        assert result.exit_code == 0, result.stdout + result.stderr
        package = next(out.iterdir())
        declared[name] = json.loads((package / "manifest.json").read_text())["outputs"][0]["shape"]
        if name == "int8":
            assert "warning: output 'y' declares shape [1, 'seqlen'], the model gives [24, 1, 10] on the sample; the package declares what it gives" in result.stderr
            assert "None" not in result.stdout
            assert "ok   host    cpu/quantized" in result.stdout
    assert declared == {"fp32": [24, 1, 10], "int8": [24, 1, 10]}


def test_a_chain_every_variant_is_refused_on_says_so_instead_of_none():
    visit = {"chain": ["wasm"], "bundle": "wasm", "variant": None, "files": 18, "bytes": 14_500_000, "wire_bytes": 2_500_000}
    lines = delivery_lines({"package": {"bytes": 1, "files": 1, "hosted_bytes": 1}, "first_visit": {"apple-mobile": visit}, "repeat_visit": {"bytes": 0, "revalidated": [], "bytes_after_republish": 0}})
    assert "(18 files: wasm runtime bundle, no model: every variant is refused on this chain)" in lines[1] and "None" not in "".join(lines)


def test_a_refused_ep_leaves_the_chains_the_summary_prints(tmp_path, capsys):
    manifest = {"executionProviders": {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]},
                "verification": {"refusedEps": [{"ep": "webgpu", "platforms": ["desktop"], "evidence": "webgpu-kernels fp32: failed"},
                                                {"ep": "wasm", "platforms": ["apple-mobile"], "evidence": "host quantized: failed"}]}}
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "executionProviders": {"desktop": ["wasm"], "apple-mobile": ["wasm"]}}))
    report = {"name": "m", "passed": False, "checks": [], "verdict": ["no check passed"], "timings": {}}
    print_summary(report, tmp_path)
    printed = capsys.readouterr().out
    assert "REFUSED EP: webgpu (no variant passed on it: webgpu-kernels fp32: failed); chains now: desktop wasm" in printed
    assert "REFUSED EP: wasm (no variant passed on it: host quantized: failed); chains now: apple-mobile none left" in printed


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def conv_net() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], name="conv"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("kind", ["lstm-matmul", "conv"])
def test_the_dequantized_twin_is_the_fp32_model_up_to_weight_rounding(models, tmp_path, kind):
    """The fp32 reference of a quantized model: its integer ops' float twins on the dequantized
    weights. It lands within the weights' rounding of the fp32 original, and the quantized model
    within the activations' quantization error of it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from pipeline.precision.dequantize import dequantized

    if kind == "conv":
        fp32_path = save_model(conv_net(), tmp_path / "conv.onnx")
        int8_path = tmp_path / "conv-int8.onnx"
        quantize_dynamic(str(fp32_path), str(int8_path), weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv"])
        x = np.random.default_rng(2).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    else:
        fp32_path, int8_path = models["fp32"], models["int8"]
        x = np.random.default_rng(2).uniform(-1, 1, (S, 1, F)).astype(np.float32)
    fp32, int8 = onnx.load(str(fp32_path)), onnx.load(str(int8_path))
    twin = dequantized(int8)
    assert not isinstance(twin, str), twin
    onnx.checker.check_model(twin)
    assert not quantized_ops(twin).keys() - {"DynamicQuantizeLinear"}  # its scale is all that is read of it
    reference, quantized, original = _run(twin, {"x": x}), _run(int8, {"x": x}), _run(fp32, {"x": x})
    spread = float(original.max() - original.min())
    # uint8 per-tensor weights round by up to half a step of 1/255 of their range: ~1 % of the output's
    assert np.abs(reference - original).max() / spread < 0.02
    assert 0 < np.abs(quantized - reference).max() / spread < 0.1


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_a_quantized_model_is_judged_against_its_float_twin_on_the_host_and_the_webgpu_kernels(models, tmp_path):
    result = build(str(models["int8"]), "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 0, result.output
    assert "step fp32_reference: the model dequantized: every variant is judged against it" in result.stdout
    lines = result.stdout.splitlines()
    host = next(line for line in lines if "host    cpu/quantized" in line)
    kernels = next(line for line in lines if "webgpu-kernels webgpu/quantized" in line)
    assert "max_abs_of_range" in host and "(<= 0.75)" in host and "nan 0" not in host
    assert kernels.lstrip().startswith(("ok", "FAIL", "n/v", "skip"))


def test_a_quantized_model_without_a_float_twin_says_why_it_is_its_own_reference(tmp_path):
    # com.microsoft's QLinearSoftmax has no twin in pipeline/precision/dequantize.py
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("QLinearSoftmax", ["q", "s", "z", "s", "z"], ["p"], domain="com.microsoft", axis=-1, opset=13),
         helper.make_node("DequantizeLinear", ["p", "s", "z"], ["y"])],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(0.01, np.float32), "s"), numpy_helper.from_array(np.array(0, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    result = build(str(save_model(model, tmp_path / "qdq.onnx")), "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 1, result.output  # nothing but a self-reference: no check passed
    assert "step fp32_reference" not in result.stdout  # not changed: the record says none
    report = json.loads((tmp_path / "d" / "qdq" / "report.json").read_text())
    step = next(s for s in report["steps"] if s["name"] == "fp32_reference")
    assert step["records"][0]["what"].startswith("none: no float twin for com.microsoft::QLinearSoftmax")
    kernels = next(c for c in report["checks"] if c["stage"] == "webgpu-kernels")
    assert kernels["status"] == "skipped" and kernels["detail"] == "no fp32 reference to judge it by (no float twin for com.microsoft::QLinearSoftmax)"
