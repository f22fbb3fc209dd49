"""An fp32 reference for a quantized model: the model dequantized.

A quantized source has no fp32 original in the package; judged against itself, a check can only
say it runs. Its quantized ops have float twins that compute what the integer op approximates, on
the same (dequantized) weights, so the difference between the quantized model and this reference is
the activations' quantization error, which the quantized variant's bounds judge:
- dynamic quantization (`quantize_dynamic`): `MatMulInteger` / `ConvInteger` → `MatMul` / `Conv`.
  An integer input made by `DynamicQuantizeLinear(x)` is `(q - zp) ≈ x / scale`, so it becomes
  `x / scale`; a constant one becomes `q - zp` as floats. The output, float where it was int32, then
  goes through the same `Cast` and scale multiply the quantizer wrote, so the result is
  `x @ dequantized(W)`. `com.microsoft::DynamicQuantizeLSTM` → `LSTM` with `(W - zp) * scale` (and
  R), transposed back to the LSTM layout. `DynamicQuantizeLinear` nodes left without readers go.
- static quantization (`quantize_static`), QDQ format: `QuantizeLinear(x)` → `DequantizeLinear`
  is `x` itself; a `DequantizeLinear` of a constant (per tensor, per axis, blocked; 8 or 4 bits, in
  the default or the `com.microsoft` domain) is its float value.
- QOperator format: each `QLinear*` op (quantized_weights.py reads their constants) becomes its
  float op on the float twins of its inputs (`QLinearConv`'s int32 bias scaled by
  `x_scale * w_scale`); ops the quantizer runs on 8-bit values as they are (Reshape, Flatten,
  Transpose, MaxPool, ...) read the float twin instead.
- `com.microsoft::MatMulNBits` (blockwise 4/8-bit weights) → `MatMul` (+ bias) on its weight.
Any other quantized op, or an op reading a quantized tensor it cannot read in float, leaves no
reference: the reason names it, and the caller says why.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.graph.passes.util import NameMaker, constant_values, copy_model
from pipeline.precision.detect import quantized_ops
from pipeline.precision.quantized_weights import dequantize, matmul_nbits_weight

_INTEGER_TWINS = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}


def _float_input(name: str, zero_point: str | None, made_by: dict[str, onnx.NodeProto], constants: dict[str, np.ndarray], fresh: NameMaker, added: list, initializers: list) -> str | None:
    """The float twin of an integer input of MatMulInteger/ConvInteger, or None when it has none."""
    producer = made_by.get(name)
    if producer is not None and producer.op_type == "DynamicQuantizeLinear" and producer.output[0] == name:
        if zero_point != producer.output[2]:  # (q - zp) is x / scale only with the quantizer's own zero point
            return None
        scaled = fresh(f"{name}__dequantized")
        added.append(helper.make_node("Div", [producer.input[0], producer.output[1]], [scaled], name=fresh(f"{name}__dequantize")))
        return scaled
    if name not in constants or (zero_point and zero_point not in constants):
        return None
    values = constants[name].astype(np.float32)
    zero = constants[zero_point].astype(np.float32) if zero_point else np.float32(0)
    if np.ndim(zero) == 1 and values.ndim == 4:  # a Conv weight's per-channel zero point runs along axis 0
        zero = zero.reshape(-1, 1, 1, 1)
    float_name = fresh(f"{name}__float")
    initializers.append(numpy_helper.from_array((values - zero).astype(np.float32), float_name))
    return float_name


def _lstm(node: onnx.NodeProto, constants: dict[str, np.ndarray], fresh: NameMaker, initializers: list) -> onnx.NodeProto | None:
    """LSTM from DynamicQuantizeLSTM: inputs X W R B seq h c P W_scale W_zp R_scale R_zp."""
    names = list(node.input) + [""] * (12 - len(node.input))
    floats = []
    for weight, scale, zero in ((names[1], names[8], names[9]), (names[2], names[10], names[11])):
        if not all(n in constants for n in (weight, scale, zero)):
            return None
        q, s, z = constants[weight].astype(np.float32), constants[scale].astype(np.float32), constants[zero].astype(np.float32)
        # scale and zero point: per direction [D] or per output column [D, 4H]
        s = s.reshape(s.shape[0], 1, -1) if s.ndim == 2 else s.reshape(-1, 1, 1)
        z = z.reshape(z.shape[0], 1, -1) if z.ndim == 2 else z.reshape(-1, 1, 1)
        values = ((q - z) * s).transpose(0, 2, 1)  # [D, in, 4H] -> LSTM's [D, 4H, in]
        float_name = fresh(f"{weight}__float")
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(values, dtype=np.float32), float_name))
        floats.append(float_name)
    inputs = [names[0], floats[0], floats[1], *names[3:8]]
    while inputs and not inputs[-1]:
        inputs.pop()
    lstm = helper.make_node("LSTM", inputs, list(node.output), name=fresh(f"{node.name or 'lstm'}__float"))
    lstm.attribute.extend(node.attribute)
    return lstm



# QOperator ops: the float op, where the (value, scale, zero point) triples of its inputs start,
# the positions of its output's scale and zero point (dropped), and the axis a 1-D weight scale
# runs along (None: per tensor only).
_QLINEAR = {
    "QLinearConv": ("Conv", (0, 3), 0),
    "QLinearMatMul": ("MatMul", (0, 3), -1),
    "QLinearAdd": ("Add", (0, 3), None),
    "QLinearMul": ("Mul", (0, 3), None),
    "QLinearSigmoid": ("Sigmoid", (0,), None),
    "QLinearLeakyRelu": ("LeakyRelu", (0,), None),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,), None),
    "QLinearAveragePool": ("AveragePool", (0,), None),
}
# Ops onnxruntime's QOperator quantizer runs on 8-bit values as they are (same scale in and out):
# on the float twin they compute the same thing. Their data is input 0.
_PASS_THROUGH = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool", "Split", "Slice", "Gather", "Identity", "DepthToSpace", "SpaceToDepth", "Expand", "Tile"}
_STANDARD = ("", "ai.onnx")


def _qualified(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in _STANDARD else f"{node.domain}::{node.op_type}"


def _label(node: onnx.NodeProto) -> str:
    return f"{_qualified(node)} '{node.name or node.output[0]}'"


class _Twin:
    """One walk over the main graph in order: each quantized tensor's float twin (`floats`), each
    DequantizeLinear output as the float it stands for (`alias`), the float nodes and weights."""

    def __init__(self, graph: onnx.GraphProto):
        self.constants = constant_values(graph)
        self.made_by = {output: node for node in graph.node for output in node.output}
        self.fresh = NameMaker(graph)
        self.floats: dict[str, str] = {}
        self.alias: dict[str, str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def constant(self, name: str) -> np.ndarray | None:
        return self.constants.get(name) if name else None

    def weight(self, base: str, values: np.ndarray) -> str:
        name = self.fresh(f"{base}__float")
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(values, dtype=np.float32), name))
        return name

    def float_of(self, node: onnx.NodeProto, value: str, scale: str, zero: str, axis: int | None) -> str:
        """The float twin of a quantized input (value, scale, zero point) of `node`."""
        if value in self.floats:
            return self.floats[value]
        q, s, z = self.constant(value), self.constant(scale), self.constant(zero)
        if q is None or s is None or (zero and z is None):
            raise _NoTwin(f"{_label(node)} reads '{value}', which no QuantizeLinear, quantized op or constant made")
        if s.size > 1 and axis is None:
            raise _NoTwin(f"{_label(node)} reads '{value}' with a per-axis scale where pack expects one per tensor")
        return self.weight(value, dequantize(q, s, z, axis if axis is not None else 1))

    def visit(self, node: onnx.NodeProto) -> None:
        node.input[:] = [self.alias.get(name, name) for name in node.input]
        standard, microsoft = node.domain in _STANDARD, node.domain == "com.microsoft"
        op = node.op_type
        if op == "QuantizeLinear" and (standard or microsoft):
            self.floats[node.output[0]] = node.input[0]
        elif op == "DequantizeLinear" and (standard or microsoft):
            self._dequantize_linear(node)
        elif op in _QLINEAR and (standard or microsoft):
            self._qlinear(node)
        elif op == "QLinearConcat" and microsoft:
            inputs = [self.float_of(node, *node.input[i : i + 3], None) for i in range(2, len(node.input), 3)]
            self._emit(node, "Concat", inputs, {"axis": helper.get_node_attr_value(node, "axis")})
        elif op == "MatMulNBits" and microsoft:
            self._matmul_nbits(node)
        elif op in _INTEGER_TWINS and standard:
            self._integer(node)
        elif op == "DynamicQuantizeLSTM" and microsoft:
            lstm = _lstm(node, self.constants, self.fresh, self.initializers)
            if lstm is None:
                raise _NoTwin(f"DynamicQuantizeLSTM '{node.name or node.output[0]}' has weights, scales or zero points that are not constants")
            self.nodes.append(lstm)
        elif any(name in self.floats for name in node.input):
            self._pass_through(node)
        else:
            self.nodes.append(node)

    def _dequantize_linear(self, node: onnx.NodeProto) -> None:
        value = node.input[0]
        if value in self.floats:
            self.alias[node.output[0]] = self.floats[value]
            return
        q, s = self.constant(value), self.constant(node.input[1])
        zero = node.input[2] if len(node.input) > 2 else ""
        z = self.constant(zero)
        if q is None or s is None or (zero and z is None):
            raise _NoTwin(f"{_label(node)} reads '{value}', which no QuantizeLinear or constant made")
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.alias[node.output[0]] = self.weight(value, dequantize(q, s, z, attributes.get("axis", 1), attributes.get("block_size", 0)))

    def _qlinear(self, node: onnx.NodeProto) -> None:
        float_op, starts, axis = _QLINEAR[node.op_type]
        inputs = [self.float_of(node, *node.input[i : i + 3], axis if i else None) for i in starts]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.pop("channels_last", 0):
            raise _NoTwin(f"{_label(node)} is channels-last")
        if node.op_type == "QLinearConv" and len(node.input) > 8 and node.input[8]:
            bias, x_scale, w_scale = (self.constant(node.input[i]) for i in (8, 1, 4))
            if bias is None or x_scale is None or w_scale is None:
                raise _NoTwin(f"{_label(node)} has a bias or scales that are not constants")
            inputs.append(self.weight(node.input[8], bias.astype(np.float32) * x_scale.astype(np.float32) * w_scale.astype(np.float32).reshape(-1)))
        self._emit(node, float_op, inputs, attributes)

    def _matmul_nbits(self, node: onnx.NodeProto) -> None:
        names = list(node.input) + [""] * (6 - len(node.input))
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        blob, scales = self.constant(names[1]), self.constant(names[2])
        zero = self.constant(names[3])
        if blob is None or scales is None or (names[3] and zero is None):
            raise _NoTwin(f"{_label(node)} has weights, scales or zero points that are not constants")
        if names[4]:
            raise _NoTwin(f"{_label(node)} reorders its blocks (g_idx)")
        weight = matmul_nbits_weight(blob, scales, zero, attributes["K"], attributes["N"], attributes.get("bits", 4), attributes["block_size"])
        if isinstance(weight, str):
            raise _NoTwin(f"{_label(node)} has {weight}")
        inputs = [names[0], self.weight(names[1], weight)]
        if not names[5]:
            self.nodes.append(helper.make_node("MatMul", inputs, list(node.output), name=node.name))
            return
        product = self.fresh(f"{node.output[0]}__product")
        self.nodes += [helper.make_node("MatMul", inputs, [product], name=node.name), helper.make_node("Add", [product, names[5]], list(node.output), name=self.fresh(f"{node.name}__bias"))]

    def _integer(self, node: onnx.NodeProto) -> None:
        added: list[onnx.NodeProto] = []
        zero_points = [node.input[i] if len(node.input) > i and node.input[i] else None for i in (2, 3)]
        a = _float_input(node.input[0], zero_points[0], self.made_by, self.constants, self.fresh, added, self.initializers)
        b = _float_input(node.input[1], zero_points[1], self.made_by, self.constants, self.fresh, added, self.initializers)
        if a is None or b is None:
            raise _NoTwin(f"{node.op_type} '{node.name or node.output[0]}' reads an integer input no DynamicQuantizeLinear or constant made")
        float_node = helper.make_node(_INTEGER_TWINS[node.op_type], [a, b], list(node.output), name=node.name)
        float_node.attribute.extend(node.attribute)
        self.nodes += [*added, float_node]

    def _pass_through(self, node: onnx.NodeProto) -> None:
        quantized = [name for name in node.input if name in self.floats]
        if node.op_type not in _PASS_THROUGH or node.domain not in _STANDARD or quantized != [node.input[0]]:
            raise _NoTwin(f"no float twin for {_label(node)}: it reads the quantized tensor '{quantized[0]}'")
        twin = onnx.NodeProto()
        twin.CopyFrom(node)
        twin.input[0] = self.floats[node.input[0]]
        # MaxPool's second output (indices) is an index either way
        carried = node.output[:1] if node.op_type == "MaxPool" else node.output
        for i, name in enumerate(carried):
            if name:
                twin.output[i] = self.floats[name] = self.fresh(f"{name}__float")
        self.nodes.append(twin)

    def _emit(self, node: onnx.NodeProto, op: str, inputs: list[str], attributes: dict) -> None:
        output = self.fresh(f"{node.output[0]}__float")
        self.floats[node.output[0]] = output
        self.nodes.append(helper.make_node(op, inputs, [output], name=node.name, **attributes))


class _NoTwin(Exception):
    pass


def dequantized(model: onnx.ModelProto) -> onnx.ModelProto | str:
    """The float twin of a quantized model, or why there is none (naming the op)."""
    handled = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
               "com.microsoft::QuantizeLinear", "com.microsoft::DequantizeLinear", "com.microsoft::QLinearConcat", "com.microsoft::MatMulNBits",
               "com.microsoft::DynamicQuantizeLSTM", *(f"com.microsoft::{op}" for op in _QLINEAR if op not in ("QLinearConv", "QLinearMatMul"))}
    found = quantized_ops(model)
    others = sorted(set(found) - handled)
    if others:
        return f"no float twin for {', '.join(others)}"
    main = {_qualified(node) for node in model.graph.node}
    if set(found) - main or any(found[op] != sum(_qualified(n) == op for n in model.graph.node) for op in found):
        return "quantized ops inside subgraphs (If, Loop, Scan bodies) have no float twin"
    twin = copy_model(model)
    graph = twin.graph
    walk = _Twin(graph)
    try:
        for node in graph.node:
            walk.visit(node)
    except _NoTwin as why:
        return str(why)
    nodes = walk.nodes
    for output in graph.output:
        if output.name in walk.floats:
            return f"output '{output.name}' is a quantized tensor: its float twin has another type"
        if output.name in walk.alias:
            nodes.append(helper.make_node("Identity", [walk.alias[output.name]], [output.name], name=walk.fresh(f"{output.name}__twin")))
    # the integer ops' outputs are float now: a Cast to float of them changes nothing
    read = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    kept = [n for n in nodes if not (n.op_type == "DynamicQuantizeLinear" and not any(o in read for o in n.output))]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(walk.initializers)
    del graph.value_info[:]  # int32 types of the integer ops' outputs are float now
    if not any(n.domain == "com.microsoft" for n in graph.node):
        del twin.opset_import[:]
        twin.opset_import.extend([entry for entry in model.opset_import if entry.domain != "com.microsoft"])
    used = {name for node in graph.node for name in node.input}
    live = [t for t in graph.initializer if t.name in used or t.name in {o.name for o in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(live)
    return twin
