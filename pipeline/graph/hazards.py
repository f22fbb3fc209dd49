"""Detection: the patterns in a model that break onnxruntime-web, and the pass that repairs each.

A hazard record is `{node, op, hazard, affects, repair, detail}`: `affects` lists the
`bundle/EP` pairs where it goes wrong (bundles as in pipeline.runtime: root, webgpu, wasm), or
`fp16-conversion` for what breaks the fp16 variant; `repair` is a pass name from
`pipeline.graph.passes.PASSES`, or None when pack cannot repair it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from pipeline.graph.passes.fold_if import evaluate_value
from pipeline.graph.passes.neg_step_slice import plan_slice
from pipeline.graph.passes.stale_shapes import find_stale_shapes
from pipeline.graph.passes.util import constant_values, inferred_dims, main_opset, node_label

BUNDLE_EPS = ("root/webgpu", "root/wasm", "webgpu/webgpu", "webgpu/wasm")
FP16 = "fp16-conversion"

# Ops the NHWC layout transform rewrites (it wraps them in Transposes and pushes those around).
LAYOUT_SENSITIVE_OPS = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
    "InstanceNormalization", "BatchNormalization", "Resize", "DepthToSpace", "SpaceToDepth", "GridSample",
}
# Auto-repair order: structure first (folding and rewriting add or remove values), shapes last.
AUTO_ORDER = ("fold_if", "neg_step_slice", "stale_shapes")


def _hazard(node: str, op: str, hazard: str, affects: list[str], repair: str | None, detail: str) -> dict[str, Any]:
    return {"node": node, "op": op, "hazard": hazard, "affects": affects, "repair": repair, "detail": detail}


def _producer_ops(model: onnx.ModelProto) -> dict[str, str]:
    return {o: n.op_type for n in model.graph.node for o in n.output}


def stale_shape_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
    _, records = find_stale_shapes(model)
    ops = _producer_ops(model)
    hazards = []
    for record in records:
        recorded, inferred = record["recorded"], record["inferred"]
        rank_differs = recorded is not None and inferred is not None and len(recorded) != len(inferred)
        detail = f"{record['where']} of '{record['value']}' records shape {recorded}, the node computes {inferred}"
        if rank_differs:
            detail += (
                ": onnxruntime-web refuses the session ('Mismatch between number of inferred and declared"
                " dimensions') and the NHWC layout transform pushes a rank-"
                f"{len(recorded)} Transpose onto it"
            )
        hazards.append(_hazard(record["node"], ops.get(record["value"], "?"), "stale-shape", list(BUNDLE_EPS), "stale_shapes", detail))
    return hazards


def neg_step_slice_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
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
            hazards.append(_hazard(label, "Slice", "dynamic-slice-steps", ["root/webgpu"], None,
                                   "steps are computed at run time; a negative step with an end before index 0 loses the first element on the root (JSEP) build"))
            continue
        if not np.any(np.asarray(steps) < 0):
            continue
        if node.input[1] not in values or node.input[2] not in values:
            hazards.append(_hazard(label, "Slice", "neg-step-slice-dynamic-bounds", ["root/webgpu"], None,
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
        hazards.append(_hazard(label, "Slice", "neg-step-slice", ["root/webgpu"], "neg_step_slice", detail))
    return hazards


def if_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
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
            hazards.append(_hazard(label, "If", "if-known-condition", [FP16], "fold_if",
                                   f"condition is always {taken == 'then'}: only the {taken} branch runs; fp16 conversion fails on If subgraphs"))
        else:
            hazards.append(_hazard(label, "If", "if-subgraph", [FP16], None,
                                   "condition depends on run-time values: fp16 conversion cannot type the branches (TypeInferenceError)"))
    return hazards


def detect_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Every hazard in the model, in graph order per kind."""
    return [*if_hazards(model), *neg_step_slice_hazards(model), *stale_shape_hazards(model)]


def auto_repairs(model: onnx.ModelProto) -> list[str]:
    """The repair passes this model needs, in the order to run them."""
    wanted = {h["repair"] for h in detect_hazards(model) if h["repair"]}
    return [name for name in AUTO_ORDER if name in wanted]


def preferred_layout(model: onnx.ModelProto) -> str | None:
    """'NCHW' when the model carries hazards for the webgpu EP's NHWC layout transform, else None.

    Call it on the model that ships (after repairs): a repaired model needs no override. The
    hazard is a recorded shape whose rank disagrees with the computed one in a model the layout
    transform touches (it has layout-sensitive ops): the transform trusts the recorded rank.
    """
    if not any(n.op_type in LAYOUT_SENSITIVE_OPS for n in model.graph.node):
        return None
    _, records = find_stale_shapes(model)
    for record in records:
        recorded, inferred = record["recorded"], record["inferred"]
        if recorded is not None and inferred is not None and len(recorded) != len(inferred):
            return "NCHW"
    return None


# --- fp16 readiness -------------------------------------------------------------------------

_FP16_MAX = 65504.0
_FP16_TINY = 5.96e-08  # smallest fp16 subnormal: smaller non-zero magnitudes become 0
_UNDERFLOW_SHARE = 0.01


def fp16_readiness(model: onnx.ModelProto) -> dict[str, Any]:
    """What fp16 conversion will meet: already-converted or quantized models, and the findings
    (with the pass that repairs each) that make a plain conversion fail or lose accuracy."""
    from pipeline.precision.detect import detect_precision

    precision, why = detect_precision(model)
    graph = model.graph
    findings: list[dict[str, Any]] = []
    outputs = {o.name for o in graph.output}
    consumed = sorted({name for node in graph.node for name in node.input if name in outputs})
    for name in consumed:
        findings.append(_hazard(name, "output", "output-also-consumed", [FP16], "detach_consumed_outputs",
                                "a graph output other nodes also read: with keep_io_types they get the fp32 copy and mix types"))
    for index, node in enumerate(graph.node):
        if node.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute):
            findings.append(_hazard(node_label(node, index), "Cast", "cast-to-float", [FP16], "cast_retarget",
                                    "the converter relabels this Cast's output fp16 but keeps to=FLOAT (repaired after conversion)"))
    findings.extend(if_hazards(model))
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        magnitudes = np.abs(onnx.numpy_helper.to_array(init)).reshape(-1)
        overflow = int(np.count_nonzero(magnitudes > _FP16_MAX))
        nonzero = int(np.count_nonzero(magnitudes))
        underflow = int(np.count_nonzero((magnitudes > 0) & (magnitudes < _FP16_TINY)))
        # A few flushed-to-zero weights are harmless; overflow (inf) or wholesale underflow is not.
        if overflow or (nonzero and underflow / nonzero > _UNDERFLOW_SHARE):
            findings.append(_hazard(init.name, "initializer", "outside-fp16-range", [FP16], None,
                                    f"{overflow} values above 65504 become inf, {underflow} of {nonzero} non-zero values below 6e-8 become 0 in fp16"))
    blocking = precision != "fp32" or any(f["repair"] is None and f["hazard"] == "if-subgraph" for f in findings)
    return {"precision": precision, "why": why, "ready": not blocking, "findings": findings}
