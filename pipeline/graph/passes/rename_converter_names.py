"""fp16 readiness, before conversion: names an earlier conversion left behind.

Tensors and nodes already named like the converter's own casts (`<node>_output_cast_0`,
`graph_input_cast_0`, ...) collide with the casts a new conversion adds and break single
assignment. The repair gives them fresh names (graph inputs and outputs keep theirs: they are the
model's interface).
"""

from __future__ import annotations

import re
from typing import Any

import onnx

from pipeline.graph.passes.base import FP16, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model

PATTERN = re.compile(r"(_input_cast_\d+|_output_cast_\d+|^graph_input_cast\d*|^graph_output_cast\d*)$")


def _clashing(model: onnx.ModelProto) -> list[str]:
    interface = {v.name for v in [*model.graph.input, *model.graph.output]}
    return sorted({
        name
        for graph in all_graphs(model.graph)
        for node in graph.node
        for name in [*node.output, node.name]
        if name and name not in interface and PATTERN.search(name)
    })


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    return [
        hazard(name, "name", "converter-name-clash", [FP16], "rename_converter_names",
               "named like the fp16 converter's own casts: a conversion would assign it twice")
        for name in _clashing(model)
    ]


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    clashing = _clashing(model)
    if not clashing:
        return PassResult(model, False)
    model = copy_model(model)
    fresh = NameMaker(model.graph)
    renames = {name: fresh(PATTERN.sub("", name) + "__prev_cast") for name in clashing}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            node.input[:] = [renames.get(n, n) for n in node.input]
            node.output[:] = [renames.get(n, n) for n in node.output]
            node.name = renames.get(node.name, node.name)
        for info in graph.value_info:
            info.name = renames.get(info.name, info.name)
    return PassResult(model, True, [{"what": f"renamed {len(renames)} names that the converter would reuse", "examples": clashing[:3]}])


rename_converter_names = Repair(name="rename_converter_names", order=40, stage="fp16-before", find=find, rewrite=rewrite)
