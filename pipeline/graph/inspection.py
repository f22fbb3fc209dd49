"""`pack inspect`: what a model is and what will go wrong with it in onnxruntime-web.

Host-side facts (opset, IR version, sizes, op histogram, inputs and outputs, hazards with the
repair for each, fp16 readiness) come from the file alone. Which nodes land on the CPU instead of
WebGPU is measured in the browser by pipeline/verify/engines/browser/models.py (`measure_cpu_fallback`,
called by the command on `repaired(model)`); this module only prints what it found.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from pipeline.dtypes import onnx_type_name
from pipeline.graph.hazards import detect_hazards, preferred_layout
from pipeline.graph.passes.util import dims_of
from pipeline.graph.repairs import auto_repairs, run_passes


def describe_value(value: onnx.ValueInfoProto) -> dict[str, Any]:
    dims = dims_of(value)
    return {
        "name": value.name,
        "shape": None if dims is None else [d if d is not None else "?" for d in dims],
        "dtype": onnx_type_name(value.type.tensor_type.elem_type) if value.type.HasField("tensor_type") else "non-tensor",
    }


def _initializer_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.raw_data:
        return len(tensor.raw_data)
    return onnx.numpy_helper.to_array(tensor).nbytes if tensor.data_location != onnx.TensorProto.EXTERNAL else 0


def repaired(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """The model after its automatic repairs (as `pack build` ships it with the default runtime), and the report steps of each pass."""
    return run_passes(model, auto_repairs(model))


def inspect_model(path: Path, model: onnx.ModelProto) -> dict[str, Any]:
    """The graph facts of the inspection document (`pack inspect --no-browser --json`); the command
    adds "fp16" (pipeline/precision/readiness.py) and "cpu_fallback" (verify/browser/models.py)."""
    graph = model.graph
    initializer_names = {i.name for i in graph.initializer}
    histogram = Counter(
        (f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type) for node in graph.node
    )
    fixed, _ = repaired(model)
    hazards = detect_hazards(model)
    return {
        "file": path.name,
        "file_bytes": path.stat().st_size,
        "ir_version": model.ir_version,
        "opsets": {(entry.domain or "ai.onnx"): entry.version for entry in model.opset_import},
        "producer": " ".join(p for p in (model.producer_name, model.producer_version) if p),
        "nodes": len(graph.node),
        "initializers": {
            "count": len(graph.initializer),
            "bytes": sum(_initializer_bytes(t) for t in graph.initializer),
            "parameters": sum(int(_count(t.dims)) for t in graph.initializer),
        },
        "ops": dict(sorted(histogram.items(), key=lambda item: (-item[1], item[0]))),
        "inputs": [describe_value(v) for v in graph.input if v.name not in initializer_names],
        "outputs": [describe_value(v) for v in graph.output],
        "hazards": hazards,
        "repairs": auto_repairs(model),
        "webgpu_preferred_layout": {"as_is": preferred_layout(model), "after_repairs": preferred_layout(fixed)},
    }


def _count(dims) -> int:
    total = 1
    for d in dims:
        total *= d
    return total


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"


def human_lines(document: dict[str, Any]) -> list[str]:
    """The inspection as one line per fact or finding."""
    d = document
    opsets = ", ".join(f"{domain} {version}" for domain, version in d["opsets"].items())
    init = d["initializers"]
    lines = [
        f"{d['file']}: IR {d['ir_version']}, opset {opsets}" + (f", from {d['producer']}" if d["producer"] else ""),
        f"size: {_size(d['file_bytes'])} file, {init['count']} initializers, {init['parameters']:,} parameters ({_size(init['bytes'])}), {d['nodes']} nodes",
        "ops: " + ", ".join(f"{op} {count}" for op, count in d["ops"].items()),
    ]
    for kind in ("inputs", "outputs"):
        for value in d[kind]:
            lines.append(f"{kind[:-1]}: {value['name']} {value['dtype']} {value['shape']}")
    if not d["hazards"]:
        lines.append("hazards: none found")
    for hazard in d["hazards"]:
        fix = f"repair: {hazard['repair']}" if hazard["repair"] else "no repair in pack"
        lines.append(f"hazard {hazard['hazard']} at '{hazard['node']}' ({hazard['op']}) on {', '.join(hazard['affects'])}: {hazard['detail']} [{fix}]")
    lines.append("automatic repairs: " + (", ".join(d["repairs"]) or "none"))
    layout = d["webgpu_preferred_layout"]
    if layout["as_is"]:
        lines.append(f"layout: webgpu EP needs preferredLayout '{layout['as_is']}' as is; after repairs: {layout['after_repairs'] or 'default (NHWC)'}")
    fp16 = d["fp16"]
    lines.append(f"fp16: {'ready' if fp16['ready'] else 'not ready'} (model is {fp16['precision']}: {fp16['why']})")
    if fp16.get("quantized_ops"):
        lines.append("quantized ops: " + ", ".join(f"{op} {count}" for op, count in fp16["quantized_ops"].items()))
    for finding in fp16["findings"]:
        fix = f"repair: {finding['repair']}" if finding["repair"] else "no repair in pack"
        lines.append(f"fp16 finding {finding['hazard']} at '{finding['node']}': {finding['detail']} [{fix}]")
    fallback = d.get("cpu_fallback")
    if fallback is None:
        lines.append("CPU fallback: not measured (--no-browser)")
    elif "error" in fallback:
        lines.append(f"CPU fallback: session creation failed on the webgpu bundle: {fallback['error']}")
    else:
        lines.append(f"CPU fallback (onnxruntime-web {fallback['runtime']}, webgpu bundle, {fallback['measured_on']}): "
                     f"nodes per EP {fallback['nodes_per_ep']}")
        missing = fallback["ops_without_webgpu_kernel"]
        lines.append("ops without a WebGPU kernel: " + (", ".join(missing) if missing else "none"))
        for node in fallback["cpu_nodes"]:
            lines.append(f"on CPU: '{node['node']}' ({node['op']}): {node['reason']}")
    return lines
