"""fp16 readiness, after conversion: a `Cast(to=FLOAT)` whose output the converter relabels fp16.

The converter types the Cast's output fp16 but leaves `to=FLOAT`, so the node still produces fp32
and onnxruntime refuses the type mismatch. The repair points such Casts at FLOAT16. Detection runs
on the source model: every Cast to FLOAT there is one the converter will relabel.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto

from pipeline.graph.passes.base import FP16, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import all_graphs, copy_model, node_label


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    return [
        hazard(node_label(node, index), "Cast", "cast-to-float", [FP16], "cast_retarget",
               "the converter relabels this Cast's output fp16 but keeps to=FLOAT (repaired after conversion)")
        for index, node in enumerate(model.graph.node)
        if node.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute)
    ]


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    declared = {
        vi.name: vi.type.tensor_type.elem_type
        for graph in all_graphs(model.graph)
        for vi in list(graph.value_info) + list(graph.output)
    }
    targets = []
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type != "Cast" or declared.get(node.output[0]) != TensorProto.FLOAT16:
                continue
            to = next((a for a in node.attribute if a.name == "to"), None)
            if to is not None and to.i == TensorProto.FLOAT:
                targets.append(node.name or node.output[0])
    if not targets:
        return PassResult(model, False)
    model = copy_model(model)
    wanted = set(targets)
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Cast" and (node.name or node.output[0]) in wanted:
                for attribute in node.attribute:
                    if attribute.name == "to":
                        attribute.i = TensorProto.FLOAT16
    return PassResult(model, True, [{"node": name, "what": "Cast to=FLOAT -> FLOAT16 (output is typed fp16)"} for name in targets])


cast_retarget = Repair(name="cast_retarget", order=60, stage="fp16-after", find=find, rewrite=rewrite)
