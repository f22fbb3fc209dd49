"""Detection: the patterns in a model that break onnxruntime-web.

A hazard record is `{node, op, hazard, affects, repair, detail}` (pipeline.graph.passes.base.hazard):
`affects` lists the `bundle/EP` pairs where it goes wrong (bundles as in pipeline.runtime: root,
webgpu, wasm), or `fp16-conversion` for what breaks the fp16 variant; `repair` is the name of a
registered repair, or None when pack cannot repair it. Each repair module detects its own pattern
(its `find`); this module gathers them and adds the hazard that no repair owns: the NHWC layout
transform. fp16 readiness (which needs the precision stage) is pipeline/precision/readiness.py.
"""

from __future__ import annotations

from typing import Any

import onnx

from pipeline.graph import repairs
from pipeline.graph.passes.stale_shapes import find_stale_shapes

# Ops the NHWC layout transform rewrites (it wraps them in Transposes and pushes those around).
LAYOUT_SENSITIVE_OPS = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
    "InstanceNormalization", "BatchNormalization", "Resize", "DepthToSpace", "SpaceToDepth", "GridSample",
}


def detect_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Every hazard the source-stage repairs find, repair by repair in run order, graph order within."""
    return repairs.find_hazards(model, "source")


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

