"""Known fp16 kernel hazards, kept in fp32 before any trial: failures no host check can see.

onnxruntime's WebGPU EP returns 0 for an fp16 ReduceMean over 65520 or more values (measured on the
native plugin on lavapipe and on onnxruntime-web on an H200; 65518 values still gave the right
mean): a reduction or normalisation that long is kept in fp32 whatever the host says, so a model
that standardises a long audio chunk (HTDemucs: mean and std over 687960 values) gets a right fp16
variant on WebGPU without a GPU in the loop. Reduction lengths come from shape inference at the
sample inputs' shapes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from pipeline.graph.passes.util import constant_values, copy_model, infer_shapes

LONG_REDUCTION = 65520  # fp16 ReduceMean on WebGPU returns 0 from this many values on
REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}
NORM_OPS = {"LayerNormalization", "InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization", "LpNormalization"}


def _fixed_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    fixed = copy_model(model)
    for value in fixed.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            for dim, size in zip(dims, shapes[value.name]):
                dim.Clear()
                dim.dim_value = int(size)
    return infer_shapes(fixed)


def _reduced_count(node: onnx.NodeProto, dims: list[int], constants: dict[str, np.ndarray]) -> int | None:
    rank = len(dims)
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type in REDUCE_OPS:
        axes = attributes.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            if node.input[1] not in constants:
                return None
            axes = [int(a) for a in np.asarray(constants[node.input[1]]).ravel()]
        if not axes:
            return None if attributes.get("noop_with_empty_axes") else math.prod(dims)
        return math.prod(dims[a % rank] for a in axes)
    if node.op_type == "LayerNormalization":
        return math.prod(dims[attributes.get("axis", -1) % rank:])
    if node.op_type in ("InstanceNormalization", "MeanVarianceNormalization"):
        axes = attributes.get("axes", [0, 2, 3]) if node.op_type == "MeanVarianceNormalization" else range(2, rank)
        return math.prod(dims[a % rank] for a in axes)
    if node.op_type == "GroupNormalization":
        return math.prod(dims[1:]) // max(int(attributes.get("num_groups", 1)), 1)
    if node.op_type == "LpNormalization":
        return dims[attributes.get("axis", -1) % rank]
    return None


def known_kernel_hazards(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, str]:
    """{node: why} for main-graph reductions and normalisations over at least LONG_REDUCTION
    values at the given input shapes (the model's own where none are given)."""
    inferred = _fixed_shapes(model, shapes or {})
    dims_of = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shape = value.type.tensor_type.shape
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in shape.dim):
            dims_of[value.name] = [d.dim_value for d in shape.dim]
    for tensor in model.graph.initializer:
        dims_of[tensor.name] = list(tensor.dims)
    constants = constant_values(model.graph)
    found = {}
    for node in model.graph.node:
        if node.op_type not in REDUCE_OPS | NORM_OPS or not node.input or node.input[0] not in dims_of or not node.name:
            continue
        count = _reduced_count(node, dims_of[node.input[0]], constants)
        if count is not None and count >= LONG_REDUCTION:
            found[node.name] = f"known WebGPU kernel hazard: fp16 {node.op_type} over {count} values (fp16 ReduceMean returns 0 from {LONG_REDUCTION} values on); kept without a trial"
    return found

