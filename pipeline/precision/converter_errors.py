"""Converter failures become node decisions: nodes kept in fp32 instead of a refused fp16 variant.

When the converted graph fails onnx.checker / shape inference, or onnxruntime refuses it, the error
names nodes (`node name: X`, `Node (X)`) and tensors (`'t'`, `output arg (t)`). Those nodes, the
producers and readers of those tensors, and their type neighbourhood (other readers of an fp32
constant the converter left beside a converted tensor, the nodes with mixed fp16/fp32 inputs inside
a named If/Loop/Scan) are kept in fp32 (onnxconverter-common's `node_block_list` inserts the casts)
and the conversion is retried, a bounded number of times.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Callable

import onnx
from onnx import TensorProto

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model, declared_types, subgraphs

MAX_ROUNDS = 8
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)


@dataclass(frozen=True)
class KeptNode:
    node: str
    op: str
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


class NameUnnamedNodes:
    """Give every node a unique name: `node_block_list` and the converter's own cast names need one
    (two unnamed readers of an input get the same cast name and break single assignment)."""

    name = "name_unnamed_nodes"

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        return _name_nodes(model)


def _name_nodes(model: onnx.ModelProto) -> PassResult:
    seen: set[str] = set()
    needs = False
    for graph in all_graphs(model.graph):
        for node in graph.node:
            needs |= not node.name or node.name in seen
            seen.add(node.name)
    if not needs:
        return PassResult(model, False)
    model = copy_model(model)
    fresh = NameMaker(model.graph)
    count = 0
    seen = set()
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if not node.name or node.name in seen:
                node.name = fresh(f"{node.op_type}_{count}")
                count += 1
            seen.add(node.name)
    return PassResult(model, True, [{"what": f"named {count} unnamed or duplicate-named nodes"}])


name_unnamed_nodes = NameUnnamedNodes()


def mixed_float_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes (any graph level) that read both fp16 and fp32 tensors: what the checker rejects."""
    found: list[str] = []

    def walk(graph: onnx.GraphProto, outer: dict[str, int]) -> None:
        types = declared_types(graph, outer)
        for node in graph.node:
            kinds = {types.get(name) for name in node.input if name} & set(_FLOATS)
            if len(kinds) > 1 and node.op_type != "Cast":
                found.append(node.name)
            for sub in subgraphs(node):
                walk(sub, types)

    walk(model.graph, {})
    return found


_NODE_PATTERNS = (
    re.compile(r"node name: ([^)\s][^)]*)\)"),
    re.compile(r"Name:\s*'([^']+)'"),  # onnxruntime at run time: "running Slice node. Name:'Slice_0'"
    re.compile(r"Node \(([^)]+)\)"),
    re.compile(r"of node \(([^)]+)\)"),
    re.compile(r"Node:\s*([^\s,]+)"),
    re.compile(r"node:\s*\n?\s*name:\s*(\S+)"),
)
_TENSOR_PATTERNS = (re.compile(r"'([^']+)'"), re.compile(r"(?:output|input) arg \(([^)]+)\)"))


def _index(model: onnx.ModelProto) -> tuple[dict[str, onnx.NodeProto], dict[str, list[onnx.NodeProto]], dict[str, onnx.NodeProto]]:
    """(nodes by name, readers by tensor, producer by tensor) over every graph level."""
    by_name: dict[str, onnx.NodeProto] = {}
    readers: dict[str, list[onnx.NodeProto]] = {}
    producer: dict[str, onnx.NodeProto] = {}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            by_name[node.name] = node
            for name in node.input:
                readers.setdefault(name, []).append(node)
            for name in node.output:
                producer[name] = node
    return by_name, readers, producer


def _through_casts(node: onnx.NodeProto, readers: dict, producer: dict, source_names: set[str], upstream: bool) -> list[onnx.NodeProto]:
    """A converter-made Cast stands for the source node on its other side."""
    if node.name in source_names:
        return [node]
    if node.op_type != "Cast":
        return []
    if upstream:
        before = producer.get(node.input[0])
        return _through_casts(before, readers, producer, source_names, True) if before is not None else []
    found = []
    for reader in readers.get(node.output[0], []):
        found += _through_casts(reader, readers, producer, source_names, False)
    return found


def offending_nodes(error: str, converted: onnx.ModelProto | None, source: onnx.ModelProto, blocked_ops: set[str] = frozenset()) -> dict[str, str]:
    """{source node name: why} for the nodes an fp16 error points at, with their type neighbourhood.
    Nodes of `blocked_ops` are fp32 already and never returned: when the error names one, the nodes
    that make its inputs are kept instead (an fp16 value reached it)."""
    source_nodes, source_readers, source_producer = _index(source)
    names = set(source_nodes)
    first_line = error.strip().splitlines()[0][:160] if error.strip() else "fp16 conversion failed"
    found: dict[str, str] = {}

    def add(name: str, why: str) -> None:
        if name in names and name not in found and source_nodes[name].op_type not in blocked_ops:
            found[name] = why

    for pattern in _NODE_PATTERNS:
        for name in pattern.findall(error):
            name = name.strip()
            add(name, f"named by the fp16 error: {first_line}")
            if name in names and source_nodes[name].op_type in blocked_ops:
                for tensor in source_nodes[name].input:
                    if tensor in source_producer:
                        add(source_producer[tensor].name, f"feeds the fp32 node '{name}' named by the fp16 error: {first_line}")
    if converted is not None:
        nodes, readers, producer = _index(converted)
        for pattern in _TENSOR_PATTERNS:
            for tensor in pattern.findall(error):
                if tensor in nodes:
                    for node in _through_casts(nodes[tensor], readers, producer, names, True) + _through_casts(nodes[tensor], readers, producer, names, False):
                        add(node.name, f"named by the fp16 error: {first_line}")
                for node in readers.get(tensor, []):
                    for hit in _through_casts(node, readers, producer, names, False):
                        add(hit.name, f"reads '{tensor}' named by the fp16 error")
                if tensor in producer:
                    for hit in _through_casts(producer[tensor], readers, producer, names, True):
                        add(hit.name, f"makes '{tensor}' named by the fp16 error")
        # A named If/Loop/Scan: its inner nodes that mix fp16 and fp32 are the real offenders.
        mixed = set(mixed_float_nodes(converted))
        for name in list(found):
            node = source_nodes[name]
            inner = {n.name for sub in subgraphs(node) for g in all_graphs(sub) for n in g.node}
            for hit in sorted(inner & mixed):
                add(hit, f"mixes fp16 and fp32 inputs inside {node.op_type} '{name}'")
            if inner & set(found):
                # Keeping the container would keep its whole body; the inner nodes suffice.
                del found[name]
    # Type neighbourhood: the other readers of an fp32 constant that a named node reads would
    # meet the same converted tensor beside it.
    constants = _constant_names(source)
    for name in list(found):
        for tensor in source_nodes[name].input:
            if tensor in constants:
                for reader in source_readers.get(tensor, []):
                    add(reader.name, f"reads the fp32 constant '{tensor}' beside '{name}'")
    return found


def _constant_names(model: onnx.ModelProto) -> set[str]:
    names = set()
    for graph in all_graphs(model.graph):
        names.update(t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT)
        names.update(n.output[0] for n in graph.node if n.op_type == "Constant")
    return names


def kept_list(kept: dict[str, str], model: onnx.ModelProto) -> list[KeptNode]:
    nodes, _, _ = _index(model)
    return [KeptNode(name, nodes[name].op_type if name in nodes else "?", why) for name, why in sorted(kept.items())]


def convert_keeping(
    model: onnx.ModelProto,
    convert: Callable[[onnx.ModelProto, set[str]], onnx.ModelProto],
    keep: dict[str, str] | None = None,
    validate: Callable[[onnx.ModelProto], str | None] | None = None,
    max_rounds: int = MAX_ROUNDS,
    blocked_ops: set[str] = frozenset(),
) -> tuple[onnx.ModelProto, dict[str, str], list[dict]]:
    """(fp16 model, kept {node: why}, records). `convert(model, keep)` raises ConversionError (with
    the failing model when there is one) or returns a model that `validate` (onnxruntime loading it)
    may still refuse with a message. Raises KeepFailed when no set of kept nodes makes it valid."""
    kept = dict(keep or {})
    records: list[dict] = []
    for round_number in range(max_rounds):
        try:
            converted = convert(model, set(kept))
            error = validate(converted) if validate else None
            failing = converted
        except ConversionError as failure:
            error, failing = failure.detail, failure.model
        if error is None:
            return converted, kept, records
        more = {k: v for k, v in offending_nodes(error, failing, model, blocked_ops).items() if k not in kept}
        if not more:
            raise KeepFailed(f"{error.strip().splitlines()[0][:300]} (after keeping {len(kept)} nodes in fp32, the error names no further node to keep)")
        records.append({"what": f"round {round_number + 1}: keeping {len(more)} nodes in fp32 after: {error.strip().splitlines()[0][:200]}", "nodes": sorted(more)})
        kept.update(more)
    raise KeepFailed(f"still invalid after {max_rounds} rounds of keeping nodes in fp32 ({len(kept)} kept): {error.strip().splitlines()[0][:300]}")


class ConversionError(Exception):
    """A conversion attempt failed; `detail` is the full error text, `model` the failing graph."""

    def __init__(self, detail: str, model: onnx.ModelProto | None = None):
        super().__init__(detail.strip().splitlines()[0] if detail.strip() else detail)
        self.detail = detail
        self.model = model


class KeepFailed(Exception):
    """No set of nodes kept in fp32 makes the fp16 model valid; the message says why."""
