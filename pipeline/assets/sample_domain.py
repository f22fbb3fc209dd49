"""What the graph says about an input's values, for a sample made up where the recipe gives none.

Uniform noise in [-1, 1] is outside what most models read (an image model reads 0..1 or 0..255, a
text model token ids below its vocabulary size), and a check on such a sample judges fp16 on values
no user sends. The graph often says more: a 4-D float input of 1 or 3 channels is an image (0..255
when the graph divides it by 255 or subtracts a mean over 1, else 0..1); an integer input that indexes
an embedding table is a token id below the table's row count. Where nothing is known it says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from pipeline.graph.passes.util import constant_values


@dataclass(frozen=True)
class Domain:
    low: float
    high: float
    pattern: str | None  # a pipeline/assets/patterns.py pattern, or None for uniform values
    why: str  # what in the graph says so, for the build's record


def _readers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [node for node in graph.node if name in node.input]


def _image_scale(graph: onnx.GraphProto, name: str, constants: dict[str, np.ndarray]) -> tuple[float, str]:
    """255 when a reader divides by a constant >= 100, multiplies by one <= 0.01, or subtracts a mean over 1."""
    for node in _readers(graph, name):
        other = next((constants[i] for i in node.input if i != name and i in constants), None)
        if other is None or other.size == 0 or other.dtype.kind != "f":
            continue
        largest, smallest = float(np.abs(other).max()), float(np.abs(other).min())
        if (node.op_type == "Div" and smallest >= 100) or (node.op_type == "Mul" and 0 < largest <= 0.01) or (node.op_type == "Sub" and largest > 1.5):
            return 255.0, f"{node.op_type} '{node.name or node.output[0]}' scales it from 0..255"
    return 1.0, "assumed 0..1: no reader scales it from 0..255"


def guess_domain(model: onnx.ModelProto, name: str, shape: list[int], dtype: str) -> Domain:
    graph = model.graph
    constants = constant_values(graph)
    kind = np.dtype(dtype).kind
    if kind in "iu":
        for node in _readers(graph, name):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name and node.input[0] in constants and constants[node.input[0]].ndim >= 1:
                rows = constants[node.input[0]].shape[0]
                return Domain(0, rows - 1, None, f"token ids below the {rows} rows Gather '{node.name or node.output[0]}' indexes")
        return Domain(0, 1, None, "integers 0..1: nothing in the recipe or the graph says its domain")
    if kind == "f" and len(shape) == 4 and shape[1] in (1, 3) and min(shape[2:]) >= 4:
        high, why = _image_scale(graph, name, constants)
        return Domain(0.0, high, "image", f"an image (a 4-D float input of {shape[1]} channel{'s' if shape[1] > 1 else ''}; {why})")
    return Domain(-1.0, 1.0, None, "uniform noise in [-1, 1]: nothing in the recipe or the graph says its domain")
