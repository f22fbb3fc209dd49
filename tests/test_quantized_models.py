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
