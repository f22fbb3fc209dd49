"""Rank the nodes most likely to need fp32, from one fp32 run that exposes every intermediate.

Per node: the largest |value| among its float outputs (above 65504 is inf in fp16), and, for ops
that sum signed terms, how much smaller its output is than its inputs (`amplification`: an fp16 input rounded by 2^-11 of its
magnitude leaves an error of 2^-11 · amplification relative to the output: `x - mean` on a large
offset, a `Sub` of near-equal values). Accumulating ops (ConvTranspose overlap-add, LSTM/GRU state,
long reductions, CumSum, Pow, ReduceSumSquare) rank ahead of others with the same figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper

from pipeline.cache import temporary_folder
from pipeline.graph.model_io import model_bytes
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model, declared_types, subgraphs
from pipeline.precision.regions import float_constants, why_unholdable

FP16_MAX = 65504.0
FP16_EPS = 2.0**-11  # relative rounding error of fp16
ACCUMULATING_OPS = {
    "ConvTranspose", "LSTM", "GRU", "RNN", "CumSum", "Pow", "ReduceSumSquare", "ReduceSum", "ReduceMean",
    "ReduceL2", "ReduceLogSumExp", "Softmax", "LayerNormalization", "MatMul", "Gemm", "Conv", "Exp", "Sub",
}
# Ops whose output can be much smaller than their inputs by cancellation (sums of signed terms);
# scaling ops (Mul, Div, Sqrt, ...) keep relative precision however small their output.
ADDITIVE_OPS = {
    "Add", "Sub", "Sum", "Mean", "ReduceSum", "ReduceMean", "MatMul", "Gemm", "Conv", "ConvTranspose", "CumSum",
    "LayerNormalization", "InstanceNormalization", "BatchNormalization", "GroupNormalization", "LSTM", "GRU", "RNN", "Einsum",
}
_NOT_CANDIDATES = {"Cast", "Shape", "Size", "Constant", "ConstantOfShape", "Identity"}


@dataclass
class NodeStat:
    node: str
    op: str
    max_abs: float
    amplification: float
    score: float
    why: str

    def as_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "max_abs": _finite(self.max_abs), "amplification": _finite(self.amplification), "score": _finite(self.score), "why": self.why}


def _finite(value: float) -> float:
    return 1e30 if not math.isfinite(value) else float(f"{value:.4g}")


RunOutputs = Callable[[Path, dict[str, np.ndarray]], "dict[str, np.ndarray] | None"]


def nodes_in_order(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs in the order they run: a container's body
    (If branches, Loop/Scan bodies) right before the container, whose outputs come from it."""
    for node in graph.node:
        for sub in subgraphs(node):
            yield from nodes_in_order(sub)
        yield node


def _float_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every value at every graph level (shape inference fills subgraphs too)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types: dict[str, int] = {}
    for graph in all_graphs(inferred.graph):
        types.update(declared_types(graph))
    return types


def _add_body_output(body: onnx.GraphProto, name: str, elem_type: int, fresh: NameMaker) -> None:
    """`name` as one more output of `body`; a value that is an output already goes out through
    an Identity (onnxruntime returned zeros for a second If output of the same name)."""
    if any(value.name == name for value in body.output):
        copy = fresh(f"{name}__copy")
        body.node.append(helper.make_node("Identity", [name], [copy], name=copy))
        name = copy
    body.output.append(helper.make_tensor_value_info(name, elem_type, None))


def _expose(graph: onnx.GraphProto, types: dict[str, int], elem_types: tuple[int, ...], fresh: NameMaker) -> dict[str, str]:
    """{value: the name in `graph` that carries it out} for the float intermediates of `graph` and
    of the subgraphs nested in it. A subgraph's values leave through its container: an If gains
    one output per value of either branch (the branch that does not make it gives an empty tensor, read
    as no value: its nodes did not run), a Loop or Scan one scan output per value of its body (every
    iteration's value, stacked)."""
    found: dict[str, str] = {}
    for node in graph.node:
        for name in node.output:
            if name and types.get(name) in elem_types:
                found[name] = name
        bodies = [a for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        if node.op_type == "If" and len(bodies) == 2:
            inner = [_expose(body.g, types, elem_types, fresh) for body in bodies]
            names = [name for name in {**inner[0], **inner[1]} if name not in found]
            for name in names:
                outer = fresh(f"{name}__exposed")
                for body, carried in zip(bodies, inner):
                    if name in carried:
                        _add_body_output(body.g, carried[name], types[name], fresh)
                    else:
                        missing = fresh(f"{name}__not_run")
                        dtype = helper.tensor_dtype_to_np_dtype(types[name])
                        body.g.node.append(helper.make_node("Constant", [], [missing], value=onnx.numpy_helper.from_array(np.zeros(0, dtype)), name=missing))
                        body.g.output.append(helper.make_tensor_value_info(missing, types[name], None))
                node.output.append(outer)
                found[name] = outer
        elif node.op_type in ("Loop", "Scan") and len(bodies) == 1:
            for name, carried in _expose(bodies[0].g, types, elem_types, fresh).items():
                if name in found:
                    continue
                outer = fresh(f"{name}__exposed")
                _add_body_output(bodies[0].g, carried, types[name], fresh)
                node.output.append(outer)
                for attribute in node.attribute:  # Scan's per-output lists, when given, cover the new output too
                    if attribute.name in ("scan_output_axes", "scan_output_directions"):
                        attribute.ints.append(0)
                found[name] = outer
    return found


def exposed_model(model: onnx.ModelProto, elem_types: tuple[int, ...] = (TensorProto.FLOAT,), subgraph_values: bool = True) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The model with every intermediate of `elem_types` (default: float32) added as a graph
    output, and {value: the graph output that carries it}. Values inside If branches and Loop/Scan
    bodies come out through their containers (`_expose`), unless `subgraph_values` is False."""
    exposed = copy_model(model)
    types = _float_types(exposed)
    present = {o.name for o in exposed.graph.output}
    added = {}
    if subgraph_values:
        carried = _expose(exposed.graph, types, elem_types, NameMaker(exposed.graph))
    else:
        carried = {name: name for node in exposed.graph.node for name in node.output if name and types.get(name) in elem_types}
    for name, output in carried.items():
        if output not in present:
            exposed.graph.output.append(helper.make_tensor_value_info(output, types[name], None))
            present.add(output)
        added[name] = output
    return exposed, added


def _run_exposed(model: onnx.ModelProto, feeds: dict[str, np.ndarray], run: RunOutputs, elem_types: tuple[int, ...] = (TensorProto.FLOAT,)) -> dict[str, np.ndarray] | None:
    """Every float intermediate's value, by its own name, from one run of `run` on the exposed
    model; where exposing subgraph values makes a model the runtime refuses (a Loop whose body
    values change shape between iterations cannot stack them), the main graph's values alone."""
    for subgraph_values in (True, False):
        exposed, carried = exposed_model(model, elem_types, subgraph_values)
        with temporary_folder("pack-rank-") as tmp:
            path = Path(tmp) / "exposed.onnx"
            path.write_bytes(model_bytes(exposed))
            outputs = run(path, feeds)
        if outputs is not None:
            # empty: a value of the If branch that did not run (or one with no element to judge)
            return {name: outputs[output] for name, output in carried.items() if output in outputs and np.asarray(outputs[output]).size}
        if not any(subgraphs(node) for node in model.graph.node):
            return None
    return None


def _clamped_constants(model: onnx.ModelProto) -> dict[str, str]:
    """{constant: why} for fp32 constants fp16 cannot hold (regions.py; their readers are kept in
    fp32 before any search, so this only ranks what a recipe's block list left out)."""
    found = {}
    for graph in all_graphs(model.graph):
        for name, array in float_constants(graph).items():
            why = why_unholdable(name, array)
            if why:
                found[name] = why
    return found


def _max_abs(value: np.ndarray) -> float:
    finite = np.abs(value[np.isfinite(value)]) if value.size else np.zeros(0)
    return float(finite.max()) if finite.size else 0.0



def rank_nodes(model: onnx.ModelProto, feeds: dict[str, np.ndarray], run_outputs: RunOutputs, blocked_ops: set[str] = frozenset()) -> list[NodeStat]:
    """Nodes with float outputs, in the main graph and in If/Loop/Scan bodies, most likely to need
    fp32 first, from one run of `run_outputs` (the build passes the host's child-process runner)."""
    outputs = _run_exposed(model, feeds, run_outputs)
    if outputs is None:
        return []
    values = dict(outputs)
    values.update({k: v for k, v in feeds.items() if np.asarray(v).dtype.kind == "f"})
    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_type == TensorProto.FLOAT:
                values[tensor.name] = onnx.numpy_helper.to_array(tensor)
    nodes = list(nodes_in_order(model.graph))
    clamped = _clamped_constants(model)
    peaks = {name: _max_abs(np.asarray(value, dtype=np.float64)) for name, value in values.items() if np.asarray(value).dtype.kind == "f"}
    stats = []
    for index, node in enumerate(nodes):
        if node.op_type in _NOT_CANDIDATES or node.op_type in blocked_ops or not node.name:
            continue
        outs = [peaks[name] for name in node.output if name in peaks]
        in_peak = max((peaks[name] for name in node.input if name in peaks), default=0.0)
        if not outs and is_discrete(node) and any(name in peaks for name in node.input):
            outs = [in_peak]  # a comparison of floats: kept fp32, it compares fp32 values
        if not outs:
            continue
        out_peak = max(outs)
        if node.op_type in ADDITIVE_OPS:
            amplification = in_peak / out_peak if out_peak > 0 else (math.inf if in_peak > 0 else 1.0)
        else:
            amplification = 1.0
        accumulating = node.op_type in ACCUMULATING_OPS
        clamps = [clamped[name] for name in node.input if name in clamped]
        if out_peak > FP16_MAX or in_peak > FP16_MAX:
            score, why = 1e6 + out_peak, f"values up to {max(out_peak, in_peak):.4g} exceed the fp16 range (65504)"
        elif clamps:
            score, why = 1e5, clamps[0]
        else:
            loss = FP16_EPS * max(amplification, 1.0)
            score = loss * (4.0 if accumulating else 1.0)
            if amplification >= 8:
                why = f"output {amplification:.3g}x smaller than its inputs: fp16 keeps ~{min(loss, 1.0):.2g} relative precision"
            elif accumulating:
                why = f"{node.op_type} accumulates (fp16 error grows with its length)"
            else:
                why = f"max |x| {out_peak:.3g}"
        stats.append(NodeStat(node.name, node.op_type, out_peak, amplification, score - index * 1e-12, why))
    # A cancellation is only as exact as its inputs: the nodes that make them rank right after it
    # (`Sub(Add(x, 2000), 2000)` needs the Add in fp32 as much as the Sub).
    by_name = {stat.node: stat for stat in stats}
    producer = {out: node.name for node in nodes for out in node.output}
    for stat in sorted(stats, key=lambda s: -s.score):
        if stat.amplification >= 8 and stat.score < 1e6:
            node = next(n for n in nodes if n.name == stat.node)
            for name in node.input:
                parent = by_name.get(producer.get(name, ""))
                if parent is not None and parent.score < stat.score * 0.999:
                    parent.score = stat.score * 0.999
                    parent.why = f"feeds the cancellation in '{stat.node}' ({stat.why})"
    _rank_discrete_inputs(nodes, by_name, producer)
    stats.sort(key=lambda stat: -stat.score)
    return stats


# Ops whose output jumps by a whole step when their float input crosses a boundary: fp16 rounding
# of the input flips them (a duration predictor's Ceil, an ArgMax over near-equal scores).
DISCRETE_OPS = {"Ceil", "Floor", "Round", "ArgMax", "ArgMin", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal", "Sign"}
_DISCRETE_SCORE = 5e5  # below an overflow (1e6+), above everything else
_UPSTREAM_DEPTH = 6


def is_discrete(node: onnx.NodeProto) -> bool:
    if node.op_type == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)
    return node.op_type in DISCRETE_OPS


def _rank_discrete_inputs(all_nodes: list[onnx.NodeProto], by_name: dict[str, NodeStat], producer: dict[str, str]) -> None:
    """The fp32 producers of a discrete op rank first (after overflows), its input subgraph right
    after them, nearest first: keeping them is what stops the flip."""
    nodes = {node.name: node for node in all_nodes}
    for node in all_nodes:
        if not is_discrete(node):
            continue
        own = by_name.get(node.name)  # the discrete op itself, where it reads floats
        if own is not None and own.score < _DISCRETE_SCORE:
            own.score = _DISCRETE_SCORE
            own.why = f"discrete {node.op_type}: an fp16 rounding of its float input flips it by a whole step"
        frontier = [producer.get(name) for name in node.input if producer.get(name)]
        for depth in range(_UPSTREAM_DEPTH):
            upstream = []
            for name in frontier:
                stat = by_name.get(name)
                score = _DISCRETE_SCORE / (2**depth)
                if stat is not None and stat.score < score:
                    stat.score = score
                    stat.why = f"feeds the discrete {node.op_type} '{node.name}'" + (" directly" if depth == 0 else f" ({depth} nodes up)") + ": an fp16 rounding of its input flips it by a whole step"
                if name in nodes:
                    upstream += [producer[i] for i in nodes[name].input if i in producer]
            frontier = upstream


def _error_of_range(reference: np.ndarray, value: np.ndarray) -> float:
    """max |value - reference| as a share of the reference's largest |x|; inf where the fp16 value
    is NaN or Inf and the reference is finite."""
    reference, value = np.asarray(reference, np.float64), np.asarray(value, np.float64)
    if reference.shape != value.shape:
        return 0.0
    finite = np.isfinite(reference)
    if np.any(finite & ~np.isfinite(value)):
        return math.inf
    if not finite.any():
        return 0.0
    scale = float(np.abs(reference[finite]).max()) or 1.0
    return float(np.abs(value[finite] - reference[finite]).max()) / scale


DIVERGENCE_FLOOR = 1e-3  # error a node adds, as a share of its output's range, below which it is not ranked by divergence


def divergent_nodes(model: onnx.ModelProto, candidate: onnx.ModelProto, feeds: dict[str, np.ndarray], run_reference: RunOutputs, run_candidate: RunOutputs, blocked_ops: set[str] = frozenset()) -> list[NodeStat]:
    """The nodes of `model` (subgraphs' included) whose fp16 output in `candidate`, run where the candidate
    fails (`run_candidate`: the WebGPU kernels, say), adds the most error to the fp32 intermediates
    (`run_reference`), most first: the error of its output (NaN or Inf where fp32 is finite: infinite)
    less the largest error of its inputs, so the node where the error starts ranks above the nodes
    it flows through. Nodes adding less than DIVERGENCE_FLOOR are left out."""
    reference = _run_exposed(model, feeds, run_reference)
    values = _run_exposed(candidate, feeds, run_candidate, (TensorProto.FLOAT, TensorProto.FLOAT16)) if reference is not None else None
    if reference is None or values is None:
        return []
    error: dict[str, float] = {}
    stats = []
    for index, node in enumerate(nodes_in_order(model.graph)):
        error.update({name: _error_of_range(reference[name], values[name]) for name in node.output if name in reference and name in values})
        errors = [error[name] for name in node.output if name in error]
        if not errors:
            continue
        added = max(errors) - max((error.get(name, 0.0) for name in node.input), default=0.0)
        if node.op_type in _NOT_CANDIDATES or node.op_type in blocked_ops or not node.name or not added >= DIVERGENCE_FLOOR:
            continue
        why = "its fp16 output turns NaN or Inf where fp32 is finite" if math.isinf(max(errors)) else f"its fp16 output adds {added:.3g} of its range to its inputs' error"
        stats.append(NodeStat(node.name, node.op_type, _max_abs(np.asarray(reference[node.output[0]], np.float64)) if node.output[0] in reference else 0.0, 1.0, (1e7 if math.isinf(added) else 1e6 * added) - index * 1e-12, why))
    stats.sort(key=lambda stat: -stat.score)
    return stats
