"""fp16 readiness, before conversion: a graph output that other nodes also read.

With keep_io_types the converter gives those readers the fp32 copy of the output, and they then mix
fp32 with fp16 (onnxruntime refuses the model). The repair gives the internal tensor its own name,
points the readers at it, and produces the graph output with `Identity(internal)`.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from pipeline.graph.passes.base import FP16, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import NameMaker, copy_model


def _consumed_outputs(graph: onnx.GraphProto) -> list[str]:
    outputs = {o.name for o in graph.output}
    return sorted({name for node in graph.node for name in node.input if name in outputs})


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    return [
        hazard(name, "output", "output-also-consumed", [FP16], "detach_consumed_outputs",
               "a graph output other nodes also read: with keep_io_types they get the fp32 copy and mix types")
        for name in _consumed_outputs(model.graph)
    ]


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    consumed = _consumed_outputs(model.graph)
    # Already detached: produced by one of our Identity nodes and read by nobody else.
    if not consumed:
        return PassResult(model, False)
    model = copy_model(model)
    graph = model.graph
    fresh = NameMaker(graph)
    records = []
    new_nodes = []
    for output_name in consumed:
        internal = fresh(f"{output_name}__internal")
        for node in graph.node:
            for i, name in enumerate(node.input):
                if name == output_name:
                    node.input[i] = internal
            for i, name in enumerate(node.output):
                if name == output_name:
                    node.output[i] = internal
        new_nodes.append(helper.make_node("Identity", [internal], [output_name], name=fresh(f"{output_name}__detach")))
        records.append({"output": output_name, "what": f"readers now use '{internal}'; Identity produces the graph output"})
    graph.node.extend(new_nodes)
    return PassResult(model, True, records)


detach_consumed_outputs = Repair(name="detach_consumed_outputs", order=50, stage="fp16-before", find=find, rewrite=rewrite)
