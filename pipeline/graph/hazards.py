"""Detection: the patterns in a model that break onnxruntime-web.

A hazard record is `{node, op, hazard, affects, repair, detail}` (pipeline.graph.passes.base.hazard):
`affects` lists the `bundle/EP` pairs where it goes wrong (bundles as in pipeline.runtime: root,
webgpu, wasm), or `fp16-conversion` for what breaks the fp16 variant; `repair` is the name of a
registered repair, or None when pack cannot repair it. Each repair module detects its own pattern
(its `find`); this module gathers them and adds the hazards that no repair owns: the NHWC layout
transform and fp16 range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from pipeline.graph import registry
from pipeline.graph.passes.base import FP16, hazard
from pipeline.graph.passes.stale_shapes import find_stale_shapes

# Ops the NHWC layout transform rewrites (it wraps them in Transposes and pushes those around).
LAYOUT_SENSITIVE_OPS = {
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
    "InstanceNormalization", "BatchNormalization", "Resize", "DepthToSpace", "SpaceToDepth", "GridSample",
}


def detect_hazards(model: onnx.ModelProto) -> list[dict[str, Any]]:
    """Every hazard the source-stage repairs find, repair by repair in run order, graph order within."""
    return registry.find_hazards(model, "source")


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


def fp16_readiness(model: onnx.ModelProto, hazards: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What fp16 conversion will meet: already-converted or quantized models, and the findings
    (with the pass that repairs each) that make a plain conversion fail or lose accuracy.
    `hazards`: detect_hazards(model) when the caller has it already."""
    from pipeline.precision.detect import detect_precision

    precision, why = detect_precision(model)
    graph = model.graph
    findings = registry.find_hazards(model, "fp16-before", "fp16-after")
    findings += [h for h in (detect_hazards(model) if hazards is None else hazards) if FP16 in h["affects"]]
    for init in graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        magnitudes = np.abs(onnx.numpy_helper.to_array(init)).reshape(-1)
        overflow = int(np.count_nonzero(magnitudes > _FP16_MAX))
        nonzero = int(np.count_nonzero(magnitudes))
        underflow = int(np.count_nonzero((magnitudes > 0) & (magnitudes < _FP16_TINY)))
        # A few flushed-to-zero weights are harmless; overflow (inf) or wholesale underflow is not.
        if overflow or (nonzero and underflow / nonzero > _UNDERFLOW_SHARE):
            findings.append(hazard(init.name, "initializer", "outside-fp16-range", [FP16], None,
                                   f"{overflow} values above 65504 become inf, {underflow} of {nonzero} non-zero values below 6e-8 become 0 in fp16"))
    blocking = precision != "fp32" or any(f["repair"] is None and f["hazard"] == "if-subgraph" for f in findings)
    return {"precision": precision, "why": why, "ready": not blocking, "findings": findings}
