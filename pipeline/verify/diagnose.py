"""`pack diagnose`: find the first node where onnxruntime-web parts from onnxruntime on the host.

For each (bundle, EP) pair the model runs whole; when it fails or its outputs disagree with the host,
the model is cut into prefixes that expose intermediate tensors as outputs:
1. one run exposing every intermediate: if it runs, the first node (graph order) whose output
   disagrees with the host is the culprit;
2. otherwise (it fails, or exposing everything hides the fault) a bisection over prefixes
   `nodes[0..k]` with all their outputs exposed finds the smallest k that fails or disagrees.
Exposed outputs keep the model's own recorded type and shape where it has one: a stale shape must
stay in the prefix to show its fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime

from pipeline.graph.hazards import detect_hazards
from pipeline.graph.passes.util import copy_model, infer_shapes, node_label
from pipeline.progress import Progress
from pipeline.verify.engines.browser.models import BrowserModelRunner, ModelRun
from pipeline.verify.judgement.metrics import compare

COMBOS: tuple[tuple[str, str], ...] = (("root", "webgpu"), ("root", "wasm"), ("webgpu", "webgpu"), ("webgpu", "wasm"))
# fp32 kernels on WebGPU differ from the CPU by rounding only; a wrong slice or layout is O(1).
TOLERANCE = {"rel_l2": 1e-3, "max_abs_of_range": 1e-3}
_SAMPLE = 6  # values shown side by side


@dataclass
class Divergence:
    index: int
    node: str
    op: str
    output: str | None = None
    error: str | None = None
    host: dict[str, Any] = field(default_factory=dict)
    browser: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


def _typed_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Types for exposing tensors: the model's own records first, inference for the rest."""
    cleared = copy_model(model)
    del cleared.graph.value_info[:]
    inferred = infer_shapes(cleared)
    typed: dict[str, onnx.ValueInfoProto] = {}
    for value in inferred.graph.value_info:
        if value.type.tensor_type.elem_type:
            bare = onnx.helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, None)
            typed[value.name] = bare
    for value in model.graph.value_info:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            typed[value.name] = value
    for value in model.graph.output:
        typed[value.name] = value
    return typed


def exposed_prefix(model: onnx.ModelProto, last: int, typed: dict[str, onnx.ValueInfoProto]) -> tuple[onnx.ModelProto, list[str]]:
    """Nodes 0..last with every output they produce made a graph output (those with a known type)."""
    prefix = copy_model(model)
    graph = prefix.graph
    kept = list(model.graph.node[: last + 1])
    del graph.node[:]
    graph.node.extend(kept)
    names = [o for node in kept for o in node.output if o and o in typed]
    del graph.output[:]
    graph.output.extend(typed[name] for name in names)
    return prefix, names


def host_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every intermediate tensor and output as onnxruntime CPU computes them."""
    typed = _typed_values(model)
    exposed, names = exposed_prefix(model, len(model.graph.node) - 1, typed)
    # The host must not trip over the shapes under diagnosis: give it bare types.
    del exposed.graph.output[:]
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(n, typed[n].type.tensor_type.elem_type, None) for n in names)
    del exposed.graph.value_info[:]
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(exposed.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(names, feeds)))


def _summary(array: np.ndarray) -> dict[str, Any]:
    flat = np.asarray(array).reshape(-1)
    values = flat[:_SAMPLE].tolist()
    return {"shape": list(np.shape(array)), "dtype": str(array.dtype), "first": [round(v, 6) if isinstance(v, float) else v for v in values]}


def agrees(reference: np.ndarray, actual: np.ndarray) -> tuple[bool, dict]:
    metrics = compare(reference, actual)
    if not metrics["shape_ok"]:
        return False, metrics
    if "mismatches" in metrics:
        return metrics["mismatches"] == 0, metrics
    ok = metrics["nan"] == 0 and metrics["inf"] == 0 and all(metrics[k] <= bound for k, bound in TOLERANCE.items())
    return ok, metrics


def first_disagreement(model: onnx.ModelProto, run: ModelRun, host: dict[str, np.ndarray], upto: int) -> Divergence | None:
    """The first node (graph order, up to `upto`) with an output the browser got wrong or did not return."""
    for index, node in enumerate(model.graph.node[: upto + 1]):
        for output in node.output:
            if output not in host:
                continue
            if output in run.output_errors:
                return Divergence(index, node_label(node, index), node.op_type, output, error=run.output_errors[output])
            if output not in run.outputs:
                continue
            ok, metrics = agrees(host[output], run.outputs[output])
            if not ok:
                return Divergence(index, node_label(node, index), node.op_type, output,
                                  host=_summary(host[output]), browser=_summary(run.outputs[output]),
                                  metrics={k: v for k, v in metrics.items() if not isinstance(v, list)})
    return None


def _bisect(failing: Callable[[int], bool], count: int) -> int:
    """The smallest k in [0, count) with failing(k), given failing(count - 1)."""
    low, high = 0, count - 1
    while low < high:
        middle = (low + high) // 2
        if failing(middle):
            high = middle
        else:
            low = middle + 1
    return low


def locate(model: onnx.ModelProto, feeds: dict[str, np.ndarray], host: dict[str, np.ndarray],
           runner: BrowserModelRunner, bundle: str, ep: str) -> dict[str, Any]:
    """Run `model` on one bundle/EP; when it fails or disagrees, the first node where it parts."""
    outcome: dict[str, Any] = {"bundle": bundle, "ep": ep, "sessions": 1}
    whole = runner.run(model, feeds, bundle, ep)
    output_names = [o.name for o in model.graph.output]
    divergence = None if whole.ok else "fails"
    if whole.ok:
        for name in output_names:
            if name not in whole.outputs or not agrees(host[name], whole.outputs[name])[0]:
                divergence = "disagrees"
                break
    if divergence is None:
        outcome.update(status="agrees", detail="every output matches the host")
        return outcome
    outcome["whole_model"] = whole.why() if whole.ok is False else "outputs disagree with the host"

    typed = _typed_values(model)
    count = len(model.graph.node)
    results: dict[int, ModelRun] = {}

    def prefix_run(last: int) -> ModelRun:
        if last not in results:
            prefix, _ = exposed_prefix(model, last, typed)
            results[last] = runner.run(prefix, feeds, bundle, ep)
            outcome["sessions"] += 1
        return results[last]

    def failing(last: int) -> bool:
        run = prefix_run(last)
        return not run.ok or first_disagreement(model, run, host, last) is not None

    everything = prefix_run(count - 1)
    if everything.ok:
        found = first_disagreement(model, everything, host, count - 1)
        if found is not None:
            return _parted(outcome, found, "intermediates")
        outcome.update(status="not-localised",
                       detail="exposing the intermediates makes every tensor match the host: the fault depends on how the whole graph is optimised")
        return outcome
    # Output-size warnings name tensors that already came out wrong: the earliest bounds the search.
    suspects = [index for index, node in enumerate(model.graph.node) if set(node.output) & _mis_sized(everything)]
    upper = suspects[0] if suspects and failing(suspects[0]) else count - 1
    culprit = _bisect(failing, upper + 1)
    run = prefix_run(culprit)
    if run.ok:
        found = first_disagreement(model, run, host, culprit)
        assert found is not None
        return _parted(outcome, found, "bisection")
    node = model.graph.node[culprit]
    return _parted(outcome, Divergence(culprit, node_label(node, culprit), node.op_type, error=run.why()), "bisection")


_SIZE_WARNING = re.compile(r"does not match actual shape of \{[^}]*\} for output (\S+)")


def _mis_sized(run: ModelRun) -> set[str]:
    return {match.group(1) for signal in run.signals if (match := _SIZE_WARNING.search(signal))}


def _parted(outcome: dict[str, Any], found: Divergence, how: str) -> dict[str, Any]:
    outcome.update(status="parts", how=how, index=found.index, node=found.node, op=found.op, output=found.output)
    if found.error:
        outcome["error"] = found.error
    else:
        outcome.update(host=found.host, browser=found.browser, metrics=found.metrics)
    return outcome


def random_feeds(model: onnx.ModelProto, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: normal floats, small non-negative integers, symbolic dims from `dims` (default 1)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in value.type.tensor_type.shape.dim]
        dtype = np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def diagnose(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    runner: BrowserModelRunner,
    combos: tuple[tuple[str, str], ...] = COMBOS,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The diagnosis document (`pack diagnose --json`)."""
    progress = progress or Progress.quiet()
    host = host_values(model, feeds)
    hazards = {h["node"]: h for h in detect_hazards(model)}
    runs = []
    with progress.task("Browser runs", total=len(combos)) as task:
        for bundle, ep in combos:
            outcome = locate(model, feeds, host, runner, bundle, ep)
            if outcome.get("node") in hazards:
                hazard = hazards[outcome["node"]]
                outcome["hazard"] = {k: hazard[k] for k in ("hazard", "repair", "detail")}
            runs.append(outcome)
            task.advance()
    return {
        "runtime": runner.runtime.version,
        "inputs": {name: list(array.shape) for name, array in feeds.items()},
        "runs": runs,
        "parted": sum(run["status"] != "agrees" for run in runs),
    }


def human_lines(document: dict[str, Any]) -> list[str]:
    """One block per bundle/EP: agrees, or the node where it parts with host and browser side by side."""
    lines = [f"onnxruntime-web {document['runtime']}, inputs {document['inputs']}"]
    for run in document["runs"]:
        where = f"{run['bundle']} bundle, {run['ep']} EP"
        if run["status"] == "agrees":
            lines.append(f"{where}: agrees with onnxruntime on the host")
            continue
        if run["status"] == "not-localised":
            lines.append(f"{where}: {run['whole_model']}; not localised: {run['detail']}")
            continue
        lines.append(f"{where}: parts at node '{run['node']}' ({run['op']}, #{run['index']})"
                     + (f", output '{run['output']}'" if run.get("output") else "") + f" [{run['sessions']} sessions]")
        if "error" in run:
            lines.append(f"    browser: {run['error']}")
            lines.append("    host:    runs")
        else:
            host, browser = run["host"], run["browser"]
            width = max(len(str(host["shape"])), len(str(host["first"])), len("host (onnxruntime CPU)")) + 2
            lines.append(f"    {'':8}{'host (onnxruntime CPU)':<{width}}browser")
            lines.append(f"    {'shape':8}{str(host['shape']):<{width}}{browser['shape']}")
            lines.append(f"    {'first':8}{str(host['first']):<{width}}{browser['first']}")
            metrics = run.get("metrics", {})
            if "max_abs" in metrics:
                lines.append(f"    max abs error {metrics['max_abs']:.3g}, relative L2 {metrics.get('rel_l2', 0):.3g}")
        if "hazard" in run:
            hazard = run["hazard"]
            fix = f"repair: {hazard['repair']}" if hazard["repair"] else "no repair in pack"
            lines.append(f"    known hazard {hazard['hazard']} ({fix}): {hazard['detail']}")
    return lines
