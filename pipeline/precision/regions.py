"""Constants fp16 cannot hold: their readers are kept in fp32.

fp16's limits (its largest finite value, its normal range) and, before conversion,
`unholdable_constants` finds the fp32 constants fp16 cannot hold (beyond
±65504, or a value that matters within its tensor but falls below fp16's normal range, e.g. an
epsilon of 1e-8): their readers are kept in fp32, with the reason, instead of the converter clamping
the value with a warning.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.graph.passes.util import all_graphs

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # 6.1e-5: below it fp16 values are subnormal and lose precision
FP16_MIN_SUBNORMAL = 2.0**-24  # 6.0e-8: the converter's min_positive_val (smaller becomes 0)
# An element matters within its tensor when it is at least this share of the tensor's largest value
# (a weight tensor's tiny entries do not; a scalar epsilon does); fp16 must hold such an element
# within this relative error, or within half an fp16 step of the tensor's largest value (the error
# fp16 makes on that value itself: a 3072-wide Linear's weights peak near 0.02, and their entries
# near 2e-5 are subnormal in fp16, off by 1.5e-3 of themselves but 1.7e-6 of the peak).
_SIGNIFICANT_SHARE = 1e-3
_HOLD_RELATIVE = 2.0**-10
_HOLD_OF_PEAK = 2.0**-11


def why_unholdable(name: str, array: np.ndarray) -> str | None:
    values = np.abs(array.astype(np.float64)).ravel()
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    peak = float(values.max())
    if peak > FP16_MAX:
        return f"reads constant '{name}' with values up to {peak:.6g}, beyond fp16's ±65504"
    significant = values[(values > 0) & (values >= _SIGNIFICANT_SHARE * peak)]
    if significant.size:
        rounded = significant.astype(np.float16).astype(np.float64)
        error = np.abs(rounded - significant) / significant
        error[np.abs(rounded - significant) <= _HOLD_OF_PEAK * peak] = 0.0
        if float(error.max()) > _HOLD_RELATIVE:
            worst = float(significant[int(np.argmax(error))])
            return f"reads constant '{name}' with value {worst:.3g}, below fp16's normal range (6.1e-05): fp16 holds it only to {float(error.max()):.2g}"
    return None


def float_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT:
                    found[node.output[0]] = numpy_helper.to_array(attribute.t)
                elif attribute.name in ("value_float", "value_floats"):
                    found[node.output[0]] = np.array(helper.get_attribute_value(attribute), dtype=np.float32)
    return found


def unholdable_constants(model: onnx.ModelProto) -> dict[str, str]:
    """{reader node: why} for every node (any graph level) that reads an fp32 constant fp16 cannot
    hold; those readers stay fp32 so the constant is never changed."""
    whys: dict[str, str] = {}
    for graph in all_graphs(model.graph):
        for name, array in float_constants(graph).items():
            why = why_unholdable(name, array)
            if why:
                whys[name] = why
    found: dict[str, str] = {}
    if not whys:
        return found
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Constant":
                continue
            for name in node.input:  # inner readers are visited themselves: keeping an If would keep its whole body
                if name in whys and node.name and node.name not in found:
                    found[node.name] = whys[name]
    # The Constant nodes themselves too: the converter then leaves their values alone (no clamp).
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Constant" and node.output[0] in whys and node.name:
                found.setdefault(node.name, whys[node.output[0]].replace("reads constant", "holds constant", 1))
    return found
