"""Tiny models in ONNX text format and helpers to run them, for the foundation's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort


def model_from_text(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def conv_model(channels: int = 4, size: int = 16) -> onnx.ModelProto:
    """A small conv net with random fp32 weights: x[1,3,S,S] -> y[1,3,S,S]."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (channels, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (3, channels, 3, 3)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
            onnx.helper.make_node("Relu", ["h"], ["r"], name="relu"),
            onnx.helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2"),
        ],
        "conv",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, size, size])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3, size, size])],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# Cast retarget: an int64 input cast to float and multiplied by a float weight.
CAST_TO_FLOAT = """
<ir_version: 8, opset_import: ["" : 17]>
cast_model (int64[4] idx, float[4] x) => (float[4] y) <float[4] w = {0.5, 1.5, 2.5, 3.5}> {
  f = Cast <to = 1> (idx)
  s = Mul (f, w)
  y = Add (s, x)
}
"""

# Output also consumed: `h` is a graph output and read by the next node.
OUTPUT_ALSO_CONSUMED = """
<ir_version: 8, opset_import: ["" : 17]>
consumed (float[2,3] x) => (float[2,3] h, float[2,3] y) <float[2,3] w = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}> {
  h = Mul (x, w)
  y = Add (h, w)
}
"""

# A model whose If condition depends on an input: conversion must handle or refuse the subgraphs.
IF_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
if_model (bool c, float[3] x) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> {
  y = If (c) <
    then_branch = then_g () => (float[3] t) { t = Mul (x, w) },
    else_branch = else_g () => (float[3] e) { e = Add (x, w) }
  >
}
"""


# The work each stage after the fetch does, where its module calls it: patched to prove it did not run.
STAGE_WORK = ("pipeline.stages.convert.make_variants", "pipeline.stages.models.write_models", "pipeline.stages.host_verify.host_checks",
              "pipeline.stages.webgpu_kernels.webgpu_kernel_stage", "pipeline.stages.samples.decisive_feeds")
