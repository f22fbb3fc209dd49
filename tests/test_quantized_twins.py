"""Float twins of statically quantized models: one small fp32 model quantized by onnxruntime's own
quantizers (`quantize_static` in the QDQ and QOperator formats, per tensor and per axis, 8 and 4
bits; `MatMulNBitsQuantizer`'s 4-bit blocks). The twin is fp32, onnxruntime runs it, it lands within
the weights' rounding of the fp32 original (so it is the right float model), the quantized model
lands within the quantized bounds of it, and `pack build` judges against it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.precision.detect import quantized_ops
from pipeline.precision.dequantize import dequantized
from pipeline.verify.judgement.metrics import compare
from pipeline.verify.judgement.thresholds import threshold_for

SHAPE = (1, 3, 16, 16)


def small_net() -> onnx.ModelProto:
    """Every op the QOperator quantizer writes a QLinear op for: Conv, Sigmoid, Mul, Add, Concat,
    GlobalAveragePool, MatMul; a Flatten it runs on 8-bit values as they are."""
    rng = np.random.default_rng(0)

    def weight(name, shape, spread=0.3):
        return numpy_helper.from_array(rng.normal(0, spread, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Sigmoid", ["c1"], ["s"], name="sig"),
        helper.make_node("Mul", ["c1", "s"], ["m"], name="mul"),
        helper.make_node("Conv", ["m", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "m"], ["a"], name="add"),
        helper.make_node("Concat", ["a", "c1"], ["cat"], axis=1, name="cat"),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "w3"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b3"], ["y"], name="bias"),
    ]
    weights = [weight("w1", (8, 3, 3, 3)), weight("b1", (8,), 0.1), weight("w2", (8, 8, 3, 3), 0.2), weight("w3", (16, 64)), weight("b3", (64,), 0.1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# name -> (quantize_static settings or "nbits", the twin's bound against fp32 in share of range:
# half a weight step, summed over the layers; 4-bit steps are 16x coarser)
KINDS = {
    "qdq-int8-tensor": ({"quant_format": "QDQ", "per_channel": False, "weight_type": "QInt8"}, 0.02),
    "qdq-uint8-axis": ({"quant_format": "QDQ", "per_channel": True, "weight_type": "QUInt8"}, 0.02),
    "qdq-int4-axis": ({"quant_format": "QDQ", "per_channel": True, "weight_type": "QInt4"}, 0.2),
    "qoperator-uint8-tensor": ({"quant_format": "QOperator", "per_channel": False, "weight_type": "QUInt8"}, 0.02),
    "qoperator-int8-axis": ({"quant_format": "QOperator", "per_channel": True, "weight_type": "QInt8"}, 0.02),
    "matmulnbits-asymmetric": ({"symmetric": False}, 0.1),
    "matmulnbits-symmetric": ({"symmetric": True}, 0.1),
    # the same 4-bit blocks as opset 21 QDQ: uint4 DequantizeLinear with block_size (onnxruntime
    # fuses it with the MatMul into MatMulNBits on its 8-bit activations: the quantized model's error)
    "qdq-uint4-blocked": ({"symmetric": False, "format": "QDQ"}, 0.1),
}


def _sample(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, SHAPE).astype(np.float32)


def _quantize(source: Path, target: Path, settings: dict) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    if "symmetric" in settings:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        model = onnx.load(str(source))
        options = {}
        if settings.get("format") == "QDQ":
            model.opset_import[0].version, model.ir_version = 21, 10  # blocked DequantizeLinear
            options["quant_format"] = QuantFormat.QDQ
        quantizer = MatMulNBitsQuantizer(model, block_size=16, is_symmetric=settings["symmetric"], **options)
        quantizer.process()
        quantizer.model.save_model_to_file(str(target))
        return

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": _sample(seed)} for seed in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(source), str(target), Calibration(), quant_format=getattr(QuantFormat, settings["quant_format"]),
                    per_channel=settings["per_channel"], weight_type=getattr(QuantType, settings["weight_type"]), activation_type=QuantType.QUInt8)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("static")
    fp32 = folder / "small.onnx"
    onnx.save(small_net(), str(fp32))
    made = {"fp32": fp32}
    for name, (settings, _) in KINDS.items():
        made[name] = folder / f"{name}.onnx"
        _quantize(fp32, made[name], settings)
    return made


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_twin_of_a_static_quantization_is_fp32_and_within_the_bounds(models, kind):
    quantized = onnx.load(str(models[kind]))
    assert quantized_ops(quantized), "the quantizer quantized nothing"
    twin = dequantized(quantized)
    assert not isinstance(twin, str), twin
    onnx.checker.check_model(twin)
    assert not quantized_ops(twin) and all(t.data_type == TensorProto.FLOAT for t in twin.graph.initializer if t.name not in ("", None))
    assert not any(op.domain == "com.microsoft" for op in twin.opset_import)
    x = _sample(9)
    original, reference, result = _run(onnx.load(str(models["fp32"])), x), _run(twin, x), _run(models[kind], x)
    spread = float(original.max() - original.min())
    assert np.abs(reference - original).max() / spread < KINDS[kind][1]
    figures = compare(reference, result)
    bounds = threshold_for("tensor", "quantized", "cpu")
    assert figures["max_abs_of_range"] <= bounds["max_abs_of_range"] and figures["rel_l2"] <= bounds["rel_l2"], figures
    if kind == "qdq-uint4-blocked":
        assert any(a.name == "block_size" and a.i == 16 for n in quantized.graph.node for a in n.attribute if n.op_type == "DequantizeLinear")
    if kind.startswith("matmulnbits"):
        # MatMulNBits computes in float on the dequantized blocks: the twin is the same product
        assert figures["max_abs_of_range"] < 1e-5, figures
    else:
        assert figures["max_abs_of_range"] > 0  # the activations' quantization is what is judged


def test_a_wrongly_read_weight_moves_the_twin_off_the_fp32_model(models, monkeypatch):
    """The twin's bound above can fail: per-axis scales applied to the wrong channels."""
    from pipeline.precision.quantized_weights import dequantize

    quantized = onnx.load(str(models["qdq-uint8-axis"]))
    right = dequantized(quantized)
    monkeypatch.setattr("pipeline.precision.dequantize.dequantize", lambda q, s, z, axis=1, block_size=0: dequantize(q, np.flip(s).copy(), z, axis, block_size))
    wrong = dequantized(quantized)
    x = _sample(9)
    original = _run(onnx.load(str(models["fp32"])), x)
    spread = float(original.max() - original.min())
    assert np.abs(_run(right, x) - original).max() / spread < 0.02 < np.abs(_run(wrong, x) - original).max() / spread


@pytest.mark.parametrize("kind", ["qdq-int4-axis", "qoperator-int8-axis", "matmulnbits-asymmetric"])
def test_pack_build_judges_a_static_quantization_against_its_twin(models, tmp_path, kind):
    result = CliRunner().invoke(app, ["build", str(models[kind]), "--no-browser", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "step fp32_reference: the model dequantized: every variant is judged against it" in result.stdout
    report = json.loads(next((tmp_path / "d").iterdir()).joinpath("report.json").read_text())
    host = next(c for c in report["checks"] if c["stage"] == "host")
    assert host["status"] == "passed" and host["threshold"]["max_abs_of_range"] == 0.75 and "nan" not in host["threshold"]
    assert host["metrics"]["max_abs_of_range"] < (1e-5 if kind.startswith("matmulnbits") else 0.75)


def test_an_op_without_a_twin_is_not_verifiable_with_its_name_never_passed(tmp_path):
    """A self-reference judges nothing of the values: the host check is not-verifiable, naming the op,
    and with no other check left the build exits 1 saying so."""
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("QLinearSoftmax", ["q", "s", "z", "ys", "z"], ["p"], domain="com.microsoft", axis=-1, opset=13),
         helper.make_node("DequantizeLinear", ["p", "ys", "z"], ["y"])],
        "qsoftmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(1 / 256, np.float32), "ys"), numpy_helper.from_array(np.array(0, np.uint8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    assert dequantized(model) == "no float twin for com.microsoft::QLinearSoftmax"
    path = tmp_path / "qsoftmax.onnx"
    onnx.save(model, str(path))
    result = CliRunner().invoke(app, ["build", str(path), "--no-browser", "--out", str(tmp_path / "d")])
    assert result.exit_code == 1, result.output
    report = json.loads((tmp_path / "d" / "qsoftmax" / "report.json").read_text())
    host = next(c for c in report["checks"] if c["stage"] == "host")
    assert host["status"] == "not-verifiable" and "no float twin for com.microsoft::QLinearSoftmax" in host["detail"]
    assert not any(c["status"] == "passed" for c in report["checks"])
    assert "host quantized (any bundle, any EP): not-verifiable" in report["verdict"][0] and "QLinearSoftmax" in report["verdict"][0]
