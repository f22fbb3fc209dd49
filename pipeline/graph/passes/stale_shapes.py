"""Repair (a): value_info shapes that disagree with what the graph computes.

Exporters and older optimisers leave value_info entries that no longer match the tensors (the
WavTokenizer decoder records a 3-D shape for a Squeeze whose output is 1-D). onnxruntime-web's
session creation and its NHWC layout transform trust those entries and fail. The repair clears
every value_info, re-infers with data propagation, and records each recorded shape that the
inference contradicts. Clearing first matters: inference keeps an old shape when it infers none.
"""

from __future__ import annotations

from typing import Any

import onnx

from pipeline.graph.passes.base import BUNDLE_EPS, PassResult, PassSettings, Repair, hazard
from pipeline.graph.passes.util import (
    Dim,
    all_graphs,
    copy_model,
    dims_of,
    elem_type_of,
    infer_shapes,
    node_label,
)


def shapes_disagree(recorded: list[Dim] | None, inferred: list[Dim] | None) -> bool:
    """True when both are known and they cannot describe the same tensor (rank or a fixed dim differs)."""
    if recorded is None or inferred is None:
        return False
    if len(recorded) != len(inferred):
        return True
    return any(isinstance(r, int) and isinstance(i, int) and r != i for r, i in zip(recorded, inferred))


def _strip_shape(value: onnx.ValueInfoProto) -> None:
    if value.type.HasField("tensor_type"):
        value.type.tensor_type.ClearField("shape")


def _producers(model: onnx.ModelProto) -> dict[str, str]:
    producers: dict[str, str] = {}
    for graph in all_graphs(model.graph):
        for index, node in enumerate(graph.node):
            for output in node.output:
                producers[output] = node_label(node, index)
    return producers


def find_stale_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """The re-inferred model and one record per recorded shape that inference contradicts."""
    probe = copy_model(model)
    for graph in all_graphs(probe.graph):
        del graph.value_info[:]
    for output in probe.graph.output:
        _strip_shape(output)
    inferred = infer_shapes(probe)

    inferred_values = {v.name: v for g in all_graphs(inferred.graph) for v in g.value_info}
    inferred_values.update({v.name: v for v in inferred.graph.output})
    recorded_values = [(v, "value_info") for g in all_graphs(model.graph) for v in g.value_info]
    recorded_values += [(v, "output") for v in model.graph.output]

    producers = _producers(model)
    records: list[dict[str, Any]] = []
    for recorded, where in recorded_values:
        fresh = inferred_values.get(recorded.name)
        if fresh is None:
            continue
        old_dims, new_dims = dims_of(recorded), dims_of(fresh)
        old_type, new_type = elem_type_of(recorded), elem_type_of(fresh)
        type_differs = bool(old_type and new_type and old_type != new_type)
        if shapes_disagree(old_dims, new_dims) or type_differs:
            records.append({
                "node": producers.get(recorded.name, recorded.name),
                "value": recorded.name,
                "where": where,
                "what": "recorded shape disagrees with inferred shape; replaced",
                "recorded": old_dims,
                "inferred": new_dims,
                "recorded_type": onnx.TensorProto.DataType.Name(old_type) if old_type else None,
                "inferred_type": onnx.TensorProto.DataType.Name(new_type) if new_type else None,
            })
    return inferred, records


def find(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """One hazard per recorded shape that inference contradicts."""
    _, records = find_stale_shapes(model)
    ops = {o: n.op_type for n in model.graph.node for o in n.output}
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
        hazards.append(hazard(record["node"], ops.get(record["value"], "?"), "stale-shape", list(BUNDLE_EPS), "stale_shapes", detail))
    return hazards


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    inferred, records = find_stale_shapes(model)
    if not records:
        return PassResult(copy_model(model), False, [])
    repaired = copy_model(inferred)
    # Graph outputs are the package's interface: keep each declared output unless it was wrong.
    wrong_outputs = {r["value"] for r in records if r["where"] == "output"}
    del repaired.graph.output[:]
    for declared in model.graph.output:
        replacement = next((o for o in inferred.graph.output if o.name == declared.name), declared)
        repaired.graph.output.append(replacement if declared.name in wrong_outputs else declared)
    return PassResult(repaired, True, records)


# Shapes last: the structural repairs before it add and remove values, and this re-infers them all.
stale_shapes = Repair(name="stale_shapes", order=30, stage="source", find=find, rewrite=rewrite)
