"""What the graph shows about its outputs where the recipe says nothing: the kinds an app decides
from (pipeline/recipe.py OUTPUT_KINDS) and the parts of an output that stacks quantities.

Only what the graph shows for certain, each with where it came from (`OutputSpec.found`):
- an output made by Softmax is probabilities over its axis, by LogSoftmax logits over its axis;
- an output that an ArgMax or TopK also reads is logits over that node's axis (probabilities when
  a Softmax made it);
- an output made by a Concat of a score (a Sigmoid or Softmax output) and something else, with
  static sizes along the Concat's axis, is read in parts, one per input (a YOLO head's boxes and
  scores), each normalised by its own range.
Identity, Cast and Transpose between the node and the output are followed (a Transpose moves the
axis). A detection kind, a CTC blank or a mask threshold is never guessed: the score threshold, box
layout and blank index are the app's, so the recipe declares them.
"""

from __future__ import annotations

import onnx

from pipeline.graph.passes.util import dims_of
from pipeline.recipe import KIND_KEYS, OutputSpec, Recipe

PASS_THROUGH = ("Identity", "Cast")
SCORE_OPS = ("Sigmoid", "Softmax")


def _opset(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 13)


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _dims(model: onnx.ModelProto) -> dict[str, list]:
    """The dims (None where unknown) of every value shape inference can tell, the graph's own
    declarations where it cannot run."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model inference cannot follow: use what the graph declares
        inferred = model
    return {v.name: dims for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input] if (dims := dims_of(v)) is not None}


# the axis attribute's default per op (Softmax and LogSoftmax: 1 before opset 13, where they flatten)
DEFAULT_AXIS = {"ArgMax": 0, "TopK": -1, "Softmax": -1, "LogSoftmax": -1}


def _class_axis(node: onnx.NodeProto, rank: int | None, opset: int) -> int | None:
    """The axis a Softmax/LogSoftmax/ArgMax/TopK works along, non-negative; None where it cannot be
    told (no rank, or a pre-13 softmax over several flattened axes)."""
    old_softmax = node.op_type in ("Softmax", "LogSoftmax") and opset < 13
    axis = _attribute(node, "axis", 1 if old_softmax else DEFAULT_AXIS[node.op_type])
    if rank is None:
        return None
    axis = axis % rank
    if old_softmax and axis != rank - 1:
        return None
    return axis


def read_output_kinds(model: onnx.ModelProto) -> dict[str, OutputSpec]:
    """{output: what the graph shows of it} for the outputs it shows something of."""
    producers = {out: node for node in model.graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    dims, opset = _dims(model), _opset(model)
    ranks = {name: len(value) for name, value in dims.items()}
    found: dict[str, OutputSpec] = {}
    for output in model.graph.output:
        # walk back to the node that made it, through ops that keep its values (and a Transpose's axes)
        name, perm = output.name, None
        node = producers.get(name)
        while node is not None and (node.op_type in PASS_THROUGH or node.op_type == "Transpose"):
            if node.op_type == "Transpose":
                order = list(_attribute(node, "perm", []))
                if not order:
                    break
                perm = order if perm is None else [order[i] for i in perm]
            node = producers.get(node.input[0])
        moved = (lambda axis: perm.index(axis)) if perm else (lambda axis: axis)  # noqa: E731
        rank = ranks.get(output.name)
        spec = None
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            axis = _class_axis(node, ranks.get(node.output[0]), opset)
            if axis is not None:
                kind = "probabilities" if node.op_type == "Softmax" else "logits"
                spec = OutputSpec(kind=kind, options={**KIND_KEYS[kind], "axis": moved(axis)}, found=f"graph: {node.op_type} node '{node.name}' makes it (axis {moved(axis)})")
        reader = next((r for r in readers.get(output.name, []) if r.op_type in ("ArgMax", "TopK")), None)
        if spec is None and reader is not None:
            axis = _class_axis(reader, rank, opset)
            if axis is not None:
                spec = OutputSpec(kind="logits", options={**KIND_KEYS["logits"], "axis": axis}, found=f"graph: {reader.op_type} node '{reader.name}' reads it (axis {axis})")
        if spec is None and node is not None and node.op_type == "Concat" and perm is None:
            spec = _stacked(node, producers, dims, ranks.get(node.output[0]))
        if spec is not None:
            found[output.name] = spec
    return found


def _stacked(concat: onnx.NodeProto, producers: dict[str, onnx.NodeProto], dims: dict[str, list], rank: int | None) -> OutputSpec | None:
    """A tensor in parts when `concat` joins a score and something else with static sizes."""
    if rank is None or len(concat.input) < 2:
        return None
    axis = _attribute(concat, "axis", 0) % rank
    sizes = [dims.get(name, [None] * rank)[axis] if len(dims.get(name, [])) == rank else None for name in concat.input]
    scores = [producers[name].op_type in SCORE_OPS if name in producers else False for name in concat.input]
    if any(not isinstance(size, int) or size <= 0 for size in sizes) or all(scores) or not any(scores):
        return None
    parts, start = [], 0
    for size in sizes:
        parts.append([start, start + size])
        start += size
    return OutputSpec(kind="tensor", options={"axis": axis}, parts=parts,
                      found=f"graph: Concat node '{concat.name}' stacks scores ({', '.join(n for n, s in zip(concat.input, scores) if s)}) beside other values along axis {axis}")


def with_graph_kinds(model: onnx.ModelProto, recipe: Recipe) -> None:
    """Fills `recipe.outputs` with what the graph shows of the outputs the recipe does not declare,
    and the parts of a declared plain tensor that stacks quantities. The recipe's word wins."""
    for name, seen in read_output_kinds(model).items():
        declared = recipe.outputs.get(name)
        if declared is None:
            recipe.outputs[name] = seen
        elif declared.kind == "tensor" and declared.parts is None and seen.parts is not None:
            declared.parts, declared.options, declared.found = seen.parts, {**declared.options, "axis": seen.options["axis"]}, seen.found
