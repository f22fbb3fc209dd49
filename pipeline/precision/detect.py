"""What precision a model already has: fp32, fp16 (converted before), or quantized."""

from __future__ import annotations

import onnx
from onnx import TensorProto

QUANTIZED_OPS = {
    "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "ConvInteger", "MatMulInteger",
    "QLinearConv", "QLinearMatMul", "MatMulNBits", "QLinearAdd", "QLinearMul",
    # onnxruntime's com.microsoft contrib ops its quantizers emit
    "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention", "QGemm", "GatherBlockQuantized",
    "QEmbedLayerNormalization", "QuantizeBFP", "DequantizeBFP",
}


def _is_quantized_op(op_type: str) -> bool:
    # the QLinear* family is open-ended (Concat, Sigmoid, Softmax, AveragePool, ...): named by prefix
    return op_type in QUANTIZED_OPS or op_type.startswith("QLinear")


def quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Each quantized op of the model, subgraphs included, as `domain::Op` outside the default domain, with its count."""
    counts: dict[str, int] = {}
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if _is_quantized_op(node.op_type):
                name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
                counts[name] = counts.get(name, 0) + 1
            graphs += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
    return dict(sorted(counts.items()))


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
    quantized = quantized_ops(model)
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
