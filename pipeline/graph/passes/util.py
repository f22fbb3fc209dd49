"""Small graph helpers the passes and hazard detection share: constants, inferred shapes, fresh names."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
from onnx import numpy_helper

# A dimension as read from a model: an int, a symbolic name, or None when unknown.
Dim = int | str | None


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


def main_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return entry.version
    return 1


def constant_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values known without running the graph: initializers and `Constant` node outputs."""
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            attribute = node.attribute[0]
            if attribute.name == "value":
                values[node.output[0]] = numpy_helper.to_array(attribute.t)
            elif attribute.name in ("value_int", "value_ints"):
                values[node.output[0]] = np.array(onnx.helper.get_attribute_value(attribute), dtype=np.int64)
            elif attribute.name in ("value_float", "value_floats"):
                values[node.output[0]] = np.array(onnx.helper.get_attribute_value(attribute), dtype=np.float32)
    return values


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference with data propagation; never raises (a partial answer beats none)."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort on third-party models
        try:
            return onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001
            return copy_model(model)


def dims_of(value: onnx.ValueInfoProto) -> list[Dim] | None:
    """The shape recorded in a ValueInfoProto, or None when it records no shape (unknown rank).

    Dims are read as onnxruntime reads them, the one reading every part of pack uses: a size > 0 is
    fixed; a symbolic name, an empty dim and a `dim_value` of 0 or below (paddle2onnx writes -1) are
    dynamic, given as their name or None."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return None
    dims: list[Dim] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(dim.dim_value)
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def elem_type_of(value: onnx.ValueInfoProto) -> int:
    return value.type.tensor_type.elem_type if value.type.HasField("tensor_type") else 0


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Every typed value of the main graph: inputs, outputs, value_info, and initializers as typed values."""
    graph = model.graph
    found: dict[str, onnx.ValueInfoProto] = {}
    for init in graph.initializer:
        found[init.name] = onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
    for value in [*graph.input, *graph.value_info, *graph.output]:
        found[value.name] = value
    return found


def inferred_dims(model: onnx.ModelProto) -> dict[str, list[Dim] | None]:
    """Shapes onnx infers for the main graph's values (value_info cleared first so stale entries cannot win)."""
    cleared = copy_model(model)
    del cleared.graph.value_info[:]
    inferred = infer_shapes(cleared)
    return {name: dims_of(value) for name, value in value_infos(inferred).items()}


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph nested in its nodes, outermost first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name used anywhere in the graph, subgraphs included."""
    names: set[str] = set()
    for g in all_graphs(graph):
        names.update(v.name for v in [*g.input, *g.output, *g.value_info])
        names.update(i.name for i in g.initializer)
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


class NameMaker:
    """Fresh names that collide with nothing in the model."""

    def __init__(self, graph: onnx.GraphProto):
        self._taken = all_names(graph)

    def __call__(self, base: str) -> str:
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name


def node_label(node: onnx.NodeProto, index: int) -> str:
    """A node's name, or a stable stand-in for unnamed nodes."""
    return node.name or f"{node.op_type}#{index}"


def declared_types(graph: onnx.GraphProto, outer: dict[str, int] | None = None) -> dict[str, int]:
    """Element types of every value visible in `graph` (on top of `outer`, the enclosing scopes'),
    from declarations, initializers, Constant values and Cast targets: works on models that shape
    inference refuses. A declaration without an element type (0) says nothing and is skipped."""
    types = dict(outer or {})
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.tensor_type.elem_type:
            types[info.name] = info.type.tensor_type.elem_type
    for tensor in graph.initializer:
        types[tensor.name] = tensor.data_type
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to":
                types[node.output[0]] = attribute.i
            elif node.op_type == "Constant" and attribute.name == "value":
                types[node.output[0]] = attribute.t.data_type
    return types
