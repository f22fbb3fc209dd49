"""Repairs that make onnxconverter-common's fp16 conversion load in onnxruntime.

`detach_consumed_outputs` runs before conversion, `cast_retarget` after it. Each follows the pass
contract in base.py. The failures they fix are measured on real models (../shared notes fp16.md).
"""

from __future__ import annotations

import re

import onnx
from onnx import TensorProto, helper

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model


class DetachConsumedOutputs:
    """A graph output that other nodes also read: with keep_io_types the converter gives the readers
    the fp32 copy and they then mix fp32 with fp16. Give the internal tensor its own name, point the
    readers at it, and produce the graph output with `Identity(internal)`."""

    name = "detach_consumed_outputs"

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        graph = model.graph
        output_names = {o.name for o in graph.output}
        consumed = {name for node in graph.node for name in node.input if name in output_names}
        # Already detached: produced by one of our Identity nodes and read by nobody else.
        if not consumed:
            return PassResult(model, False)
        model = copy_model(model)
        graph = model.graph
        fresh = NameMaker(graph)
        records = []
        new_nodes = []
        for output_name in sorted(consumed):
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


class CastRetarget:
    """After conversion: a `Cast(to=FLOAT)` whose output the converter relabelled as fp16 still
    produces fp32, and onnxruntime refuses the type mismatch. Point such Casts at FLOAT16."""

    name = "cast_retarget"

    def __call__(self, model: onnx.ModelProto) -> PassResult:
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


class RenameConverterNames:
    """Tensors and nodes already named like the converter's own casts (`<node>_output_cast_0`,
    `graph_input_cast_0`, ...), left by an earlier conversion, collide with the casts a new
    conversion adds and break single assignment. Give them fresh names (graph inputs and outputs
    keep theirs: they are the model's interface)."""

    name = "rename_converter_names"
    PATTERN = re.compile(r"(_input_cast_\d+|_output_cast_\d+|^graph_input_cast\d*|^graph_output_cast\d*)$")

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        interface = {v.name for v in [*model.graph.input, *model.graph.output]}
        clashing = sorted({
            name
            for graph in all_graphs(model.graph)
            for node in graph.node
            for name in [*node.output, node.name]
            if name and name not in interface and self.PATTERN.search(name)
        })
        if not clashing:
            return PassResult(model, False)
        model = copy_model(model)
        fresh = NameMaker(model.graph)
        renames = {name: fresh(self.PATTERN.sub("", name) + "__prev_cast") for name in clashing}
        for graph in all_graphs(model.graph):
            for node in graph.node:
                node.input[:] = [renames.get(n, n) for n in node.input]
                node.output[:] = [renames.get(n, n) for n in node.output]
                node.name = renames.get(node.name, node.name)
            for info in graph.value_info:
                info.name = renames.get(info.name, info.name)
        return PassResult(model, True, [{"what": f"renamed {len(renames)} names that the converter would reuse", "examples": clashing[:3]}])


detach_consumed_outputs = DetachConsumedOutputs()
rename_converter_names = RenameConverterNames()
cast_retarget = CastRetarget()
