"""fp16 readiness: what fp16 conversion will meet in a model (`pack inspect`, before converting).

Already-converted or quantized models, the findings of the repairs that run around the conversion
(with the pass that repairs each), and initializers outside fp16's range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from pipeline.graph import repairs
from pipeline.graph.hazards import detect_hazards
from pipeline.graph.passes.base import FP16, hazard
from pipeline.precision.detect import detect_precision, quantized_ops

_FP16_MAX = 65504.0
_FP16_TINY = 5.96e-08  # smallest fp16 subnormal: smaller non-zero magnitudes become 0
_UNDERFLOW_SHARE = 0.01


def fp16_readiness(model: onnx.ModelProto, hazards: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What fp16 conversion will meet: already-converted or quantized models, and the findings
    (with the pass that repairs each) that make a plain conversion fail or lose accuracy.
    `hazards`: detect_hazards(model) when the caller has it already."""
    precision, why = detect_precision(model)
    graph = model.graph
    findings = repairs.find_hazards(model, "fp16-before")
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
    return {"precision": precision, "why": why, "ready": not blocking, "findings": findings, "quantized_ops": quantized_ops(model)}
