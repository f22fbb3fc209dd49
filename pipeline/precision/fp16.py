"""fp16 conversion that survives real models, and the reverse upcast for models shipped as fp16.

`convert_with_keeps` = the "fp16-before" repairs (rename names the converter would reuse, detach
consumed outputs) → topological order, unnamed nodes named → typed_fp16.py (fp16 by construction:
fp32 I/O kept, the safe block list and the nodes kept in fp32 in fp32, casts only between regions)
→ the order check (the typing keeps the order it is given, so nothing after it repairs or sorts)
→ full onnx.checker; an invalid result (or one onnxruntime refuses) keeps more nodes in fp32 and retries, reading the error (converter_errors.py). Each step is recorded for
report.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnxconverter_common import float16

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.topo_sort import check_order, topological_sort
from pipeline.graph.passes.util import all_graphs
from pipeline.graph.repairs import in_stage, run_passes
from pipeline.precision.converter_errors import ConversionError, KeepFailed, KeptNode, convert_keeping, kept_list, name_unnamed_nodes
from pipeline.precision.regions import FP16_MAX, FP16_MIN_SUBNORMAL, unholdable_constants
from pipeline.precision.typed_fp16 import convert_by_regions

# Ops kept in fp32 on top of the converter's own list: Resize's scales/roi must stay float, Range
# has no fp16 before opset 27, RandomNormalLike draws in its input's type (docs/precision.md).
SAFE_BLOCK_LIST = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | {"Resize", "Range", "RandomNormalLike"})


class FP16Refused(Exception):
    """The model cannot be converted safely; the message says why."""


def _converter_step(model: onnx.ModelProto, block_list: list[str], keep: set[str]) -> PassResult:
    result, rounding_warnings = convert_by_regions(model, keep, set(block_list), FP16_MAX, FP16_MIN_SUBNORMAL)
    blocked = sorted({n.op_type for g in all_graphs(model.graph) for n in g.node if n.op_type in block_list})
    what = f"converted to fp16, fp32 I/O kept; ops kept in fp32: {', '.join(blocked) or 'none'}"
    if keep:
        what += f"; {len(keep)} nodes kept in fp32"
    records = [{"what": what}] + result.records + [{"warning": note} for note in rounding_warnings]
    return PassResult(result.model, True, records)


def _convert_once(model: onnx.ModelProto, block_list: list[str], keep: set[str]) -> tuple[onnx.ModelProto, list[dict]]:
    """One conversion attempt keeping `keep` in fp32: (the checked fp16 model, its steps)."""
    result = _converter_step(model, block_list, keep)
    check_order(model, result.model, "fp16_convert")
    converted = result.model
    try:
        onnx.checker.check_model(converted, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise ConversionError(f"converted model fails onnx.checker: {error}", converted) from None
    return converted, [result.as_step("fp16_convert"), {"name": "onnx_checker", "changed": False, "records": [{"what": "full check passed"}]}]


def _with_repair_identities(prepared: onnx.ModelProto, original: onnx.ModelProto, keep: dict[str, str]) -> dict[str, str]:
    """An Identity the fp16-before repairs added (detach_consumed_outputs) follows its input's
    producer: kept with it, so a kept node's graph output does not pass through fp16."""
    own = {n.name for g in all_graphs(original.graph) for n in g.node}
    keep = dict(keep)
    for graph in all_graphs(prepared.graph):
        producer = {out: n for n in graph.node for out in n.output}
        for node in graph.node:
            before = producer.get(node.input[0]) if node.op_type == "Identity" and node.input else None
            if node.name not in own and before is not None and before.name in keep:
                keep.setdefault(node.name, f"follows kept '{before.name}'")
    return keep


@dataclass
class FP16Result:
    model: onnx.ModelProto
    steps: list[dict]
    kept: list[KeptNode]  # nodes kept in fp32 (from the converter's errors, a lock or a search)


def convert_with_keeps(model: onnx.ModelProto, extra_block_list: list[str] = (), keep: dict[str, str] | None = None, validate: Callable[[onnx.ModelProto], str | None] | None = None) -> FP16Result:
    """fp16 conversion that keeps `keep` ({node: why}) in fp32, and keeps more nodes when the
    converted graph is invalid (see converter_errors.py). Raises FP16Refused with the reason when it cannot."""
    block_list = sorted(set(SAFE_BLOCK_LIST) | set(extra_block_list))
    # The IR version cap is not run here: the converter keeps its input's IR version, and the
    # build capped that already.
    prepared, steps = run_passes(model, in_stage("fp16-before"), finish=False)
    prepared = topological_sort(prepared).model  # the typing places each cast after its value's producer
    named = name_unnamed_nodes(prepared)
    if named.changed:
        steps.append(named.as_step(name_unnamed_nodes.name))
    # Constants fp16 cannot hold are never clamped: their readers stay fp32 (regions.py).
    node_ops = {n.name: n.op_type for g in all_graphs(named.model.graph) for n in g.node}
    keep = {**{name: why for name, why in unholdable_constants(named.model).items() if node_ops.get(name) not in block_list}, **(keep or {})}
    keep = _with_repair_identities(named.model, model, keep)
    attempt_steps: list[dict] = []  # the latest attempt's: convert_keeping returns the model of its latest attempt

    def attempt(candidate: onnx.ModelProto, kept_nodes: set[str]) -> onnx.ModelProto:
        nonlocal attempt_steps
        converted, attempt_steps = _convert_once(candidate, block_list, kept_nodes)
        return converted

    try:
        converted, kept, records = convert_keeping(named.model, attempt, keep, validate, blocked_ops=set(block_list))
    except KeepFailed as error:
        raise FP16Refused(f"converted model is invalid: {error}") from None
    if records:
        steps.append({"name": "fp16_keep", "changed": True, "records": records})
    return FP16Result(converted, steps + attempt_steps, kept_list(kept, named.model))


def convert_to_fp16(model: onnx.ModelProto, extra_block_list: list[str] = ()) -> tuple[onnx.ModelProto, list[dict]]:
    """Returns (fp16 model, steps). Raises FP16Refused with the reason when it cannot be done."""
    result = convert_with_keeps(model, extra_block_list)
    return result.model, result.steps


def _upcast_tensor(tensor: onnx.TensorProto) -> None:
    if tensor.data_type == TensorProto.FLOAT16:
        array = numpy_helper.to_array(tensor).astype(np.float32)
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _upcast_graph(graph: onnx.GraphProto) -> int:
    changed = 0
    for tensor in graph.initializer:
        changed += tensor.data_type == TensorProto.FLOAT16
        _upcast_tensor(tensor)
    for info in list(graph.value_info) + list(graph.input) + list(graph.output):
        if info.type.tensor_type.elem_type == TensorProto.FLOAT16:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
            changed += 1
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.FLOAT16:
                attribute.i = TensorProto.FLOAT
                changed += 1
            elif attribute.type == onnx.AttributeProto.TENSOR:
                changed += attribute.t.data_type == TensorProto.FLOAT16
                _upcast_tensor(attribute.t)
            elif attribute.type == onnx.AttributeProto.GRAPH:
                changed += _upcast_graph(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                changed += sum(_upcast_graph(g) for g in attribute.graphs)
            elif attribute.name in ("dtype", "to") and attribute.type == onnx.AttributeProto.INT and attribute.i == TensorProto.FLOAT16:
                attribute.i = TensorProto.FLOAT
                changed += 1
    return changed


def _drop_noop_casts(model: onnx.ModelProto) -> int:
    """Remove the converter's casts that became fp32 -> fp32. Left in place they keep the
    converter's names (`*_input_cast_0`), and converting the model again would reuse those names
    and break single assignment (the converter is not idempotent)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    outputs = {o.name for o in model.graph.output}
    producers = {out: node for node in model.graph.node for out in node.output}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    renames: dict[str, str] = {}
    kept = []
    for node in model.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        is_noop = node.op_type == "Cast" and types.get(node.input[0]) == TensorProto.FLOAT and any(a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute)
        if not is_noop:
            kept.append(node)
        elif node.output[0] not in outputs:
            renames[node.output[0]] = node.input[0]
        elif node.input[0] in producers and readers.get(node.input[0]) == 1 and node.input[0] not in outputs:
            # The cast only renamed a result into a graph output: let its producer write the output.
            producer = producers[node.input[0]]
            producer.output[:] = [node.output[0] if name == node.input[0] else name for name in producer.output]
            renames[node.input[0]] = node.output[0]
        else:
            node.op_type = "Identity"
            del node.attribute[:]
            kept.append(node)
    for graph in list(all_graphs(model.graph))[1:]:
        for node in graph.node:
            node.input[:] = [renames.get(name, name) for name in node.input]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return len(renames)


def upcast_to_fp32(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """An fp32 model computed from an fp16 model's weights: the fallback variant (and the host
    reference) for models that ship only as fp16."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    changed = _upcast_graph(model.graph)
    model = topological_sort(model).model
    dropped = _drop_noop_casts(model)
    what = f"{changed} fp16 tensors, types and casts made fp32; {dropped} casts that became fp32 -> fp32 removed"
    return model, {"name": "upcast_fp32", "changed": bool(changed), "records": [{"what": what}]}
