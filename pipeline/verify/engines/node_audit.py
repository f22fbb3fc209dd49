"""Node audit: a model too heavy to run whole on lavapipe, checked on onnxruntime's WebGPU kernels
node by node.

One host run of the fp32 model (onnxruntime CPU) yields the real fp32 values that each node reads,
cut (pipeline.verify.engines.node_slicing) to the window its audit needs: the model gets one Slice per
(tensor, window) as extra outputs, so the run holds no more memory than the model itself. Each node
then becomes a one-node ONNX model with those values as inputs and the weights it reads cut the same
way, in each variant's own precision (the variant's node, its weights and the types it reads, fp16
or fp32 per node as the variant has them). Many node models are joined into one model per session
(disconnected one-node graphs), and many sessions run in one child process
(pipeline.verify.engines.node_audit_worker): onnxruntime CPU on the fp32 node gives the reference, the
WebGPU EP on lavapipe gives each variant's figures. A crash names the node that caused it (its
group is retried one node at a time).

Each node's output is judged against the WebGPU bounds of its precision (thresholds.node_bounds,
kind "tensor"), on the max error as a fraction of the output tensor's scale: its largest magnitude
over the whole tensor in the host run (a ReduceMax(Abs) output of the same run), or the cut window's
range when larger. A cut window can be all near-zero (the background of a mask): its own norm is no
measure of what matters, so `rel_l2` is reported but not bounded.

`audit_variants` serves the `webgpu-kernels` stage; `node_verdicts` judges one candidate model
node by node (the fp16 search can use it to find which nodes break without whole-model runs).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from pipeline.cache import temporary_folder
from pipeline.verify.engines import node_slicing
from pipeline.verify.engines.host import run_model
from pipeline.verify.judgement.metrics import compare, judge
from pipeline.verify.judgement.thresholds import node_bounds
from pipeline.verify.engines.webgpu_kernels import node_macs

WORKER_MODULE = "pipeline.verify.engines.node_audit_worker"
# Nodes per session: onnxruntime's WebGPU EP compiles each distinct kernel once per session, and
# real models repeat their kernels, so large groups cost far less than many small ones.
NODES_PER_SESSION = 256
# A node with no cutting rule runs whole when the values it reads are at most this many elements.
WHOLE_ELEMENTS = 1 << 20
# A node that is cheap at its real shapes runs whole even where it could be cut: kernels choose code
# paths by shape and go wrong at far positions (fp16 ConvTranspose from position 2048 on), which a
# cut to the first few positions never reaches. Cheap: reads and writes at most CHEAP_ELEMENTS
# values and costs at most CHEAP_MACS multiply-accumulates (about 10 ms on lavapipe).
CHEAP_ELEMENTS = 1 << 19
CHEAP_MACS = 16_000_000
DEFAULT_AUDIT_TIMEOUT_S = 900


def audit_timeout_s() -> float:
    """The time one audit child may take for all its sessions (`PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S`)."""
    import os

    return float(os.environ.get("PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S") or DEFAULT_AUDIT_TIMEOUT_S)


SKIPPED_OPS = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Range", "EyeLike", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli", "NonZero", "Unique"})
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})
FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
# Integer/boolean outputs (comparisons, Cast to int, ArgMax) of an fp16 node may flip where the
# fp16-rounded input crosses a boundary; that is the conversion's business (the host checks see its
# effect on the model's outputs). A kernel that is wrong flips far more than this share.
FLIP_SHARE = 0.01


@dataclass
class NodeVerdict:
    """The audit of one node in one variant. `status`: passed | failed | not-verifiable."""

    node: str
    op: str
    shape: list  # the real shapes of its inputs
    status: str
    detail: str = ""
    metrics: dict = field(default_factory=dict)
    threshold: dict = field(default_factory=dict)
    cut: str = ""  # how the node was cut down (empty: run whole)

    def line(self) -> str:
        return f"{self.node} ({self.op}) at {self.shape}: {self.detail}"


@dataclass
class AuditResult:
    verdicts: dict[str, list[NodeVerdict]]  # variant -> one per audited node
    not_audited: list[dict]  # {node, op, shape, why}
    timings_s: dict[str, float]

    def failed(self, variant: str) -> list[NodeVerdict]:
        return [v for v in self.verdicts.get(variant, []) if v.status == "failed"]

    def facts(self) -> dict:
        """report.json webgpu_kernels.audit: counts, the failures and every verdict per variant."""
        per_op = Counter(item["op"] for item in self.not_audited)
        return {
            "what": "node audit: each node at its real shapes on the host's fp32 values, cut to a few outputs with full accumulation depth",
            "timings_s": self.timings_s,
            "not_audited": {"count": len(self.not_audited), "by_op": dict(sorted(per_op.items())), "nodes": self.not_audited[:200]},
            "variants": {
                variant: {
                    "audited": len(verdicts),
                    "passed": sum(v.status == "passed" for v in verdicts),
                    "failed": [asdict(v) for v in verdicts if v.status == "failed"],
                    "not_verifiable": [asdict(v) for v in verdicts if v.status == "not-verifiable"],
                    "worst": _worst(verdicts),
                }
                for variant, verdicts in self.verdicts.items()
            },
        }


def _worst(verdicts: list[NodeVerdict]) -> dict | None:
    scored = [v for v in verdicts if "max_abs_of_scale" in v.metrics]
    if not scored:
        return None
    worst = max(scored, key=lambda v: v.metrics["max_abs_of_scale"])
    return {"node": worst.node, "op": worst.op, "shape": worst.shape, "rel_l2": worst.metrics["rel_l2"], "max_abs_of_scale": worst.metrics.get("max_abs_of_scale")}


def node_verdicts(reference_model: Path, candidate: Path, feeds: dict[str, np.ndarray], precision: str = "fp16", ep_options: dict | None = None) -> list[NodeVerdict]:
    """Per-node verdicts of one candidate model (e.g. an fp16 conversion with some nodes kept in
    fp32) on onnxruntime's WebGPU kernels, against the fp32 `reference_model`'s values on `feeds`.
    A candidate passes when no verdict failed; a failed verdict names the node, op, shape and figure."""
    return audit_variants(reference_model, {"candidate": (candidate, precision)}, feeds, ep_options).verdicts["candidate"]


def audit_variants(reference_model: Path, variants: dict[str, tuple[Path, str]], feeds: dict[str, np.ndarray], ep_options: dict | None = None, progress=None) -> AuditResult:
    """Audit each variant (name -> (model path, precision)) node by node against the fp32
    reference model's host values on `feeds`."""
    import onnx

    started = last = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        timings[name] = round(now - last, 2)
        last = now

    reference = onnx.load(str(reference_model))
    jobs, not_audited = _plan(reference, feeds)
    lap("plan_s")
    if progress:
        progress.note(f"node audit: {len(jobs)} nodes to audit, {len(not_audited)} not auditable; one host run for their inputs")
    with temporary_folder("pack-node-audit-") as tmp_name:
        tmp = Path(tmp_name)
        values = _host_values(reference, jobs, feeds, tmp)
        lap("host_s")
        if isinstance(values, str):
            why = f"the host run of the fp32 model for the audit failed: {values}"
            return AuditResult({name: [NodeVerdict("*", "*", [], "not-verifiable", why)] for name in variants}, not_audited, timings)
        models = {"reference": (reference, "fp32")}
        for name, (path, precision) in variants.items():
            models[name] = (onnx.load(str(path)), precision)
        built, more = _node_models(models, jobs, values)
        not_audited.extend(more)
        lap("build_s")
        ran = _run_groups(built, {name: model for name, (model, _) in models.items()}, tmp, ep_options or {}, progress)
        lap("kernels_s")
        verdicts = {name: _verdicts(built, ran, name, precision, values) for name, (_, precision) in variants.items()}
    lap("judge_s")
    timings["total_s"] = round(time.perf_counter() - started, 2)
    return AuditResult(verdicts, not_audited, timings)


# --- planning -------------------------------------------------------------------------------


@dataclass
class _Job:
    index: int
    node: object  # the reference's NodeProto
    shapes: list  # real input shapes (None for absent inputs)
    plan: node_slicing.Plan
    fed: list[int]  # input positions fed from the host run; the others are embedded constants
    out_float: dict = field(default_factory=dict)  # output name -> whether it is a float tensor

    @property
    def label(self) -> str:
        return self.node.name or self.node.output[0]


def _attributes(node) -> dict:
    import onnx

    attrs = {}
    for attribute in node.attribute:
        value = onnx.helper.get_attribute_value(attribute)
        attrs[attribute.name] = value.decode() if isinstance(value, bytes) else value
    return attrs


def _infer(model, feeds: dict[str, np.ndarray]):
    """Shapes and element types of every tensor at the feeds' shapes: {name: (elem_type, dims|None)}.
    The weights' bytes are set aside while inference runs (it needs their dims and types only)."""
    import onnx

    stored = [(tensor, tensor.raw_data) for tensor in model.graph.initializer if tensor.raw_data]
    for tensor, _ in stored:
        tensor.raw_data = b""
    saved_inputs = [onnx.ValueInfoProto() for _ in model.graph.input]
    for copy, value in zip(saved_inputs, model.graph.input):
        copy.CopyFrom(value)
        if value.name in feeds:
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for n in feeds[value.name].shape:
                shape.dim.add().dim_value = n
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - best effort: unknown shapes make their nodes not auditable
        inferred = model
    finally:
        for tensor, raw in stored:
            tensor.raw_data = raw
        for value, copy in zip(model.graph.input, saved_inputs):
            value.CopyFrom(copy)
    known: dict[str, tuple[int, list[int] | None]] = {}
    for value in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tensor_type = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim] if tensor_type.HasField("shape") else None
        known[value.name] = (tensor_type.elem_type, None if dims is None or None in dims else dims)
    for tensor in model.graph.initializer:
        known[tensor.name] = (tensor.data_type, list(tensor.dims))
    for name, array in feeds.items():
        known[name] = (known.get(name, (1, None))[0], list(array.shape))
    return known


class _Constants(dict):
    """Initializers and Constant-node values by tensor name, converted to arrays on first use."""

    def __init__(self, model):
        import onnx

        super().__init__()
        self._protos = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute:
                self._protos[node.output[0]] = node.attribute[0]
        self._onnx = onnx

    def __contains__(self, name) -> bool:
        return name in self._protos

    def __missing__(self, name):
        proto = self._protos[name]
        onnx = self._onnx
        if isinstance(proto, onnx.AttributeProto):
            value = onnx.numpy_helper.to_array(proto.t) if proto.name == "value" else np.array(onnx.helper.get_attribute_value(proto))
        else:
            value = onnx.numpy_helper.to_array(proto)
        self[name] = value
        return value

    def size(self, name: str) -> int:
        proto = self._protos[name]
        dims = proto.t.dims if isinstance(proto, self._onnx.AttributeProto) and proto.name == "value" else getattr(proto, "dims", [])
        return math.prod(dims)


def _constants(model) -> _Constants:
    return _Constants(model)


def _plan(reference, feeds: dict[str, np.ndarray]) -> tuple[list[_Job], list[dict]]:
    known = _infer(reference, feeds)
    constants = _constants(reference)
    opset = next((o.version for o in reference.opset_import if o.domain in ("", "ai.onnx")), 13)
    jobs: list[_Job] = []
    not_audited: list[dict] = []
    for node in reference.graph.node:
        if node.op_type in SKIPPED_OPS:
            continue
        shapes = [known.get(name, (0, None))[1] if name else None for name in node.input]
        types = [known.get(name, (0, None))[0] for name in [*node.input, *node.output] if name]
        entry = {"node": node.name or node.output[0], "op": node.op_type, "shape": shapes}
        if not any(t in FLOAT_TYPES for t in types):
            continue  # integer shape arithmetic: no precision to audit
        fed = [i for i, name in enumerate(node.input) if name and name not in constants]
        if not fed:
            continue  # computes on constants only (folded by onnxruntime)
        if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            not_audited.append({**entry, "why": f"{node.op_type} ({node.domain or 'ai.onnx'}): subgraphs and custom domains are not audited node by node"})
            continue
        if any(shapes[i] is None for i in fed):
            not_audited.append({**entry, "why": "shape inference leaves an input's shape unknown"})
            continue
        attrs = {**_attributes(node), "_opset": opset}
        small = {i: [int(v) for v in np.asarray(constants[name]).ravel()] for i, name in enumerate(node.input) if name in constants and constants.size(name) <= 16 and np.asarray(constants[name]).dtype.kind in "iu"}
        plan = node_slicing.plan_node(node.op_type, attrs, shapes, small)
        if not isinstance(plan, str) and _cheap(node, shapes, fed, known):
            plan = node_slicing.Plan([None] * len(node.input), how="")
        if isinstance(plan, str):
            elements = sum(math.prod(shapes[i]) for i in fed)
            if elements > WHOLE_ELEMENTS:
                not_audited.append({**entry, "why": f"{plan}, and its inputs ({elements} values) are too large to run whole", "data_movement": node.op_type in node_slicing.DATA_MOVEMENT})
                continue
            plan = node_slicing.Plan([None] * len(node.input), how="")
        out_float = {name: known.get(name, (0, None))[0] == 1 for name in node.output if name}
        jobs.append(_Job(len(jobs), node, shapes, plan, fed, out_float))
    return jobs, not_audited


def _cheap(node, shapes: list, fed: list[int], known: dict) -> bool:
    """Whether `node` is cheap enough at its real shapes to run whole (CHEAP_ELEMENTS, CHEAP_MACS)."""
    outs = [known.get(name, (0, None))[1] for name in node.output if name]
    if any(shape is None for shape in outs):
        return False
    elements = sum(math.prod(shapes[i]) for i in fed) + sum(math.prod(shape) for shape in outs)
    macs = node_macs(node.op_type, shapes[0] if shapes else None, shapes[1] if len(shapes) > 1 else None, outs[0] if outs else None)
    return elements <= CHEAP_ELEMENTS and macs <= CHEAP_MACS


# --- the host run -----------------------------------------------------------------------------


def _value_key(name: str, window: list[int] | None) -> str:
    return f"{name}|{','.join(map(str, window)) if window is not None else '*'}"


def _host_values(reference, jobs: list[_Job], feeds: dict[str, np.ndarray], tmp: Path) -> dict[str, np.ndarray] | str:
    """The fp32 values each job reads, cut to its windows, from one onnxruntime CPU run of the
    reference with a Slice per (tensor, window) added as outputs."""
    import onnx
    from onnx import helper, numpy_helper

    graph = reference.graph  # the probe: the reference plus Slice outputs, undone after saving
    counts = (len(graph.node), len(graph.initializer))
    outputs = list(graph.output)
    del graph.output[:]
    wanted: dict[str, str] = {}  # key -> probe output name
    for job in jobs:
        for i in job.fed:
            name, win = job.node.input[i], job.plan.windows[i]
            key = _value_key(name, win)
            if key in wanted:
                continue
            out = f"pack_audit_{len(wanted)}"
            wanted[key] = out
            full = job.shapes[i]
            if win is None or list(win) == list(full):
                graph.node.append(helper.make_node("Identity", [name], [out], name=f"{out}_id"))
            else:
                starts = numpy_helper.from_array(np.zeros(len(win), np.int64), f"{out}_starts")
                ends = numpy_helper.from_array(np.array(win, np.int64), f"{out}_ends")
                graph.initializer.extend([starts, ends])
                graph.node.append(helper.make_node("Slice", [name, starts.name, ends.name], [out], name=f"{out}_slice"))
            graph.output.append(helper.make_value_info(out, onnx.TypeProto()))
        for name in job.node.output:
            key = f"scale|{name}"
            if name and key not in wanted and job.out_float.get(name):
                out = f"pack_audit_{len(wanted)}"
                wanted[key] = out
                graph.node.append(helper.make_node("Abs", [name], [f"{out}_abs"], name=f"{out}_abs"))
                graph.node.append(helper.make_node("ReduceMax", [f"{out}_abs"], [out], name=f"{out}_max", keepdims=0))
                graph.output.append(helper.make_value_info(out, onnx.TypeProto()))
    path = tmp / "probe.onnx"
    try:
        large = reference.ByteSize() > (1 << 31) - (1 << 24)
        onnx.save(reference, str(path), save_as_external_data=large, location="probe.data" if large else None)
    finally:
        del graph.node[counts[0]:]
        del graph.initializer[counts[1]:]
        del graph.output[:]
        graph.output.extend(outputs)
    run = run_model(path, feeds)
    if run.outputs is None:
        return run.error or "no outputs"
    return {key: run.outputs[out] for key, out in wanted.items()}


# --- node models ----------------------------------------------------------------------------


@dataclass
class _Built:
    job: _Job
    models: dict[str, tuple[object, dict[str, np.ndarray]]]  # model name -> (GraphProto parts, feeds)
    out_types: dict[str, list[int]]


def _contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy that keeps the rank: np.ascontiguousarray turns a 0-d array into shape
    [1], and a scalar input (DFT's dft_length, a Pow exponent) must stay a scalar."""
    return np.require(array, requirements="C")


def _cut(array: np.ndarray, win: list[int] | None) -> np.ndarray:
    if win is None or array.ndim != len(win):
        return array
    return array[tuple(slice(0, n) for n in win)]


def _trace(name: str, producers: dict, reference_names: set[str]) -> tuple[str, list[int]] | None:
    """Follow `name` back through Casts the converter inserted to a tensor the reference has:
    (that tensor, the Casts' target types in the order they apply)."""
    casts: list[int] = []
    for _ in range(16):
        if name in reference_names:
            return name, list(reversed(casts))
        node = producers.get(name)
        if node is None or node.op_type != "Cast":
            return None
        casts.append(next(a.i for a in node.attribute if a.name == "to"))
        name = node.input[0]
    return None


def _node_models(models: dict[str, tuple[object, str]], jobs: list[_Job], values: dict[str, np.ndarray]) -> tuple[list[_Built], list[dict]]:
    import onnx
    from onnx import helper

    reference = models["reference"][0]
    reference_names = {n for node in reference.graph.node for n in (*node.input, *node.output)} | {i.name for i in reference.graph.input} | {t.name for t in reference.graph.initializer}
    per_model = {}
    for name, (model, _) in models.items():
        nodes = {n.name: n for n in model.graph.node if n.name}
        by_output = {n.output[0]: n for n in model.graph.node if n.output}
        producers = {o: n for n in model.graph.node for o in n.output}
        known = _infer(model, {}) if name != "reference" else None
        per_model[name] = (model, nodes, by_output, producers, _constants(model), known)
    built: list[_Built] = []
    not_audited: list[dict] = []
    for job in jobs:
        parts: dict = {}
        out_types: dict[str, list[int]] = {}
        failure = None
        for name, (model, nodes, by_output, producers, constants, known) in per_model.items():
            node = nodes.get(job.node.name) if job.node.name else None
            node = node or by_output.get(job.node.output[0])
            if node is None or node.op_type != job.node.op_type:
                failure = f"no node {job.label} ({job.node.op_type}) in the {name} model"
                break
            made = _one_node(job, node, name, constants, producers, reference_names, known, values)
            if isinstance(made, str):
                failure = made
                break
            parts[name], out_types[name] = made
        if failure:
            not_audited.append({"node": job.label, "op": job.node.op_type, "shape": job.shapes, "why": failure})
            continue
        built.append(_Built(job, parts, out_types))
    return built, not_audited


def _one_node(job: _Job, node, model_name: str, constants, producers, reference_names, known, values):
    """(node, inputs value_infos, initializers, feeds, output types) of one node in one model, or why not."""
    import onnx
    from onnx import helper, numpy_helper

    plan = job.plan
    inputs, initializers, feeds = [], [], {}
    names = []
    for i, tensor in enumerate(node.input):
        if not tensor:
            names.append("")
            continue
        local = f"i{i}"
        names.append(local)
        win = plan.windows[i] if i < len(plan.windows) else None
        traced = _trace(tensor, producers, reference_names | set(constants)) if model_name != "reference" else (tensor, [])
        if traced is None:
            return f"input {tensor} of {job.label} does not lead back to a tensor of the reference"
        source, casts = traced
        if source in constants:
            value = _cut(np.asarray(constants[source]), win)
            if i == 3 and "_resize_channels" in plan.attributes:
                value = np.array([1, plan.attributes["_resize_channels"], *value.ravel()[2:]], dtype=value.dtype)
            for to in casts:
                value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
            initializers.append(numpy_helper.from_array(_contiguous(value), local))
            continue
        if i not in job.fed:
            return f"input {tensor} of {job.label} is a constant in the reference but computed in {model_name}"
        value = values[_value_key(source, win)]
        for to in casts:
            value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
        if i == 3 and "_resize_channels" in plan.attributes:  # Resize `sizes` of the cut input
            value = np.array([1, plan.attributes["_resize_channels"], *np.asarray(value).ravel()[2:]], dtype=value.dtype)
        if model_name != "reference" and not casts:
            elem = known.get(tensor, (0, None))[0] if known else 0
            if elem:
                value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        feeds[local] = _contiguous(value)
        inputs.append(helper.make_tensor_value_info(local, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    attrs = [a for a in node.attribute if a.name not in plan.attributes]
    copy = helper.make_node(node.op_type, names, [f"o{k}" if o else "" for k, o in enumerate(node.output)], name=job.label, domain=node.domain)
    copy.attribute.extend(attrs)
    for key, value in plan.attributes.items():
        if not key.startswith("_"):
            copy.attribute.append(helper.make_attribute(key, value))
    types = []
    for o in node.output:
        if model_name == "reference":
            types.append(0)
        else:
            types.append(known.get(o, (0, None))[0] if known else 0)
    return (copy, inputs, initializers, feeds), types


def _group_model(built: list[_Built], model_name: str, template):
    """One model holding the one-node graphs of `built` for `model_name`, names prefixed per node."""
    import onnx
    from onnx import helper

    nodes, inputs, outputs, initializers, feeds = [], [], [], [], {}
    for item in built:
        node, node_inputs, node_inits, node_feeds = item.models[model_name]
        prefix = f"n{item.job.index}_"
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.ClearField("input")
        copy.ClearField("output")
        copy.input.extend([prefix + n if n else "" for n in node.input])
        copy.output.extend([prefix + n if n else "" for n in node.output])
        copy.name = prefix + node.name
        nodes.append(copy)
        for value in node_inputs:
            renamed = onnx.ValueInfoProto()
            renamed.CopyFrom(value)
            renamed.name = prefix + value.name
            inputs.append(renamed)
        for tensor in node_inits:
            renamed = onnx.TensorProto()
            renamed.CopyFrom(tensor)
            renamed.name = prefix + tensor.name
            initializers.append(renamed)
        feeds.update({prefix + k: v for k, v in node_feeds.items()})
        for out in node.output:
            if out:
                outputs.append(helper.make_value_info(prefix + out, onnx.TypeProto()))
    graph = helper.make_graph(nodes, f"audit_{model_name}", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=list(template.opset_import))
    model.ir_version = template.ir_version
    return model, feeds


def _run_groups(built: list[_Built], templates: dict, tmp: Path, ep_options: dict, progress) -> dict:
    """Run every group on its EP in child processes; {(model name, job index): outputs | why not}.
    A child that crashes is restarted after the session that killed it; that session's nodes are
    retried one by one, so a crash names its node."""
    import onnx

    pending = [(name, built[i:i + NODES_PER_SESSION]) for i in range(0, len(built), NODES_PER_SESSION) for name in templates]
    results: dict = {}
    serial = 0
    while pending:
        specs = []
        for name, group in pending:
            serial += 1
            model, feeds = _group_model(group, name, templates[name])
            model_path, feeds_path = tmp / f"g{serial}.onnx", tmp / f"g{serial}.npz"
            onnx.save(model, str(model_path))
            np.savez(feeds_path, **feeds)
            specs.append({"id": serial, "model": str(model_path), "feeds": str(feeds_path), "out": str(tmp / f"g{serial}.out.npz"), "ep": "cpu" if name == "reference" else "webgpu"})
        jobs_path, done_path = tmp / "jobs.json", tmp / "done.txt"
        jobs_path.write_text(json.dumps({"jobs": specs, "ep_options": ep_options}))
        done_path.write_text("")
        stopped = _spawn(jobs_path, done_path)
        finished = {}
        for line in done_path.read_text().splitlines():
            number, _, status = line.partition(" ")
            finished[int(number)] = status
        retry = []
        culprit_seen = False
        for (name, group), spec in zip(pending, specs):
            if spec["id"] in finished:
                _collect(results, name, group, spec, finished[spec["id"]])
            elif stopped and stopped.startswith("SIG") and not culprit_seen:
                culprit_seen = True
                if len(group) > 1:
                    retry.extend((name, [item]) for item in group)
                else:
                    results[(name, group[0].job.index)] = f"crashed the worker ({stopped})"
            elif stopped and stopped.startswith("SIG"):
                retry.append((name, group))
            else:
                for item in group:
                    results[(name, item.job.index)] = stopped or "the worker stopped before this node"
        if progress and retry:
            progress.note(f"node audit: a session crashed the worker ({stopped}); retrying the rest")
        pending = retry
        for spec in specs:
            for key in ("model", "feeds", "out"):
                Path(spec[key]).unlink(missing_ok=True)
    return results


def _spawn(jobs_path: Path, done_path: Path) -> str | None:
    """Run the worker on a job list; None when it finished, else the signal name ("SIGSEGV") or
    why it stopped."""
    from pipeline.verify.engines import webgpu_kernels
    from pipeline.verify.engines.host import _signal_name

    command = [sys.executable, "-m", WORKER_MODULE, str(jobs_path), str(done_path)]
    limit = audit_timeout_s()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=webgpu_kernels.worker_env())
    except subprocess.TimeoutExpired:
        return f"not verifiable: the node audit did not finish within {limit:g} s (PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S raises the limit)"
    if done.returncode < 0:
        return _signal_name(done.returncode)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"the audit worker failed: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return None


def _collect(results: dict, name: str, group: list[_Built], spec: dict, status: str) -> None:
    if status.startswith("error"):
        for item in group:
            results[(name, item.job.index)] = status.removeprefix("error").strip() or "failed"
        return
    placement = json.loads(status) if status else {}
    cpu = set(placement.get("cpu_nodes", []))
    with np.load(spec["out"]) as out:
        for item in group:
            prefix = f"n{item.job.index}_"
            if name != "reference" and f"{prefix}{item.job.label}" in cpu:
                results[(name, item.job.index)] = "ran on onnxruntime's CPU EP (no WebGPU kernel): not a WebGPU result"
                continue
            results[(name, item.job.index)] = [out[f"{prefix}o{k}"] if f"{prefix}o{k}" in out.files else None for k in range(len(item.job.node.output))]


def _verdicts(built: list[_Built], ran: dict, name: str, precision: str, values: dict) -> list[NodeVerdict]:
    bounds = node_bounds(precision)
    verdicts = []
    for item in built:
        job = item.job
        base = {"node": job.label, "op": job.node.op_type, "shape": job.shapes, "cut": job.plan.how}
        reference = ran.get(("reference", job.index))
        actual = ran.get((name, job.index))
        if not isinstance(reference, list):
            verdicts.append(NodeVerdict(**base, status="not-verifiable", detail=f"the fp32 node on onnxruntime CPU: {reference}"))
            continue
        if isinstance(actual, str):
            status = "not-verifiable" if "not a WebGPU result" in actual or actual.startswith("not verifiable") else "failed"
            verdicts.append(NodeVerdict(**base, status=status, detail=actual))
            continue
        worst: tuple | None = None
        for k, (ref, act) in enumerate(zip(reference, actual)):
            if ref is None or act is None:
                continue
            scale = values.get(f"scale|{job.node.output[k]}")
            metrics, passed, reason = node_metrics(ref, act, bounds, precision, None if scale is None else float(scale))
            key = (not passed, metrics.get("max_abs_of_scale", 0.0))
            if worst is None or key > worst[0]:
                worst = (key, metrics, passed, reason, k)
        if worst is None:
            verdicts.append(NodeVerdict(**base, status="passed", detail="no output to compare"))
            continue
        _, metrics, passed, reason, k = worst
        figure = reason if reason else ", ".join(f"{key} {metrics[key]:.3g}" for key in bounds if key in metrics)
        output = job.node.output[k]
        verdicts.append(NodeVerdict(**base, status="passed" if passed else "failed", detail=f"{output}: {figure}", metrics=metrics, threshold=bounds))
    return verdicts


def node_metrics(reference: np.ndarray, actual: np.ndarray, bounds: dict, precision: str, tensor_scale: float | None = None) -> tuple[dict, bool, str | None]:
    """(figures, passed, reason) of one node output against its fp32 value; `tensor_scale` is the
    largest magnitude of the whole output tensor (the window's own scale when not given)."""
    reference = np.asarray(reference)
    actual = np.asarray(actual)
    if reference.dtype.kind in "biu" or reference.dtype == np.bool_:
        metrics = compare(reference, actual)
        if not metrics["shape_ok"]:
            return metrics, *judge(metrics, {})
        share = metrics["mismatches"] / max(reference.size, 1)
        metrics["mismatch_share"] = share
        if precision == "fp16" and share <= FLIP_SHARE:
            return metrics, True, None
        return metrics, *judge(metrics, {})
    metrics = compare(reference.astype(np.float32), actual.astype(np.float32))
    if not metrics["shape_ok"]:
        return metrics, *judge(metrics, {})
    ref = reference.astype(np.float64)
    finite = ref[np.isfinite(ref)]
    value_range = float(finite.max() - finite.min()) if finite.size else 0.0
    # a cut-down output's own range can be far narrower than the tensor's: the largest magnitude
    # keeps the figure from growing with the cut
    scale = max(value_range, float(np.abs(finite).max(initial=0.0)))
    if tensor_scale is not None and math.isfinite(tensor_scale):
        scale = max(scale, tensor_scale)
    metrics["max_abs_of_scale"] = metrics["max_abs"] / scale if scale > 0 else (0.0 if metrics["max_abs"] == 0 else 1e9)
    metrics.pop("max_abs_of_range", None)
    return metrics, *judge(metrics, bounds)
