"""What precision a model already has: fp32, fp16 (converted before), or quantized."""

from __future__ import annotations

import onnx
from onnx import TensorProto

QUANTIZED_OPS = {
    "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger",
    "QLinearConv", "QLinearMatMul", "MatMulNBits", "QLinearAdd", "QLinearMul",
}
_FLOAT_TYPES = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16", TensorProto.DOUBLE: "fp64"}


def weight_bytes_by_type(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of initializer data per element type name (e.g. {'fp32': 1000, 'uint8': 40})."""
    totals: dict[str, int] = {}
    for tensor in model.graph.initializer:
        name = _FLOAT_TYPES.get(tensor.data_type) or TensorProto.DataType.Name(tensor.data_type).lower()
        size = len(tensor.raw_data) or onnx.numpy_helper.to_array(tensor).nbytes
        totals[name] = totals.get(name, 0) + size
    return totals


def detect_precision(model: onnx.ModelProto) -> tuple[str, str]:
    """(precision, why): 'quantized', 'fp16' or 'fp32'."""
    ops = {node.op_type for node in model.graph.node}
    quantized = sorted(ops & QUANTIZED_OPS)
    if quantized:
        return "quantized", f"quantized ops: {', '.join(quantized)}"
    weights = weight_bytes_by_type(model)
    fp16, fp32 = weights.get("fp16", 0), weights.get("fp32", 0)
    if fp16 and fp16 >= fp32:
        return "fp16", f"{fp16} bytes of fp16 weights vs {fp32} of fp32"
    casts_to_fp16 = any(
        node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in node.attribute) for node in model.graph.node
    )
    if casts_to_fp16 and any(node.name.startswith("graph_input_cast") for node in model.graph.node):
        return "fp16", "converter-inserted graph_input_cast nodes that cast to fp16"
    return "fp32", "fp32 weights"
