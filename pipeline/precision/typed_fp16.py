"""fp16 conversion by construction: every tensor has the type of the region that makes it.

Each node of the source model prefers fp16 or fp32: fp32 when it is kept (the block list, nodes kept
by the converter's errors, a search or a lock, known WebGPU hazards) or has no standard schema (a
custom domain), fp16 otherwise. Each input and output slot then takes a type from that preference
and the op's schema at the model's opset: fp16 where the node prefers fp16 and the slot's type
constraint admits float16, float32 otherwise (so Range, which has no fp16 before opset 27, computes
in fp32 whatever it is next to, and Resize's `scales` stay float32 by their fixed type). A Cast is
inserted only on an edge whose two ends want different types, right after the value's producer
(before every reader, in the producer's graph, so readers inside If/Loop branches see it too).

Values that can be made in either precision at no cost take the precision of their readers, one
copy per precision that some reader needs: initializers, `Constant`s, `ConstantOfShape` of a float
value, and `Cast(to=FLOAT)` of a non-float tensor (`Range(0, Cast(Gather(Shape(x))), 1)` in an fp16
region reads an exact fp32 limit, no fp16 round trip). Their fp32 copies are the source's exact
values; fp16 copies are rounded with onnxconverter-common's `convert_np_to_float16`, whose clamping
warnings are returned (constants fp16 cannot hold keep their readers in fp32 before this runs:
regions.py). Graph inputs and outputs keep their declared types (fp32 I/O); If branches and
Loop/Scan bodies carry their float values in the container's precision.

The converter's graph surgery (casts added per blocked node and per reader, Cast retargeting,
constants cast up, round trips through fp16 between fp32 nodes, casts placed after their readers in
inlined branches) is exactly what broke on graphs other exporters make: this module does the
typing in one pass and never needs to repair it afterwards.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common.float16 import convert_np_to_float16

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model, declared_types, main_opset, subgraphs

FLOAT, HALF = TensorProto.FLOAT, TensorProto.FLOAT16
_STANDARD_DOMAINS = ("", "ai.onnx")
# Ops whose float output type is set by an attribute, not by their inputs' types.
_DTYPE_ATTRIBUTE_OPS = {"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli"}
_CONTAINERS = {"If", "Loop", "Scan"}
# Readers that accept a float input of either precision as it is (they read its type or shape).
_ANY_TYPE_READERS = {"Cast", "Shape", "Size"}


@dataclass
class Rounding:
    """How fp16 copies of float constants are rounded (onnxconverter-common's clamps)."""

    max_finite: float
    min_positive: float
    warnings: list[str] = field(default_factory=list)

    def half(self, array: np.ndarray) -> np.ndarray:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            values = np.asarray(array, np.float32)
            rounded = convert_np_to_float16(np.atleast_1d(values), min_positive_val=self.min_positive, max_finite_val=self.max_finite)
        self.warnings += [str(w.message).splitlines()[0][:200] for w in caught]
        return np.asarray(rounded, np.float16).reshape(values.shape)


@functools.cache
def _half_slots(op_type: str, domain: str, opset: int) -> tuple[tuple[bool, ...], tuple[bool, ...]] | None:
    """Per formal input and output of the op's schema at `opset`, whether it may hold float16; None
    for an op with no standard schema there (no typing rule: kept fp32)."""
    if domain not in _STANDARD_DOMAINS:
        return None
    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # noqa: BLE001 - an op unknown at this opset
        return None
    constraints = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}

    def half(formal) -> bool:
        return any("float16" in t and "bfloat16" not in t for t in constraints.get(formal.type_str, [formal.type_str]))

    return tuple(map(half, schema.inputs)), tuple(map(half, schema.outputs))


def _slot_allows_half(formals: tuple[bool, ...], index: int) -> bool:
    """Whether slot `index` may hold float16 (a variadic last formal covers the slots past it)."""
    return bool(formals) and formals[min(index, len(formals) - 1)]


def _source_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every value at every graph level of the (valid, fp32) source model."""
    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - declarations below still count
        inferred = model
    for source in (inferred, model):
        for graph in all_graphs(source.graph):
            types.update(declared_types(graph))
    return types


def _float_value(node: onnx.NodeProto) -> np.ndarray | None:
    """A Constant's or ConstantOfShape's float32 value, else None."""
    if node.op_type == "ConstantOfShape" and not node.attribute:
        return np.zeros(1, np.float32)  # its default value: float32 zero
    for attribute in node.attribute:
        if attribute.name == "value" and attribute.t.data_type == FLOAT:
            return numpy_helper.to_array(attribute.t)
        if node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            return np.array(helper.get_attribute_value(attribute), dtype=np.float32)
    return None


def _is_free_source(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """A node whose float output costs nothing to make in either precision."""
    if node.op_type in ("Constant", "ConstantOfShape") and node.domain in _STANDARD_DOMAINS:
        return _float_value(node) is not None
    if node.op_type == "Cast" and node.domain in _STANDARD_DOMAINS:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        return to == FLOAT and types.get(node.input[0]) not in (FLOAT, HALF, TensorProto.DOUBLE, TensorProto.BFLOAT16, None)
    return False


class _Typing:
    """The typing plan of one model: each float value's type where it is made, and which types
    its readers want."""

    def __init__(self, model: onnx.ModelProto, fp32_nodes: set[str], block_ops: set[str]):
        self.opset = main_opset(model)
        self.types = _source_types(model)
        self.fp32_nodes, self.block_ops = fp32_nodes, block_ops
        self.made: dict[str, int] = {}  # float value -> type it is made in (free sources: absent)
        self.free: set[str] = set()  # free sources' float outputs and float initializers
        self.wanted: dict[str, set[int]] = {}  # float value -> types its readers (and graph outputs) want
        self.required: dict[str, int] = {}  # graph output -> the type its graph must give it
        self.region: dict[str, int] = {}  # node name -> HALF or FLOAT
        self._plan_graph(model.graph, top=True, carried=None)

    def prefers(self, node: onnx.NodeProto) -> int:
        if node.name in self.fp32_nodes or node.op_type in self.block_ops or _half_slots(node.op_type, node.domain, self.opset) is None:
            return FLOAT
        return HALF

    def is_float(self, name: str) -> bool:
        return bool(name) and self.types.get(name) == FLOAT

    def _want(self, name: str, elem: int) -> None:
        self.wanted.setdefault(name, set()).add(elem)

    def slot_type(self, node: onnx.NodeProto, index: int, output: bool) -> int:
        region = self.region[node.name]
        if region == FLOAT:
            return FLOAT
        inputs, outputs = _half_slots(node.op_type, node.domain, self.opset)
        return HALF if _slot_allows_half(outputs if output else inputs, index) else FLOAT

    def _plan_graph(self, graph: onnx.GraphProto, top: bool, carried: int | None) -> None:
        """`carried`: the container's precision for a subgraph's float inputs and outputs."""
        for value in graph.input:
            if self.is_float(value.name):
                self.made[value.name] = FLOAT if top else carried
        for tensor in graph.initializer:
            if tensor.data_type == FLOAT and tensor.name not in self.made:  # an initializer that is also an input keeps its declared type
                self.free.add(tensor.name)
        for node in graph.node:
            self.region[node.name] = self.prefers(node)
            if _is_free_source(node, self.types):
                self.free.add(node.output[0])
                continue
            container = node.op_type in _CONTAINERS and node.domain in _STANDARD_DOMAINS
            for index, name in enumerate(node.input):
                if self.is_float(name) and node.op_type not in _ANY_TYPE_READERS:
                    self._want(name, self.region[node.name] if container else self.slot_type(node, index, output=False))
            for index, name in enumerate(node.output):
                if self.is_float(name):
                    self.made[name] = self.region[node.name] if container else self.slot_type(node, index, output=True)
            for sub in subgraphs(node):
                self._plan_graph(sub, top=False, carried=self.region[node.name])
        for value in graph.output:
            if self.is_float(value.name):
                self.required[value.name] = FLOAT if top else carried
                self._want(value.name, self.required[value.name])


def _set_output_type(node: onnx.NodeProto, elem: int, rounding: Rounding) -> None:
    """Make an attribute-typed node produce `elem` (FLOAT or FLOAT16) for its float output."""
    if node.op_type == "ConstantOfShape" and not node.attribute:
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float32))))
    for attribute in node.attribute:
        if node.op_type == "Cast" and attribute.name == "to" and attribute.i in (FLOAT, HALF):
            attribute.i = elem
        elif node.op_type in _DTYPE_ATTRIBUTE_OPS and attribute.name == "dtype" and attribute.i in (FLOAT, HALF):
            attribute.i = elem
        elif node.op_type in ("Constant", "ConstantOfShape") and attribute.name == "value" and attribute.t.data_type in (FLOAT, HALF):
            array = numpy_helper.to_array(attribute.t).astype(np.float32)
            attribute.t.CopyFrom(numpy_helper.from_array(rounding.half(array) if elem == HALF else array, attribute.t.name))
        elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            array = np.array(helper.get_attribute_value(attribute), dtype=np.float32)
            value = numpy_helper.from_array(rounding.half(array) if elem == HALF else array)
            attribute.CopyFrom(helper.make_attribute("value", value))


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, plan: _Typing, rounding: Rounding):
        self.plan, self.rounding = plan, rounding
        self.fresh = NameMaker(model.graph)
        self.names: dict[tuple[str, int], str] = {}  # (value, type) -> the name that holds it
        self.casts = 0
        self.copies = 0

    def primary(self, name: str) -> int:
        """The type the value's own name holds."""
        plan = self.plan
        if name in plan.required:
            return plan.required[name]
        if name in plan.free:
            wanted = plan.wanted.get(name, {FLOAT})
            return FLOAT if FLOAT in wanted or not wanted else HALF
        return plan.made[name]

    def _others(self, name: str) -> list[int]:
        """The types a free value is wanted in besides the one its own name holds."""
        return sorted(self.plan.wanted.get(name, set()) - {self.primary(name)})

    def _alias(self, name: str, elem: int) -> str:
        alias = self.fresh(f"{name}__{'fp16' if elem == HALF else 'fp32'}")
        self.names[(name, elem)] = alias
        return alias

    def name_for(self, name: str, elem: int) -> str:
        return self.names.get((name, elem), name)

    def _cast(self, source: str, target: str, elem: int) -> onnx.NodeProto:
        self.casts += 1
        return helper.make_node("Cast", [source], [target], to=elem, name=self.fresh(f"{target}__cast"))

    def _after_value(self, name: str, made_as: str, made: int) -> list[onnx.NodeProto]:
        """Casts from the name that holds `made` to every other type the value is wanted in."""
        primary = self.primary(name)
        nodes = []
        for elem in sorted((self.plan.wanted.get(name, set()) | {primary}) - {made}):
            target = name if elem == primary else self.names.get((name, elem)) or self._alias(name, elem)
            nodes.append(self._cast(made_as, target, elem))
        return nodes

    def graph(self, graph: onnx.GraphProto, top: bool) -> None:
        plan = self.plan
        head: list[onnx.NodeProto] = []
        for value in graph.input:
            if plan.is_float(value.name):
                if not top:
                    value.type.tensor_type.elem_type = plan.made[value.name]
                head += self._after_value(value.name, value.name, plan.made[value.name])
        extra: list[onnx.TensorProto] = []
        for tensor in graph.initializer:
            if tensor.name not in plan.free:
                continue
            exact = numpy_helper.to_array(tensor).astype(np.float32)
            primary = self.primary(tensor.name)
            tensor.CopyFrom(numpy_helper.from_array(self.rounding.half(exact) if primary == HALF else exact, tensor.name))
            for elem in self._others(tensor.name):
                extra.append(numpy_helper.from_array(self.rounding.half(exact) if elem == HALF else exact, self._alias(tensor.name, elem)))
                self.copies += 1
        graph.initializer.extend(extra)
        # Names first: a node's readers in nested graphs resolve aliases made here.
        nodes: list[onnx.NodeProto] = list(head)
        for node in graph.node:
            nodes += self._node(node)
        del graph.node[:]
        graph.node.extend(nodes)
        for value in graph.output:
            if plan.is_float(value.name):
                value.type.tensor_type.elem_type = plan.required[value.name]

    def _node(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        plan = self.plan
        if node.output and node.output[0] in plan.free:
            return self._free_source(node)
        container = node.op_type in _CONTAINERS and node.domain in _STANDARD_DOMAINS
        for index, name in enumerate(node.input):
            if plan.is_float(name) and node.op_type not in _ANY_TYPE_READERS:
                want = plan.region[node.name] if container else plan.slot_type(node, index, output=False)
                node.input[index] = self.name_for(name, want)
        after: list[onnx.NodeProto] = []
        for index, name in enumerate(node.output):
            if not plan.is_float(name):
                continue
            made = plan.made[name]
            if node.op_type == "Cast" or node.op_type in _DTYPE_ATTRIBUTE_OPS:
                _set_output_type(node, made, self.rounding)
            made_as = name
            if self.primary(name) != made:  # a graph output of another type: the node writes an alias
                made_as = self.names.get((name, made)) or self._alias(name, made)
                node.output[index] = made_as
            after += self._after_value(name, made_as, made)
        for sub in subgraphs(node):
            self.graph(sub, top=False)
        return [node, *after]

    def _free_source(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        name = node.output[0]
        primary = self.primary(name)
        _set_output_type(node, primary, self.rounding)
        nodes = [node]
        for elem in self._others(name):
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = self.fresh(f"{node.name}__{'fp16' if elem == HALF else 'fp32'}")
            copy.output[0] = self._alias(name, elem)
            _set_output_type(copy, elem, self.rounding)
            nodes.append(copy)
            self.copies += 1
        return nodes


def _retype_value_info(model: onnx.ModelProto, plan: _Typing, rewriter: _Rewriter) -> None:
    """Declared types follow the type each value's own name now holds."""
    for graph in all_graphs(model.graph):
        for info in graph.value_info:
            if plan.is_float(info.name) and (info.name in plan.made or info.name in plan.free):
                info.type.tensor_type.elem_type = rewriter.primary(info.name)


def convert_by_regions(model: onnx.ModelProto, fp32_nodes: set[str], block_ops: set[str], max_finite: float, min_positive: float) -> tuple[PassResult, list[str]]:
    """(the fp16 model, the rounding warnings). Nodes need unique names (converter_errors.name_unnamed_nodes).
    Never mutates its input."""
    plan = _Typing(model, set(fp32_nodes), set(block_ops))
    converted = copy_model(model)
    rounding = Rounding(max_finite, min_positive)
    rewriter = _Rewriter(converted, plan, rounding)
    rewriter.graph(converted.graph, top=True)
    _retype_value_info(converted, plan, rewriter)
    half = sum(1 for region in plan.region.values() if region == HALF)
    record = {"what": f"{half} of {len(plan.region)} nodes in fp16; {rewriter.casts} casts on edges between fp16 and fp32 regions, {rewriter.copies} constants made in both precisions"}
    return PassResult(converted, True, [record]), sorted(set(rounding.warnings))
