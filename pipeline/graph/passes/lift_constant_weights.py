"""Weights stored in `Constant` nodes become initializers.

paddle2onnx and tf2onnx often store a model's weights as `Constant` nodes, not initializers. What
counts, converts and searches weights reads initializers (the fp16 size accounting saw "weights 0 B"
in a 4.7 MB model, and the fp16 conversion kept one copy of each Constant per precision its readers
need, shipping an fp16 file larger than the fp32 one). Lifting them makes those models look like
every other exporter's. Only float tensors of WEIGHT_MIN_ELEMENTS values or more move: scalars and
short vectors (epsilons, scales, shape values) are what the constant-handling rules read as
Constant nodes. The main graph only; an output that is a graph output stays a node.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto

from pipeline.graph.passes.base import FP16, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import copy_model

WEIGHT_MIN_ELEMENTS = 16
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
# initializers outside graph.input need IR 4 (earlier IRs list every initializer as an input)
_MIN_IR = 4


def _elements(tensor: onnx.TensorProto) -> int:
    count = 1
    for dim in tensor.dims:
        count *= dim
    return count


def _weights(model: onnx.ModelProto) -> list[tuple[int, onnx.TensorProto]]:
    """(node index, tensor) of each Constant node holding a float weight."""
    if model.ir_version < _MIN_IR:
        return []
    outputs = {o.name for o in model.graph.output}
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1 or node.output[0] in outputs:
            continue
        attribute = node.attribute[0]
        if attribute.name == "value" and attribute.t.data_type in _FLOATS and _elements(attribute.t) >= WEIGHT_MIN_ELEMENTS:
            found.append((index, attribute.t))
    return found


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    weights = _weights(model)
    if not weights:
        return []
    total = sum(_elements(t) for _, t in weights)
    first = model.graph.node[weights[0][0]]
    return [hazard(first.name or first.output[0], "Constant", "constant-weights", [FP16], "lift_constant_weights",
                   f"{len(weights)} Constant nodes hold {total:,} weight values: sizes, the fp16 conversion and its search read initializers")]


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    weights = _weights(model)
    if not weights:
        return PassResult(model, False)
    lifted = copy_model(model)
    graph = lifted.graph
    moved = {index for index, _ in weights}
    records = []
    for index, tensor in weights:
        node = model.graph.node[index]
        initializer = onnx.TensorProto()
        initializer.CopyFrom(tensor)
        initializer.name = node.output[0]  # readers keep reading the same name
        graph.initializer.append(initializer)
        records.append({"node": node.name or node.output[0], "value": node.output[0], "what": f"{node.output[0]}: Constant weight of {_elements(tensor):,} values lifted to an initializer"})
    kept = [node for index, node in enumerate(graph.node) if index not in moved]
    del graph.node[:]
    graph.node.extend(kept)
    return PassResult(lifted, True, records)


# Structure before shapes: after the folds (which may read these Constants), before stale_shapes.
lift_constant_weights = Repair(name="lift_constant_weights", order=25, stage="source", find=find, rewrite=rewrite)
