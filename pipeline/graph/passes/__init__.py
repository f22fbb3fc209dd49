"""Repair passes by name (the names recipes use and report.json `steps` record).

`auto_repairs(model)` picks, from what hazard detection finds, the passes a model needs and the
order to run them in. The fp16-readiness passes are registered for recipes to name; the fp16 stage
runs them at its own points (`detach_consumed_outputs` before conversion, `cast_retarget` after).
"""

from __future__ import annotations

import onnx

from pipeline.graph.passes.base import GraphPass, PassResult
from pipeline.graph.passes.fold_if import fold_if
from pipeline.graph.passes.fp16_ready import cast_retarget, detach_consumed_outputs, rename_converter_names
from pipeline.graph.passes.neg_step_slice import neg_step_slice
from pipeline.graph.passes.stale_shapes import stale_shapes
from pipeline.graph.passes.topo_sort import topological_sort

PASSES: dict[str, GraphPass] = {
    graph_pass.name: graph_pass
    for graph_pass in (fold_if, neg_step_slice, stale_shapes, rename_converter_names, detach_consumed_outputs, cast_retarget, topological_sort)
}


def auto_repairs(model: onnx.ModelProto) -> list[str]:
    """Names of the graph repairs this model needs, in run order (see pipeline.graph.hazards)."""
    from pipeline.graph.hazards import auto_repairs as detect_repairs  # late: hazards imports the passes

    return detect_repairs(model)


__all__ = ["PASSES", "GraphPass", "PassResult", "auto_repairs"]
