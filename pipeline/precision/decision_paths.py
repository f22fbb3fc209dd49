"""Float values that decide shapes, lengths, counts or indices stay fp32, found from the graph.

A VITS voice's duration predictor rounds float durations (`Ceil`) into lengths: in fp16 a duration
of 2.0004 becomes 2.0 and the waveform comes out 256 samples shorter (17,408 against 17,664 in
fp32), a difference no bound on values can judge and a search over trials pays for dearly (930 s,
then "fp16 refused"). Such nodes are found before any trial: from each input of an op that takes a
shape, a length, a count or an index (`DECISION_INPUTS`), the walk goes up through the integer
arithmetic that computes it to where a float becomes an integer (a `Cast` to an integer type, or a
`Ceil`/`Floor`/`Round` whose result is cast) and keeps that node and every float node above it in
fp32 (their weights with them: a kept node's initializers stay fp32). `Resize`'s float `scales`
decide its output size the same way. Subgraphs too: If branches and Loop/Scan bodies read outer
values by name (unique across graphs once the conversion names every node), so one walk over every
graph's nodes follows a path across them.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from pipeline.graph.passes.util import all_graphs, constant_values, declared_types, infer_shapes, subgraphs

# op -> positions of the inputs that are shapes, lengths, counts or indices
DECISION_INPUTS = {
    "Range": (0, 1, 2), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Reshape": (1,),
    "Slice": (1, 2, 3, 4), "Resize": (2, 3), "Upsample": (1,), "TopK": (1,), "Gather": (1,), "GatherElements": (1,),
    "OneHot": (1,), "Pad": (1,), "CumSum": (1,),
}
_ROUNDING = {"Ceil", "Floor", "Round"}
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    types: dict[str, int] = {}
    for graph in all_graphs(infer_shapes(model).graph):
        types.update(declared_types(graph))
    for graph in all_graphs(model.graph):
        types.update(declared_types(graph))
    return types


def decision_paths(model: onnx.ModelProto) -> dict[str, str]:
    """{node name: why} for the nodes (any graph level) whose float values become a shape, a
    length, a count or an index. Unnamed nodes are skipped (the conversion names every node first)."""
    graphs = list(all_graphs(model.graph))
    nodes = [node for graph in graphs for node in graph.node]
    types = _elem_types(model)
    constants = {name: value for graph in graphs for name, value in constant_values(graph).items()}
    producer = {output: node for node in nodes for output in node.output}
    found: dict[str, str] = {}

    def body_outputs(node: onnx.NodeProto) -> list[str]:
        """A container's outputs come from its bodies' outputs: the walk goes on inside."""
        return [value.name for sub in subgraphs(node) for value in sub.output]

    def is_float(name: str) -> bool:
        return types.get(name) in _FLOATS

    def trace(start: str, why: str) -> None:
        """Up from a value that decides: a float one is kept with everything above it; an integer
        one is followed through the integer arithmetic that computes it to where a float became
        an integer (a `Cast` to an integer type, or a `Ceil`/`Floor`/`Round`), which is kept with
        its float ancestors. A float limit cast from an integer (`torch.arange(n, dtype=float)`:
        Range(Cast(to=FLOAT)(Cast(to=INT64)(durations)))) is followed on through that integer."""
        seen: set[str] = set()
        stack = [start]
        while stack:
            name = stack.pop()
            node = producer.get(name)
            if node is None or name in seen or name in constants or node.op_type == "Constant":
                continue
            seen.add(name)
            if node.op_type in ("Shape", "Size"):
                continue  # a tensor's shape is exact whatever its precision
            float_inputs = [i for i in node.input if i and i not in constants and is_float(i)]
            if is_float(name) or (float_inputs and (node.op_type == "Cast" or node.op_type in _ROUNDING)):
                if node.name:
                    found.setdefault(node.name, why)
                stack += [i for i in [*node.input, *body_outputs(node)] if i and i not in constants]
            else:
                # integers only: a float reaching here (a comparison's operand) was not rounded into this value
                stack += [i for i in [*node.input, *body_outputs(node)] if i and not is_float(i)]

    for sink in nodes:
        for position in DECISION_INPUTS.get(sink.op_type, ()):
            if position >= len(sink.input) or not sink.input[position] or sink.input[position] in constants:
                continue
            # Resize/Upsample scales, a float Range's bounds: floats that size the output
            trace(sink.input[position], f"decides a shape, length, count or index: input {position} of {sink.op_type} '{sink.name or sink.output[0]}'; kept without a trial")
    return found
