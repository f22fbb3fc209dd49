"""Generated models, one per fp16 failure class seen on real speech and audio models."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from build_helpers import model_from_text

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
    """An audio head: `pcm` = tanh(...) × 32768 (the int16 scale, exact in fp16) minus a DC estimate tanh(...) ×
    32600.3 (a cancellation: fp16 rounds 32600.3 to 32608, and `pcm` is 196× smaller than its
    inputs), and its `energy` = ReduceSumSquare(pcm), far above 65504 (inf in fp16); beside them a
    small MLP output `y` that fp16 handles well. The rounded constant shows on onnxruntime CPU,
    which runs most fp16 ops in fp32 internally; the overflow only on fp16 kernels."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(width), (width, width)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("Tanh", ["a"], ["t"], name="tanh1"),
        helper.make_node("Mul", ["t", "int16_scale"], ["pcm_raw"], name="pcm_scale"),
        helper.make_node("Mul", ["t", "dc_gain"], ["dc"], name="dc_est"),
        helper.make_node("Sub", ["pcm_raw", "dc"], ["pcm"], name="dc_remove"),
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
            numpy_helper.from_array(np.array(32768.0, np.float32), "int16_scale"),
            numpy_helper.from_array(np.array(32600.3, np.float32), "dc_gain"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# onnxruntime CPU computes fp16 ReduceSumSquare in fp32 and drops the casts around it, so on the
# host only the rounded DC gain needs fp32; fp16 kernels (WebGPU) need `energy_sum` too, and the
# cancelling Sub (inputs near 28000 have an fp16 spacing of 16; its output is near 145).
OVERFLOW_KEPT = ["dc_est"]
OVERFLOW_KEPT_FP16_KERNELS = ["dc_est", "dc_remove", "energy_sum"]


_UNARY = ("Tanh", "Relu", "Sigmoid", "Neg", "Abs")
_BINARY = ("Add", "Mul", "Sub")


def random_graph(seed: int, width: int = 8, nodes: int = 12) -> onnx.ModelProto:
    """A random float graph for property tests of the fp16 conversion: fan-out (any earlier tensor
    may be read again), shared constants (initializers and `Constant` nodes read by several nodes,
    also from inside subgraphs), MatMul and ReduceMean beside elementwise ops, and, by seed, an `If`
    whose branches read outer-scope tensors and constants and a `Loop` accumulating over 3 steps."""
    rng = np.random.default_rng(seed)
    body: list[onnx.NodeProto] = []
    tensors = ["x"]
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (width, width)).astype(np.float32), "w_shared"),
        numpy_helper.from_array(rng.uniform(0.5, 2, (width,)).astype(np.float32), "c_shared"),
    ]
    body.append(helper.make_node("Constant", [], ["k_const"], name="k_node", value=numpy_helper.from_array(rng.uniform(-1, 1, (width,)).astype(np.float32))))
    constants = ["w_shared", "c_shared", "k_const"]
    for index in range(nodes):
        name, out = f"n{index}", f"t{index}"
        kind = rng.integers(0, 10)
        pick = lambda: tensors[int(rng.integers(0, len(tensors)))]  # noqa: E731
        if kind < 2:
            body.append(helper.make_node(str(rng.choice(_UNARY)), [pick()], [out], name=name))
        elif kind < 6:
            other = str(rng.choice(constants[1:])) if rng.random() < 0.4 else pick()
            body.append(helper.make_node(str(rng.choice(_BINARY)), [pick(), other], [out], name=name))
        elif kind < 8:
            body.append(helper.make_node("MatMul", [pick(), "w_shared"], [out], name=name))
        else:
            body.append(helper.make_node("ReduceMean", [pick()], [f"{out}_m"], name=f"{name}_mean", keepdims=1))
            body.append(helper.make_node("Sub", [tensors[-1], f"{out}_m"], [out], name=name))
        tensors.append(out)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])]
    outputs = [tensors[-1], tensors[len(tensors) // 2]]
    if seed % 3 == 1:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
        inner = lambda tag, op: helper.make_graph(  # noqa: E731
            [helper.make_node(op, [tensors[-1], "c_shared"], [f"{tag}_a"], name=f"{tag}_a"),
             helper.make_node("Mul", [f"{tag}_a", "k_const"], [f"{tag}_b"], name=f"{tag}_b")],
            tag, [], [helper.make_tensor_value_info(f"{tag}_b", TensorProto.FLOAT, [1, width])])
        body.append(helper.make_node("If", ["c"], ["branch"], name="if0", then_branch=inner("then", "Add"), else_branch=inner("else", "Sub")))
        outputs.append("branch")
    elif seed % 3 == 2:
        loop_body = helper.make_graph(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
             helper.make_node("Mul", ["acc_in", "c_shared"], ["acc_m"], name="loop_mul"),
             helper.make_node("Add", ["acc_m", tensors[1]], ["acc_out"], name="loop_add")],
            "loop_body",
            [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, width])],
            [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, width])])
        inits += [numpy_helper.from_array(np.array(3, np.int64), "trips"), numpy_helper.from_array(np.array(True), "go")]
        body.append(helper.make_node("Loop", ["trips", "go", tensors[-1]], ["looped"], name="loop0", body=loop_body))
        outputs.append("looped")
    graph = helper.make_graph(body, f"random_{seed}", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, width]) for o in dict.fromkeys(outputs)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.type.tensor_type.elem_type == TensorProto.BOOL:
            feeds[value.name] = np.array(bool(seed % 2))
        else:
            feeds[value.name] = rng.uniform(-1, 1, [d.dim_value for d in value.type.tensor_type.shape.dim]).astype(np.float32)
    return feeds


def loudness_model(samples: int = 4096, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An audio feature head with the hazards fp16 kernels get wrong and onnxruntime's CPU EP hides
    (it computes most fp16 ops in fp32): PCM samples squared beyond 65504 for an RMS normalisation,
    a loudness z-score E[L²] − E[L]² of ~70 dB values whose fp16 sum of squares overflows on WebGPU
    (NaN there), epsilons below fp16's range, beside a small MLP that fp16 handles."""
    rng = np.random.default_rng(seed)
    f = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    n = helper.make_node
    nodes = [
        n("MatMul", ["feat", "w"], ["h"], name="proj"), n("Tanh", ["h"], ["t"], name="act"),
        n("Mul", ["audio", "pcm"], ["samples"], name="to_pcm"), n("Mul", ["samples", "samples"], ["sq"], name="square"),
        n("ReduceMean", ["sq", "last"], ["ms"], name="mean_square", keepdims=1), n("Add", ["ms", "eps"], ["ms_eps"], name="add_eps"),
        n("Sqrt", ["ms_eps"], ["rms"], name="rms"), n("Div", ["samples", "rms"], ["rms_normalized"], name="normalize"),
        n("Mul", ["t", "ten"], ["l10"], name="loud_scale"), n("Add", ["l10", "seventy"], ["loud"], name="loudness"),
        n("ReduceMean", ["loud", "last"], ["lm"], name="loud_mean", keepdims=1), n("Sub", ["loud", "lm"], ["lc"], name="loud_centre"),
        n("Mul", ["loud", "loud"], ["l2"], name="loud_sq"), n("ReduceMean", ["l2", "last"], ["e2"], name="loud_e2", keepdims=1),
        n("Mul", ["lm", "lm"], ["lm2"], name="loud_m2"), n("Sub", ["e2", "lm2"], ["var"], name="loud_var"),
        n("Add", ["var", "eps"], ["var_eps"], name="var_eps"), n("Sqrt", ["var_eps"], ["std"], name="loud_std"),
        n("Div", ["lc", "std"], ["loudness_z"], name="zscore"), n("Mul", ["t", "half"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "loudness",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, samples]), helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 64, 64])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (("rms_normalized", [1, 1, samples]), ("loudness_z", [1, 64, 64]), ("y", [1, 64, 64]))],
        [numpy_helper.from_array(np.array([2], np.int64), "last"), f("eps", 1e-8), f("seventy", 70.0), f("ten", 10.0),
         f("w", rng.normal(0, 0.3, (64, 64))), f("half", 0.5), f("pcm", 32768.0)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    feeds = {"audio": rng.uniform(-0.3, 0.3, (1, 1, samples)).astype(np.float32), "feat": rng.uniform(-1, 1, (1, 64, 64)).astype(np.float32)}
    return model, feeds


def overflow_in_if_model(width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """overflow_model's audio head inside an If's then branch (a decoder behind a flag, as
    exporters write optional paths): `pcm` comes out of the If, and the node that must stay fp32
    (`dc_est`, OVERFLOW_KEPT) lives in the branch. `y`, the MLP output, stays in the main graph."""
    source = overflow_model(width, seed)
    inside = {"mm1", "tanh1", "pcm_scale", "dc_est", "dc_remove"}
    head = [n for n in source.graph.node if n.name in inside]
    head[-1].output[0] = "pcm_head"  # names are unique across graphs, as exporters write them
    then_branch = helper.make_graph(head, "head", [], [helper.make_tensor_value_info("pcm_head", TensorProto.FLOAT, [1, width])])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["pcm_off"], name="silence")], "no_head", [],
        [helper.make_tensor_value_info("pcm_off", TensorProto.FLOAT, [1, width])],
    )
    nodes = [
        helper.make_node("If", ["use_head"], ["pcm"], then_branch=then_branch, else_branch=else_branch, name="head_if"),
        helper.make_node("Tanh", ["x"], ["tx"], name="tanh_main"),
        helper.make_node("MatMul", ["tx", "w2"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes, "overflow_in_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width]), helper.make_tensor_value_info("use_head", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width]), helper.make_tensor_value_info("pcm", TensorProto.FLOAT, [1, width])],
        [t for t in source.graph.initializer if t.name != "axes"],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def length_by_comparison_model(width: int = 64, seed: int = 0) -> onnx.ModelProto:
    """overflow_model beside a length decided by a comparison: `frames` counts the
    `d = d_in · 1.0001` above 2.0001 (each d_in of 2 in fp32; in fp16 both constants round to
    1.0 and 2.0, so none) and `y_len` is that long. decision_paths keeps only rounded values (a
    comparison is no rounding), so fp16's `y_len` comes out with another shape until the search
    keeps `scale` (and, where fp16 kernels compare, `above`) in fp32; `pcm` needs `dc_est`
    (OVERFLOW_KEPT) as in overflow_model."""
    source = overflow_model(width, seed)
    nodes = list(source.graph.node) + [
        helper.make_node("Mul", ["d_in", "gain"], ["d"], name="scale"),
        helper.make_node("Greater", ["d", "threshold"], ["long"], name="above"),
        helper.make_node("Cast", ["long"], ["long_i"], to=TensorProto.INT64, name="as_count"),
        helper.make_node("ReduceSum", ["long_i"], ["frames"], keepdims=0, name="count"),
        helper.make_node("Unsqueeze", ["frames", "zero"], ["length"], name="as_shape"),
        helper.make_node("ConstantOfShape", ["length"], ["ones"], value=numpy_helper.from_array(np.array([0.5], np.float32)), name="fill"),
        helper.make_node("CumSum", ["ones", "zero_scalar"], ["y_len"], name="ramp"),
    ]
    graph = helper.make_graph(
        nodes, "length_by_comparison",
        [*source.graph.input, helper.make_tensor_value_info("d_in", TensorProto.FLOAT, [1, 8])],
        [*source.graph.output, helper.make_tensor_value_info("y_len", TensorProto.FLOAT, ["T"])],
        [
            *source.graph.initializer,
            numpy_helper.from_array(np.full(8, 1.0001, np.float32), "gain"), numpy_helper.from_array(np.array(2.0001, np.float32), "threshold"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


