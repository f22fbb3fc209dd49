"""Repair (b): negative-step Slice whose start or end lies outside the axis.

Exporters write a reversal as `Slice(starts=[-1], ends=[INT64_MIN+1], steps=[-1])`. The spec clamps
such an end to -1 ("through index 0"); the root (JSEP) build of onnxruntime-web clamps it to 0 and
drops the first element (31 elements in, 30 out). No in-range end can say "through index 0" with a
negative step, so the repair pads the axis with one element in front and ends the slice at that pad
(end 0, in range on every build); out-of-range starts become in-range ones. This works whether the
axis length is static or only known at run time: nothing depends on the length itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from pipeline.graph.passes.base import PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import (
    Dim,
    NameMaker,
    all_graphs,
    constant_values,
    copy_model,
    inferred_dims,
    main_opset,
    node_label,
)

# A start or end this large cannot be in range for any tensor a browser can hold: an exporter's sentinel.
SENTINEL = 2**31


class SlicePlan:
    """What the rewrite of one Slice needs: per-axis starts and ends, and which axes get a front pad."""

    def __init__(self, axes: list[int], starts: list[int], ends: list[int], pad_axes: list[int], dynamic: bool):
        self.axes, self.starts, self.ends = axes, starts, ends
        self.pad_axes, self.dynamic = pad_axes, dynamic


def _ints(values: dict[str, np.ndarray], name: str) -> list[int] | None:
    if name not in values:
        return None
    return [int(v) for v in np.asarray(values[name]).reshape(-1)]


def _end_out_of_range(end: int, dim: Dim) -> bool:
    # With a negative step, an end e says "through index 0" once e + dim <= -1.
    return end <= -SENTINEL or (isinstance(dim, int) and end < -dim)


def _start_out_of_range(start: int, dim: Dim) -> bool:
    return start >= SENTINEL or start <= -SENTINEL or (isinstance(dim, int) and not -dim <= start < dim)


def plan_slice(node: onnx.NodeProto, values: dict[str, np.ndarray], dims: list[Dim] | None) -> SlicePlan | None:
    """The rewrite for one Slice node, or None when it has no out-of-range negative-step axis we can prove."""
    if len(node.input) < 5 or not node.input[4]:
        return None  # no steps input: every step is 1
    starts, ends, steps = (_ints(values, node.input[i]) for i in (1, 2, 4))
    if starts is None or ends is None or steps is None or not any(s < 0 for s in steps):
        return None
    axes = _ints(values, node.input[3]) if node.input[3] else list(range(len(starts)))
    if axes is None:
        return None
    rank = len(dims) if dims is not None else None
    if any(a < 0 for a in axes):
        if rank is None:
            return None
        axes = [a + rank if a < 0 else a for a in axes]

    new_starts, new_ends, pad_axes = list(starts), list(ends), []
    dynamic = False
    for i, (axis, start, end, step) in enumerate(zip(axes, starts, ends, steps)):
        if step >= 0:
            continue
        dim = dims[axis] if dims is not None and axis < len(dims) else None
        end_out, start_out = _end_out_of_range(end, dim), _start_out_of_range(start, dim)
        if not (end_out or start_out):
            continue
        dynamic = dynamic or not isinstance(dim, int)
        if dim == 0:
            continue  # an empty axis slices to empty on every build
        if isinstance(dim, int):
            # Counting from the end keeps the same element whether or not the axis gets a front pad.
            first = min(max(start + dim if start < 0 else start, 0), dim - 1)
            new_starts[i] = first - dim
        elif start_out:
            if start <= -SENTINEL:
                return None  # "start before index 0" at unknown length: nothing provable to rewrite
            new_starts[i] = -1
        elif end_out and start >= 0:
            new_starts[i] = start + 1  # the front pad shifts non-negative indices by one
        if end_out:
            pad_axes.append(axis)
            new_ends[i] = 0  # stop at the pad, i.e. after index 0 of the original axis
    if new_starts == starts and new_ends == ends:
        return None
    return SlicePlan(axes, new_starts, new_ends, pad_axes, dynamic)


def _pad_nodes(
    data: str, plan: SlicePlan, opset: int, rank: int | None, fresh: NameMaker, base: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    padded = fresh(f"{data}_front_padded")
    name = fresh(f"{base}_front_pad")
    if opset >= 18:
        pads = numpy_helper.from_array(np.array([1] * len(plan.pad_axes) + [0] * len(plan.pad_axes), np.int64), fresh(f"{base}_pads"))
        axes = numpy_helper.from_array(np.array(plan.pad_axes, np.int64), fresh(f"{base}_pad_axes"))
        return [helper.make_node("Pad", [data, pads.name, "", axes.name], [padded], name=name)], [pads, axes], padded
    assert rank is not None
    before = [1 if a in plan.pad_axes else 0 for a in range(rank)]
    full = before + [0] * rank
    if opset >= 11:
        pads = numpy_helper.from_array(np.array(full, np.int64), fresh(f"{base}_pads"))
        return [helper.make_node("Pad", [data, pads.name], [padded], name=name)], [pads], padded
    return [helper.make_node("Pad", [data], [padded], name=name, pads=full)], [], padded


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Negative-step Slices the root (JSEP) build may get wrong: the provable ones are repairable."""
    graph = model.graph
    if main_opset(model) < 10 or not any(n.op_type == "Slice" for n in graph.node):
        return []
    values = constant_values(graph)
    shapes = inferred_dims(model)
    hazards = []
    for index, node in enumerate(graph.node):
        if node.op_type != "Slice" or len(node.input) < 5 or not node.input[4]:
            continue
        label = node_label(node, index)
        steps = values.get(node.input[4])
        if steps is None:
            hazards.append(hazard(label, "Slice", "dynamic-slice-steps", ["root/webgpu"], None,
                                  "steps are computed at run time; a negative step with an end before index 0 loses the first element on the root (JSEP) build"))
            continue
        if not np.any(np.asarray(steps) < 0):
            continue
        if node.input[1] not in values or node.input[2] not in values:
            hazards.append(hazard(label, "Slice", "neg-step-slice-dynamic-bounds", ["root/webgpu"], None,
                                  "negative step with starts/ends computed at run time: cannot prove them in range for the root (JSEP) build"))
            continue
        plan = plan_slice(node, values, shapes.get(node.input[0]))
        if plan is None:
            continue
        detail = "negative-step Slice"
        if plan.pad_axes:
            detail += f" ends before index 0 on axis {plan.pad_axes}: the root (JSEP) build on WebGPU drops the first element of that axis"
        else:
            detail += " starts outside the axis: the root (JSEP) build clamps bounds differently from the spec"
        hazards.append(hazard(label, "Slice", "neg-step-slice", ["root/webgpu"], "neg_step_slice", detail))
    return hazards


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    graph = model.graph
    values = constant_values(graph)
    opset = main_opset(model)
    if opset < 10 or not any(n.op_type == "Slice" for n in graph.node):
        return PassResult(copy_model(model), False, [])
    shapes = inferred_dims(model)
    plans: dict[int, SlicePlan] = {}
    for index, node in enumerate(graph.node):
        if node.op_type != "Slice" or node.domain not in ("", "ai.onnx"):
            continue
        dims = shapes.get(node.input[0])
        plan = plan_slice(node, values, dims)
        if plan is None or (plan.pad_axes and opset < 18 and dims is None):
            continue
        plans[index] = plan
    if not plans:
        return PassResult(copy_model(model), False, [])

    repaired = copy_model(model)
    fresh = NameMaker(repaired.graph)
    new_nodes: list[onnx.NodeProto] = []
    records: list[dict[str, Any]] = []
    for index, node in enumerate(repaired.graph.node):
        plan = plans.get(index)
        if plan is None:
            new_nodes.append(node)
            continue
        label = node_label(node, index)
        base = node.name or f"slice{index}"
        data = node.input[0]
        if plan.pad_axes:
            dims = shapes.get(data)
            pad_nodes, pad_inits, data = _pad_nodes(data, plan, opset, len(dims) if dims else None, fresh, base)
            new_nodes.extend(pad_nodes)
            repaired.graph.initializer.extend(pad_inits)
        starts = numpy_helper.from_array(np.array(plan.starts, np.int64), fresh(f"{base}_starts"))
        ends = numpy_helper.from_array(np.array(plan.ends, np.int64), fresh(f"{base}_ends"))
        repaired.graph.initializer.extend([starts, ends])
        old = {"starts": _ints(values, node.input[1]), "ends": _ints(values, node.input[2])}
        rewritten = onnx.NodeProto()
        rewritten.CopyFrom(node)
        rewritten.input[0] = data
        rewritten.input[1] = starts.name
        rewritten.input[2] = ends.name
        new_nodes.append(rewritten)
        records.append({
            "node": label,
            "what": "negative-step Slice with out-of-range start/end rewritten in range"
            + (" after a one-element front Pad" if plan.pad_axes else ""),
            "axes": plan.axes,
            "starts": [old["starts"], plan.starts],
            "ends": [old["ends"], plan.ends],
            "padded_axes": plan.pad_axes,
            "dynamic_length": plan.dynamic,
        })
    del repaired.graph.node[:]
    repaired.graph.node.extend(new_nodes)
    _drop_unused_initializers(repaired.graph, {n for i in plans for n in model.graph.node[i].input[1:3]})
    return PassResult(repaired, True, records)


def _drop_unused_initializers(graph: onnx.GraphProto, candidates: set[str]) -> None:
    used = {name for g in all_graphs(graph) for node in g.node for name in node.input}
    used |= {o.name for o in graph.output}
    used |= {i.name for i in graph.input}
    keep = [init for init in graph.initializer if init.name not in candidates or init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


neg_step_slice = Repair(name="neg_step_slice", order=20, stage="source", find=find, rewrite=rewrite)
