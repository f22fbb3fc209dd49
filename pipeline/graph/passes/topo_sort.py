"""Topological order: the sort the fp16 stage runs on the model it converts (some exporters leave
nodes out of order, and onnx.checker refuses that even where onnxruntime loads it), the upcast of an
fp16 model, and the check every repair's rewrite and the conversion itself are held to (a rewrite
that leaves an ordered graph out of order is a bug: `OrderBroken`). A helper, not a repair: the
typed conversion keeps the order it is given, so nothing after it needs sorting."""

from __future__ import annotations

import onnx

from pipeline.errors import PackError
from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import all_graphs, subgraphs


def _reads(node: onnx.NodeProto) -> set[str]:
    """The node's inputs and the outer-scope names its subgraphs read (an If branch that pads `h`
    must come after the node that makes `h`)."""
    names = set(node.input)
    for sub in subgraphs(node):
        for graph in all_graphs(sub):
            for inner in graph.node:
                names.update(inner.input)
    return names


def _sorted_nodes(graph: onnx.GraphProto, outer: set[str]) -> list[onnx.NodeProto]:
    available = set(outer) | {t.name for t in graph.input} | {t.name for t in graph.initializer} | {""}
    producers = {out for node in graph.node for out in node.output}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        still = []
        for node in pending:
            # Names nobody in this graph produces come from an enclosing scope.
            if all(name in available or name not in producers for name in _reads(node)):
                ordered.append(node)
                available.update(node.output)
            else:
                still.append(node)
        if len(still) == len(pending):
            raise PackError(f"graph '{graph.name}': node '{still[0].name}' ({still[0].op_type}) is part of a cycle; the model is malformed")
        pending = still
    return ordered


class OrderBroken(RuntimeError):
    """A rewrite left a node before the producer of something it reads: a bug in that rewrite."""


def out_of_order(model: onnx.ModelProto) -> str | None:
    """The first read of a value before the node that makes it, in any graph, or None."""

    def walk(graph: onnx.GraphProto, visible: set[str]) -> str | None:
        made_here = {out for node in graph.node for out in node.output}
        available = set(visible) | {t.name for t in graph.input} | {t.name for t in graph.initializer} | {""}
        for node in graph.node:
            for name in _reads(node):
                if name in made_here and name not in available:
                    return f"node '{node.name}' ({node.op_type}) in graph '{graph.name}' reads '{name}' before the node that makes it"
            available.update(node.output)
            for sub in subgraphs(node):
                found = walk(sub, available)
                if found:
                    return found
        return None

    return walk(model.graph, set())


def check_order(before: onnx.ModelProto, after: onnx.ModelProto, rewrite_name: str) -> None:
    """Raise OrderBroken naming the rewrite when `after` is out of order and `before` was not."""
    broken = out_of_order(after)
    if broken and out_of_order(before) is None:
        raise OrderBroken(f"'{rewrite_name}' broke topological order: {broken}")


def topological_sort(model: onnx.ModelProto) -> PassResult:
    """The model with its main graph's nodes in topological order (a new model when it moved any)."""
    ordered = _sorted_nodes(model.graph, set())
    if [id(n) for n in ordered] == [id(n) for n in model.graph.node]:
        return PassResult(model, False)
    moved = sum(1 for a, b in zip(ordered, model.graph.node) if a is not b)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    ordered = _sorted_nodes(model.graph, set())
    copies = [onnx.NodeProto.FromString(n.SerializeToString()) for n in ordered]
    del model.graph.node[:]
    model.graph.node.extend(copies)
    return PassResult(model, True, [{"what": f"reordered {moved} nodes into topological order"}])

