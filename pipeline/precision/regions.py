"""Kept means kept: the fp32 regions of a converted model stay fp32.

onnxconverter-common's `node_block_list` does not keep tensors in fp32 on its own: a kept node's
output with several readers is cast to fp16 and back to fp32 for its kept readers (its cast-pair
clean-up misses fan-out), graph inputs read by kept nodes take the same round trip, and the
`Constant` values kept nodes read are stored as fp16 and cast up. This post-pass, run on the
converter's output, removes every fp32 -> fp16 -> fp32 round trip of the converter's own casts,
restores constants and initializers that fp32 nodes read to their exact fp32 values (fp16 readers
of the same constant get one Cast), so casts sit only on edges between fp16 and fp32 regions.

Before conversion, `unholdable_constants` finds the fp32 constants fp16 cannot hold (beyond
±65504, or a value that matters within its tensor but falls below fp16's normal range, e.g. an
epsilon of 1e-8): their readers are kept in fp32, with the reason, instead of the converter clamping
the value with a warning.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import NameMaker, all_graphs, copy_model, declared_types, subgraphs

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # 6.1e-5: below it fp16 values are subnormal and lose precision
FP16_MIN_SUBNORMAL = 2.0**-24  # 6.0e-8: the converter's min_positive_val (smaller becomes 0)
# An element matters within its tensor when it is at least this share of the tensor's largest value
# (a weight tensor's tiny entries do not; a scalar epsilon does); fp16 must hold such an element
# within this relative error, or within half an fp16 step of the tensor's largest value (the error
# fp16 makes on that value itself: a 3072-wide Linear's weights peak near 0.02, and their entries
# near 2e-5 are subnormal in fp16, off by 1.5e-3 of themselves but 1.7e-6 of the peak).
_SIGNIFICANT_SHARE = 1e-3
_HOLD_RELATIVE = 2.0**-10
_HOLD_OF_PEAK = 2.0**-11


def why_unholdable(name: str, array: np.ndarray) -> str | None:
    values = np.abs(array.astype(np.float64)).ravel()
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    peak = float(values.max())
    if peak > FP16_MAX:
        return f"reads constant '{name}' with values up to {peak:.6g}, beyond fp16's ±65504"
    significant = values[(values > 0) & (values >= _SIGNIFICANT_SHARE * peak)]
    if significant.size:
        rounded = significant.astype(np.float16).astype(np.float64)
        error = np.abs(rounded - significant) / significant
        error[np.abs(rounded - significant) <= _HOLD_OF_PEAK * peak] = 0.0
        if float(error.max()) > _HOLD_RELATIVE:
            worst = float(significant[int(np.argmax(error))])
            return f"reads constant '{name}' with value {worst:.3g}, below fp16's normal range (6.1e-05): fp16 holds it only to {float(error.max()):.2g}"
    return None


def float_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_type == TensorProto.FLOAT}
    for node in graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT:
                    found[node.output[0]] = numpy_helper.to_array(attribute.t)
                elif attribute.name in ("value_float", "value_floats"):
                    found[node.output[0]] = np.array(helper.get_attribute_value(attribute), dtype=np.float32)
    return found


def unholdable_constants(model: onnx.ModelProto) -> dict[str, str]:
    """{reader node: why} for every node (any graph level) that reads an fp32 constant fp16 cannot
    hold; those readers stay fp32 so the constant is never changed."""
    whys: dict[str, str] = {}
    for graph in all_graphs(model.graph):
        for name, array in float_constants(graph).items():
            why = why_unholdable(name, array)
            if why:
                whys[name] = why
    found: dict[str, str] = {}
    if not whys:
        return found
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Constant":
                continue
            for name in node.input:  # inner readers are visited themselves: keeping an If would keep its whole body
                if name in whys and node.name and node.name not in found:
                    found[node.name] = whys[name]
    # The Constant nodes themselves too: the converter then leaves their values alone (no clamp).
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Constant" and node.output[0] in whys and node.name:
                found.setdefault(node.name, whys[node.output[0]].replace("reads constant", "holds constant", 1))
    return found


def _reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs and the outer-scope names its subgraphs read."""
    names = [n for n in node.input if n]
    for sub in subgraphs(node):
        for graph in all_graphs(sub):
            names += [n for inner in graph.node for n in inner.input if n]
    return names


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every value at every graph level (inference, declarations, constants, Casts)."""
    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - best effort: the declarations below still count
        inferred = model
    for graphs in (all_graphs(inferred.graph), all_graphs(model.graph)):
        for graph in graphs:
            types.update(declared_types(graph))
    return types


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast":
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _rename_reads(model: onnx.ModelProto, old: str, new: str) -> None:
    for graph in all_graphs(model.graph):
        for node in graph.node:
            node.input[:] = [new if name == old else name for name in node.input]


def _graph_outputs(model: onnx.ModelProto) -> set[str]:
    return {o.name for graph in all_graphs(model.graph) for o in graph.output}


def _drop_value_info(model: onnx.ModelProto, names: set[str]) -> None:
    for graph in all_graphs(model.graph):
        kept = [info for info in graph.value_info if info.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(kept)


def _set_value_info_type(model: onnx.ModelProto, name: str, elem_type: int) -> None:
    for graph in all_graphs(model.graph):
        for info in [*graph.value_info, *graph.output]:
            if info.name == name:
                info.type.tensor_type.elem_type = elem_type


def _restore_dropped_casts(model: onnx.ModelProto, source: onnx.ModelProto, added: set[str]) -> int:
    """The converter's cast-pair clean-up deletes a kept node's Cast to fp16 even when other
    readers (an outer-scope reader inside a Loop/If body) still read it. Put it back, after the
    node, so those readers see the value again (the round-trip removal then reconnects fp32 ones)."""
    visible = {n for g in all_graphs(model.graph) for n in [*(i.name for i in g.input), *(t.name for t in g.initializer)]}
    visible |= {out for g in all_graphs(model.graph) for node in g.node for out in node.output}
    dangling = {name for g in all_graphs(model.graph) for node in g.node for name in node.input if name and name not in visible}
    if not dangling:
        return 0
    made = {out: (node.name, index) for g in all_graphs(source.graph) for node in g.node for index, out in enumerate(node.output)}
    fresh = NameMaker(model.graph)
    restored = 0
    for graph in all_graphs(model.graph):
        position = 0
        while position < len(graph.node):
            node = graph.node[position]
            for name in sorted(dangling):
                if made.get(name, ("", 0))[0] == node.name and made[name][1] < len(node.output):
                    cast = helper.make_node("Cast", [node.output[made[name][1]]], [name], to=TensorProto.FLOAT16, name=fresh(f"{node.name}_output_cast_restored"))
                    graph.node.insert(position + 1, cast)
                    added.add(cast.name)
                    dangling.discard(name)
                    restored += 1
            position += 1
    return restored


def _remove_round_trips(model: onnx.ModelProto, added: set[str]) -> int:
    """Cast(fp32 X -> fp16) read by Cast(-> fp32) Z, both the converter's: Z's readers read X."""
    types = _types(model)
    outputs = _graph_outputs(model)
    removed = 0
    dropped: set[str] = set()
    producer = {out: node for graph in all_graphs(model.graph) for node in graph.node for out in node.output}
    for graph in all_graphs(model.graph):
        remove = []
        for node in graph.node:
            if node.name not in added or _cast_to(node) != TensorProto.FLOAT:
                continue
            down = producer.get(node.input[0])
            if down is None or down.name not in added or _cast_to(down) != TensorProto.FLOAT16 or types.get(down.input[0]) != TensorProto.FLOAT:
                continue
            if node.output[0] in outputs:
                node.op_type = "Identity"
                del node.attribute[:]
                node.input[0] = down.input[0]
            else:
                _rename_reads(model, node.output[0], down.input[0])
                dropped.add(node.output[0])
                remove.append(node)
            removed += 1
        for node in remove:
            graph.node.remove(node)
    removed_nodes = _remove_unread_casts(model, added, outputs)
    _drop_value_info(model, dropped | removed_nodes)
    return removed


def _remove_unread_casts(model: onnx.ModelProto, added: set[str], outputs: set[str]) -> set[str]:
    """Drop the converter's casts that nothing reads any more; returns their output names."""
    gone: set[str] = set()
    while True:
        read = {name for graph in all_graphs(model.graph) for node in graph.node for name in _reads(node)}
        found = False
        for graph in all_graphs(model.graph):
            for node in list(graph.node):
                if node.name in added and node.op_type == "Cast" and node.output[0] not in read and node.output[0] not in outputs:
                    graph.node.remove(node)
                    gone.add(node.output[0])
                    found = True
        if not found:
            return gone


def _remove_noop_casts(model: onnx.ModelProto, added: set[str]) -> int:
    """The converter's casts that now cast fp32 to fp32 (after a kept node's output was pointed back
    at fp32): readers read the input, or the producer writes the graph output itself."""
    types = _types(model)
    outputs = _graph_outputs(model)
    read_count: dict[str, int] = {}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            for name in _reads(node):
                read_count[name] = read_count.get(name, 0) + 1
    removed = 0
    for graph in all_graphs(model.graph):
        producer = {out: node for node in graph.node for out in node.output}
        own_outputs = {o.name for o in graph.output}
        for node in list(graph.node):
            target = _cast_to(node)
            if node.name not in added or target is None or types.get(node.input[0]) != target:
                continue
            source, result = node.input[0], node.output[0]
            if result not in outputs:
                _rename_reads(model, result, source)
                graph.node.remove(node)
            elif result in own_outputs and source in producer and read_count.get(source) == 1 and source not in outputs:
                before = producer[source]
                before.output[:] = [result if name == source else name for name in before.output]
                graph.node.remove(node)
                _drop_value_info(model, {source})
            else:
                continue
            removed += 1
    return removed


def _restore_constants(model: onnx.ModelProto, source: onnx.ModelProto, added: set[str]) -> int:
    """fp16 constants that were fp32 in `source` and that fp32 nodes read through the converter's
    up-casts: back to their exact fp32 values; their fp16 readers, if any, get one Cast."""
    originals: dict[str, np.ndarray] = {}
    for graph in all_graphs(source.graph):
        originals.update(float_constants(graph))
    readers: dict[str, list[onnx.NodeProto]] = {}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            for name in set(node.input):
                readers.setdefault(name, []).append(node)
    outputs = _graph_outputs(model)
    fresh = NameMaker(model.graph)
    restored = 0
    for graph in all_graphs(model.graph):
        places: list[tuple[int, str, onnx.TensorProto]] = [(-1, t.name, t) for t in graph.initializer]
        places += [(i, n.output[0], a.t) for i, n in enumerate(graph.node) if n.op_type == "Constant" for a in n.attribute if a.name == "value"]
        inserts: list[tuple[int, onnx.NodeProto]] = []
        for position, name, tensor in places:
            if tensor.data_type != TensorProto.FLOAT16 or name not in originals or name in outputs:
                continue
            users = readers.get(name, [])
            up = [n for n in users if n.name in added and _cast_to(n) == TensorProto.FLOAT and n.input[0] == name]
            if not up:
                continue
            tensor.CopyFrom(numpy_helper.from_array(originals[name].astype(np.float32), tensor.name))
            _set_value_info_type(model, name, TensorProto.FLOAT)
            for cast in up:
                _rename_reads(model, cast.output[0], name)
            others = [n for n in users if n not in up]
            if others:
                down = fresh(f"{name}__fp16")
                for node in others:
                    node.input[:] = [down if n == name else n for n in node.input]
                inserts.append((position + 1, helper.make_node("Cast", [name], [down], to=TensorProto.FLOAT16, name=fresh(f"{name}__to_fp16"))))
            restored += 1
        for position, node in sorted(inserts, key=lambda item: -item[0]):
            graph.node.insert(max(position, 0), node)
            added.add(node.name)
    _drop_value_info(model, _remove_unread_casts(model, added, outputs))
    return restored


def keep_fp32_regions(converted: onnx.ModelProto, source: onnx.ModelProto) -> PassResult:
    """The converted model with its fp32 regions fp32: no round trips between fp32 nodes, fp32
    nodes' constants exact. `source` is the model the converter was given (names unchanged).
    Casts not in `source` are the converter's (and pack's) and may be removed; the model's own
    Casts are never touched. Idempotent; never mutates its input."""
    model = copy_model(converted)
    own = {node.name for graph in all_graphs(source.graph) for node in graph.node}
    added = {node.name for graph in all_graphs(model.graph) for node in graph.node if node.op_type == "Cast" and node.name not in own}
    _restore_dropped_casts(model, source, added)
    trips = _remove_round_trips(model, added)
    constants = _restore_constants(model, source, added)
    trips += _remove_noop_casts(model, added)
    if not trips and not constants:
        return PassResult(converted, False)
    return PassResult(model, True, [{"what": f"fp32 regions kept fp32: {trips} fp32->fp16->fp32 round trips removed, {constants} constants read by fp32 nodes restored to fp32"}])
