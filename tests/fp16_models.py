"""Generated models, one per fp16 failure class seen on real speech and audio models."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.build_helpers import model_from_text

# An attention-mask pattern (VITS-style TTS): the fp32 constant `zero` is shared with Max, which
# the converter keeps in fp32, so `zero` stays fp32 beside Equal's converted input:
# onnx.checker says "B has inconsistent type".
MASK_EQUAL = """
<ir_version: 8, opset_import: ["" : 17]>
mask_model (float[2,4] x) => (float[2,4] y) <float zero = {0.0}, float neg = {-1.0}> {
  m = Mul (x, x)
  e = Equal (m, zero)
  w = Where (e, neg, m)
  l = Less (w, zero)
  z = Where (l, zero, w)
  y = Max (z, zero)
}
"""

# STFT padding inside an If (voice-activity models): the Pads' scalar value `v` is an fp32 constant
# (shared with Max, kept in fp32) while their data input `h` became fp16.
PAD_IN_IF = """
<ir_version: 8, opset_import: ["" : 17]>
pad_model (bool c, float[1,4] x) => (float[1,8] y) <float v = {0.5}> {
  h = Mul (x, x)
  m = Max (h, v)
  y = If (c) <
    then_branch = then_g () => (float[1,8] t) {
      pads = Constant <value = int64[4] {0, 2, 0, 2}> ()
      p = Pad <mode = "constant"> (h, pads, v)
      t = Sqrt (p)
    },
    else_branch = else_g () => (float[1,8] e) {
      pads2 = Constant <value = int64[4] {0, 4, 0, 0}> ()
      e = Pad <mode = "constant"> (h, pads2, v)
    }
  >
}
"""


def mask_model() -> onnx.ModelProto:
    return model_from_text(MASK_EQUAL)


def pad_in_if_model() -> onnx.ModelProto:
    return model_from_text(PAD_IN_IF)


def overflow_model(width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """An audio head: `pcm` = tanh(...) × 32767 (the int16 scale, a constant fp16 conversion clamps
    to 1e4) and its `energy` = ReduceSumSquare(pcm), far above 65504 (inf in fp16); beside them a
    small MLP output `y` that fp16 handles well. Both failures show on onnxruntime CPU, which runs
    most fp16 ops in fp32 internally: a clamped constant and an out-of-range graph output do not
    depend on that."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("Tanh", ["a"], ["t"], name="tanh1"),
        helper.make_node("Mul", ["t", "int16_scale"], ["pcm"], name="pcm_scale"),
        helper.make_node("ReduceSumSquare", ["pcm", "axes"], ["energy"], keepdims=1, name="energy_sum"),
        helper.make_node("MatMul", ["t", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes, "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width]),
            helper.make_tensor_value_info("pcm", TensorProto.FLOAT, [1, width]),
            helper.make_tensor_value_info("energy", TensorProto.FLOAT, [1, 1]),
        ],
        [
            numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array(32767.0, np.float32), "int16_scale"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# onnxruntime CPU computes fp16 ReduceSumSquare in fp32 and drops the casts around it, so on the
# host only the clamped constant needs fp32; fp16 kernels (WebGPU) need `energy_sum` too.
OVERFLOW_KEPT = ["pcm_scale"]
OVERFLOW_KEPT_FP16_KERNELS = ["energy_sum", "pcm_scale"]
