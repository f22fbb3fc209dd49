"""Known fp16 kernel hazards, kept in fp32 before any trial: failures no host check can see.

onnxruntime's WebGPU EP returns 0 for an fp16 ReduceMean over 65520 or more values (measured on the
native plugin on lavapipe and on onnxruntime-web on an H200; 65518 values still gave the right
mean): a reduction or normalisation that long is kept in fp32 whatever the host says, so a model
that standardises a long audio chunk (HTDemucs: mean and std over 687960 values) gets a right fp16
variant on WebGPU without a GPU in the loop. Reduction lengths come from shape inference at the
sample inputs' shapes.

The same EP's fp16 ConvTranspose is wrong far along a long axis: the kernel converts each output
position (less the padding, plus the tap) to the tensor's own float type before dividing by the
stride, and fp16 holds integers exactly only up to 2048, so a ConvTranspose whose last input
position times its stride passes 2048 is kept. Measured on lavapipe (one node, random weights): a
stride-1 ConvTranspose with 2100 outputs along its axis is wrong from position 2048 on (0.78 of the
output's scale); stride 2 with 2060 outputs from 2051 on; stride 4 with 5376 outputs (HTDemucs'
first time-decoder layer) from 4103 on; 2048 outputs were right at strides 1 and 2. An H200 in
Chromium gives HTDemucs' fp16 the same error as lavapipe (time output 0.099 of its range).
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from pipeline.graph.passes.util import constant_values, copy_model, infer_shapes

LONG_REDUCTION = 65520  # fp16 ReduceMean on WebGPU returns 0 from this many values on
REDUCE_OPS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}
EXACT_POSITIONS = 2048  # fp16 represents every integer up to this one
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


def _far_position(node: onnx.NodeProto, in_dims: list[int]) -> tuple[int, int, int] | None:
    """(position, input length, stride) of the axis where the WebGPU ConvTranspose kernel counts
    furthest: an input position times the stride is the largest count that picks a real input."""
    spatial = in_dims[2:]
    if not spatial:
        return None
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    strides = list(attributes.get("strides") or [1] * len(spatial))
    return max(((size - 1) * stride, size, stride) for size, stride in zip(spatial, strides))


def known_kernel_hazards(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, str]:
    """{node: why} for main-graph reductions and normalisations over at least LONG_REDUCTION
    values, and ConvTransposes whose positions fp16 cannot count exactly (beyond EXACT_POSITIONS),
    at the given input shapes (the model's own where none are given)."""
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
        if node.op_type == "ConvTranspose" and node.name and node.input[0] in dims_of:
            far = _far_position(node, dims_of[node.input[0]])
            if far is not None and far[0] > EXACT_POSITIONS:
                found[node.name] = (f"known WebGPU kernel hazard: fp16 ConvTranspose over {far[1]} input positions at stride {far[2]}, counting to {far[0]} "
                                    f"(the kernel counts positions in fp16, exact only up to {EXACT_POSITIONS}); kept without a trial")
            continue
        if node.op_type not in REDUCE_OPS | NORM_OPS or not node.input or node.input[0] not in dims_of or not node.name:
            continue
        count = _reduced_count(node, dims_of[node.input[0]], constants)
        if count is not None and count >= LONG_REDUCTION:
            found[node.name] = f"known WebGPU kernel hazard: fp16 {node.op_type} over {count} values (fp16 ReduceMean returns 0 from {LONG_REDUCTION} values on); kept without a trial"
    return found

