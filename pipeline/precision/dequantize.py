"""An fp32 reference for a quantized model: the model dequantized.

A quantized source has no fp32 original in the package; judged against itself, a check can only
say it runs. Its dynamically quantized ops (onnxruntime's `quantize_dynamic`) have float twins that
compute what the integer op approximates, on the same (dequantized) weights:
- `MatMulInteger` / `ConvInteger` → `MatMul` / `Conv`. An integer input made by
  `DynamicQuantizeLinear(x)` is `(q - zp) ≈ x / scale`, so it becomes `x / scale`; a constant one
  becomes `q - zp` as floats. The output, float where it was int32, then goes through the same
  `Cast` and scale multiply the quantizer wrote, so the result is `x @ dequantized(W)`.
- `com.microsoft::DynamicQuantizeLSTM` → `LSTM` with `(W - zp) * scale` (and R), transposed back
  to the LSTM layout.
`DynamicQuantizeLinear` nodes left without readers go. The difference between the quantized model
and this reference is then the activation quantization's error, which is what the quantized
variant's bounds judge. Any other quantized op leaves no reference: the caller says why.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.graph.passes.util import NameMaker, constant_values, copy_model
from pipeline.precision.detect import quantized_ops

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


def dequantized(model: onnx.ModelProto) -> onnx.ModelProto | str:
    """The float twin of a dynamically quantized model, or why there is none."""
    handled = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "com.microsoft::DynamicQuantizeLSTM"}
    others = sorted(set(quantized_ops(model)) - handled)
    if others:
        return f"no float twin for {', '.join(others)}"
    twin = copy_model(model)
    graph = twin.graph
    constants = constant_values(graph)
    made_by = {output: node for node in graph.node for output in node.output}
    fresh = NameMaker(graph)
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    for node in graph.node:
        if node.op_type in _INTEGER_TWINS and node.domain in ("", "ai.onnx"):
            added: list[onnx.NodeProto] = []
            zero_points = [node.input[i] if len(node.input) > i and node.input[i] else None for i in (2, 3)]
            a = _float_input(node.input[0], zero_points[0], made_by, constants, fresh, added, initializers)
            b = _float_input(node.input[1], zero_points[1], made_by, constants, fresh, added, initializers)
            if a is None or b is None:
                return f"{node.op_type} '{node.name or node.output[0]}' reads an integer input no DynamicQuantizeLinear or constant made"
            float_node = helper.make_node(_INTEGER_TWINS[node.op_type], [a, b], list(node.output), name=node.name)
            float_node.attribute.extend(node.attribute)
            nodes += [*added, float_node]
        elif node.op_type == "DynamicQuantizeLSTM" and node.domain == "com.microsoft":
            lstm = _lstm(node, constants, fresh, initializers)
            if lstm is None:
                return f"DynamicQuantizeLSTM '{node.name or node.output[0]}' has weights, scales or zero points that are not constants"
            nodes.append(lstm)
        else:
            nodes.append(node)
    # the integer ops' outputs are float now: a Cast to float of them changes nothing
    read = {name for node in nodes for name in node.input} | {o.name for o in graph.output}
    kept = [n for n in nodes if not (n.op_type == "DynamicQuantizeLinear" and not any(o in read for o in n.output))]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(initializers)
    del graph.value_info[:]  # int32 types of the integer ops' outputs are float now
    if not any(n.domain == "com.microsoft" for n in graph.node):
        del twin.opset_import[:]
        twin.opset_import.extend([entry for entry in model.opset_import if entry.domain != "com.microsoft"])
    used = {name for node in graph.node for name in node.input}
    live = [t for t in graph.initializer if t.name in used or t.name in {o.name for o in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(live)
    return twin

