"""Repair (d): `If` nodes whose condition is known before running.

Exporters emit `If` for Python branches on shapes (`if x.shape[0] == 1`). When the condition is a
constant, or follows from constants and static shapes, the branch taken is fixed: the pass inlines
that branch's nodes in place of the `If`. This removes subgraphs, which fp16 conversion cannot
handle and which onnxruntime-web runs partly on the CPU. Nodes that only computed the condition are
removed with it. Repeats until no foldable `If` is left, so nested ones fold too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.graph.passes.base import FP16, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import (
    NameMaker,
    constant_values,
    copy_model,
    inferred_dims,
    main_opset,
    node_label,
    subgraphs,
)

# Ops whose value we compute while deciding a condition; anything else makes it undecidable.
_FOLDABLE_OPS = {
    "Identity", "Cast", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor",
    "Gather", "Slice", "Squeeze", "Unsqueeze", "Concat", "Reshape", "Add", "Sub", "Mul", "Div", "Mod", "Neg",
    "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "Min", "Max", "Abs", "Where", "ConstantOfShape",
}
_MAX_FOLD_ELEMENTS = 1 << 16  # conditions are computed from shapes; never evaluate big tensors


def _shape_constant(node: onnx.NodeProto, dims: list[Any] | None) -> np.ndarray | None:
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(dims)), dtype=np.int64)
    start = next((a.i for a in node.attribute if a.name == "start"), 0)
    end = next((a.i for a in node.attribute if a.name == "end"), None)
    return np.array(dims[start:end], dtype=np.int64)


def evaluate_value(
    name: str,
    producers: dict[str, onnx.NodeProto],
    known: dict[str, np.ndarray],
    shapes: dict[str, list[Any] | None],
    opset: int,
) -> np.ndarray | None:
    """The value of `name` computed from constants and static shapes alone, or None."""
    if name in known:
        return known[name]
    node = producers.get(name)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("Shape", "Size"):
        value = _shape_constant(node, shapes.get(node.input[0]))
        if value is not None:
            known[name] = value
        return value
    if node.op_type not in _FOLDABLE_OPS:
        return None
    inputs: dict[str, np.ndarray] = {}
    for source in node.input:
        if not source:
            continue
        value = evaluate_value(source, producers, known, shapes, opset)
        if value is None or value.size > _MAX_FOLD_ELEMENTS:
            return None
        inputs[source] = value
    from onnx.reference import ReferenceEvaluator  # imported late: only needed when an If exists

    tiny = helper.make_graph(
        [node], "fold", [],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o],
        [numpy_helper.from_array(v, n) for n, v in inputs.items()],
    )
    try:
        results = ReferenceEvaluator(helper.make_model(tiny, opset_imports=[helper.make_opsetid("", opset)])).run(None, {})
    except Exception:  # noqa: BLE001 - an op we cannot evaluate just leaves the If alone
        return None
    for output, value in zip([o for o in node.output if o], results):
        known[output] = np.asarray(value)
    return known.get(name)


def _rename_in_graph(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    """Point references inside a nested subgraph at renamed outer values."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for sub in subgraphs(node):
            _rename_in_graph(sub, renames)
    for output in graph.output:
        if output.name in renames:
            output.name = renames[output.name]


def inline_branch(
    if_node: onnx.NodeProto, branch: onnx.GraphProto, fresh: NameMaker, prefix: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The branch's nodes and initializers renamed into the outer graph, writing the If's outputs."""
    renames: dict[str, str] = {}
    for init in branch.initializer:
        renames[init.name] = fresh(f"{prefix}/{init.name}")
    for node in branch.node:
        for output in node.output:
            if output:
                renames[output] = fresh(f"{prefix}/{output}")
    # Branch outputs produced inside the branch are written straight into the If's output names.
    produced_here = {o for node in branch.node for o in node.output}
    extra: list[onnx.NodeProto] = []
    for branch_output, if_output in zip(branch.output, if_node.output):
        if branch_output.name in produced_here and branch_output.name not in {o.name for o in branch.input}:
            renames[branch_output.name] = if_output
        else:  # an outer value or a branch initializer passed through
            source = renames.get(branch_output.name, branch_output.name)
            extra.append(helper.make_node("Identity", [source], [if_output], name=fresh(f"{prefix}/passthrough")))
    nodes: list[onnx.NodeProto] = []
    for node in branch.node:
        moved = onnx.NodeProto()
        moved.CopyFrom(node)
        moved.name = fresh(f"{prefix}/{node.name or node.op_type}")
        for i, name in enumerate(moved.input):
            if name in renames:
                moved.input[i] = renames[name]
        for i, name in enumerate(moved.output):
            if name in renames:
                moved.output[i] = renames[name]
        for sub in subgraphs(moved):
            _rename_in_graph(sub, renames)
        nodes.append(moved)
    initializers = []
    for init in branch.initializer:
        moved_init = onnx.TensorProto()
        moved_init.CopyFrom(init)
        moved_init.name = renames[init.name]
        initializers.append(moved_init)
    return nodes + extra, initializers


def _remove_dead_ancestors(graph: onnx.GraphProto, roots: set[str]) -> None:
    """Drop the nodes that only fed a folded condition (and nothing else)."""
    graph_outputs = {o.name for o in graph.output}
    candidates = set(roots)
    while candidates:
        used = {name for node in graph.node for name in node.input}
        used |= {n for node in graph.node for sub in subgraphs(node) for n in _outer_references(sub)}
        dead = [
            node for node in graph.node
            if any(o in candidates for o in node.output)
            and not any(o in used or o in graph_outputs for o in node.output if o)
        ]
        if not dead:
            break
        candidates = {name for node in dead for name in node.input}
        for node in dead:
            graph.node.remove(node)
        still_used = {name for node in graph.node for name in node.input} | graph_outputs
        still_used |= {n for node in graph.node for sub in subgraphs(node) for n in _outer_references(sub)}
        unused = [i for i in graph.initializer if i.name in candidates and i.name not in still_used]
        for init in unused:
            graph.initializer.remove(init)


def _outer_references(graph: onnx.GraphProto) -> set[str]:
    names = {name for node in graph.node for name in node.input}
    for node in graph.node:
        for sub in subgraphs(node):
            names |= _outer_references(sub)
    return names


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Every `If` of the main graph: foldable when its condition is known before running."""
    graph = model.graph
    if not any(n.op_type == "If" for n in graph.node):
        return []
    shapes = inferred_dims(model)
    known = constant_values(graph)
    producers = {o: n for n in graph.node for o in n.output}
    hazards = []
    for index, node in enumerate(graph.node):
        if node.op_type != "If":
            continue
        condition = evaluate_value(node.input[0], producers, known, shapes, main_opset(model))
        label = node_label(node, index)
        if condition is not None and condition.size == 1:
            taken = "then" if bool(condition.reshape(-1)[0]) else "else"
            hazards.append(hazard(label, "If", "if-known-condition", [FP16], "fold_if",
                                  f"condition is always {taken == 'then'}: only the {taken} branch runs; fp16 conversion fails on If subgraphs"))
        else:
            hazards.append(hazard(label, "If", "if-subgraph", [FP16], None,
                                  "condition depends on run-time values: fp16 conversion cannot type the branches (TypeInferenceError)"))
    return hazards


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    if not any(n.op_type == "If" for n in model.graph.node):
        return PassResult(copy_model(model), False, [])
    repaired = copy_model(model)
    records: list[dict[str, Any]] = []
    while _fold_one(repaired, records):
        pass
    if not records:
        return PassResult(copy_model(model), False, [])
    return PassResult(repaired, True, records)


def _fold_one(model: onnx.ModelProto, records: list[dict[str, Any]]) -> bool:
    graph = model.graph
    shapes = inferred_dims(model)
    known = constant_values(graph)
    producers = {o: node for node in graph.node for o in node.output}
    for index, node in enumerate(graph.node):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        condition = evaluate_value(node.input[0], producers, known, shapes, main_opset(model))
        if condition is None or condition.size != 1:
            continue
        taken = bool(condition.reshape(-1)[0])
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if taken else "else_branch"))
        label = node_label(node, index)
        fresh = NameMaker(graph)
        nodes, initializers = inline_branch(node, branch, fresh, node.name or f"If{index}")
        rebuilt = list(graph.node[:index]) + nodes + list(graph.node[index + 1:])
        del graph.node[:]
        graph.node.extend(rebuilt)
        graph.initializer.extend(initializers)
        _remove_dead_ancestors(graph, {node.input[0]})
        records.append({
            "node": label,
            "what": f"If with a condition known before running folded into its {'then' if taken else 'else'} branch",
            "condition": taken,
            "inlined_nodes": len(nodes),
        })
        return True
    return False


# Structure first: folding removes values that later repairs would otherwise look at.
fold_if = Repair(name="fold_if", order=10, stage="source", find=find, rewrite=rewrite)
