"""The node audit as the fp16 search's `webgpu-kernels` evaluator, for models too heavy to run whole
on lavapipe (the stage audits those node by node: node_audit.py).

The reference's part is done once per build: the audit plan, the host run that yields each node's
fp32 inputs, and the fp32 node on onnxruntime CPU. A candidate (an fp16 conversion with some nodes
kept in fp32) is then cut into its one-node models, and each node's verdict is cached by what that
model is (the node, the types it reads and the values fed to it, so the node's own precision and
its inputs' precision): a trial runs on lavapipe only the nodes whose precision, or whose inputs'
precision, changed since an earlier trial. A verdict depends only on its one-node model, so the
outcome is the same with a cold or warm cache and on any machine.

The audit judges each node on the host's fp32 values, so a node that fails in fp16 fails in every
candidate that leaves it in fp16: the search keeps the nodes the audit names without bisecting
(`failing_nodes`) and maps each failure to the model outputs downstream of it (`failures`).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from pipeline.verify.engines import node_audit
from pipeline.verify.engines.node_audit import NodeVerdict

NCHW = {"preferredLayout": "NCHW"}


class CandidateAudit:
    """Node verdicts of fp16 candidates of one fp32 `reference` on `feeds`, cached per node model."""

    def __init__(self, reference: onnx.ModelProto, feeds: dict[str, np.ndarray], precision: str = "fp16", layout_ops: frozenset[str] = frozenset()):
        self.reference = reference
        self.feeds = feeds
        self.precision = precision
        self.layout_ops = layout_ops  # ops whose failure the stage retries under the NCHW layout
        self._prepared: tuple | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="pack-audit-search-")
        self._reference_runs: dict[int, object] = {}  # job index -> the fp32 node's outputs on CPU
        self._verdicts: dict[tuple[str, str], NodeVerdict] = {}  # (layout, node model key) -> verdict
        self._by_file: dict[str, tuple[list[NodeVerdict], dict[str, str]]] = {}  # candidate sha -> last audit
        self.runs = 0  # candidate nodes run on lavapipe
        self.cached = 0  # candidate nodes whose verdict was reused
        self.seconds = 0.0

    def _prepare(self) -> tuple:
        if self._prepared is None:
            jobs, _ = node_audit._plan(self.reference, self.feeds)
            values = node_audit._host_values(self.reference, jobs, self.feeds, Path(self._tmp.name))
            self._prepared = (jobs, values)
        return self._prepared

    def verdicts(self, candidate_path: Path, ep_options: dict | None = None) -> tuple[list[NodeVerdict], dict[str, str]]:
        """(verdict per audited node, {verdict label: the candidate's node name})."""
        layout = repr(sorted((ep_options or {}).items()))
        data = Path(candidate_path).read_bytes()
        memo = f"{hashlib.sha256(data).hexdigest()}|{layout}"
        if memo in self._by_file:
            return self._by_file[memo]
        started = time.perf_counter()
        try:
            return self._audit(data, memo, layout, ep_options)
        finally:
            self.seconds += time.perf_counter() - started

    def facts(self) -> dict:
        """What the audits cost so far: candidates audited, node runs on lavapipe, verdicts reused."""
        return {"audits": len(self._by_file), "node_runs": self.runs, "verdicts_reused": self.cached, "seconds": round(self.seconds, 2)}

    def _audit(self, data: bytes, memo: str, layout: str, ep_options: dict | None) -> tuple[list[NodeVerdict], dict[str, str]]:
        jobs, values = self._prepare()
        if isinstance(values, str):
            found = [NodeVerdict("*", "*", [], "not-verifiable", f"the host run of the fp32 model for the audit failed: {values}")], {}
            self._by_file[memo] = found
            return found
        candidate = onnx.load_from_string(data)
        built, _ = node_audit._node_models({"reference": (self.reference, "fp32"), "candidate": (candidate, self.precision)}, jobs, values)
        keys = {item.job.index: (layout, _node_key(item.models["candidate"])) for item in built}
        todo = [item for item in built if keys[item.job.index] not in self._verdicts]
        self.cached += len(built) - len(todo)
        if todo:
            tmp = Path(self._tmp.name)
            fresh = [item for item in todo if item.job.index not in self._reference_runs]
            if fresh:
                ran = node_audit._run_groups(fresh, {"reference": self.reference}, tmp, {}, None)
                self._reference_runs.update({item.job.index: ran[("reference", item.job.index)] for item in fresh})
            ran = node_audit._run_groups(todo, {"candidate": candidate}, tmp, dict(ep_options or {}), None)
            ran.update({("reference", item.job.index): self._reference_runs[item.job.index] for item in todo})
            self.runs += len(todo)
            for item, verdict in zip(todo, node_audit._verdicts(todo, ran, "candidate", self.precision, values)):
                self._verdicts[keys[item.job.index]] = verdict
        # the audit matches nodes by name, else by first output (node_audit._node_models)
        by_name = {n.name for n in candidate.graph.node if n.name}
        by_output = {n.output[0]: n.name for n in candidate.graph.node if n.output and n.name}
        names = {}
        for item in built:
            node = item.job.node
            names[item.job.label] = node.name if node.name in by_name else by_output.get(node.output[0], item.job.label)
        found = [self._verdicts[keys[item.job.index]] for item in built], names
        self._by_file[memo] = found
        return found

    def failed(self, candidate_path: Path) -> tuple[list[NodeVerdict], dict[str, str]]:
        """The failed verdicts (worst first) as the stage would judge the candidate: under the
        default layout, or none when a failure in a layout op passes under NCHW (the stage's
        retry, so the package ships NCHW)."""
        verdicts, names = self.verdicts(candidate_path)
        failed = [v for v in verdicts if v.status == "failed"]
        if failed and {v.op for v in failed} & self.layout_ops:
            retry, _ = self.verdicts(candidate_path, NCHW)
            if not any(v.status == "failed" for v in retry):
                return [], names
        return sorted(failed, key=lambda v: -v.metrics.get("max_abs_of_scale", 1e9)), names

    def failing_nodes(self, candidate_path: Path) -> dict[str, str]:
        """{candidate node name: the verdict line} for each node the audit fails, worst first."""
        failed, names = self.failed(candidate_path)
        return {names.get(v.node, v.node): f"node audit: {v.line()}" for v in failed}

    def failures(self, candidate_path: Path) -> dict[str, str]:
        """{model output: why} for each output downstream of a failed node (the search judges
        each output on its own)."""
        failed, names = self.failed(candidate_path)
        if not failed:
            return {}
        candidate = onnx.load(str(candidate_path), load_external_data=False)
        reaches = _outputs_reached(candidate, {names.get(v.node, v.node) for v in failed})
        per_output: dict[str, list[NodeVerdict]] = {}
        every = [o.name for o in candidate.graph.output]
        for verdict in failed:
            for output in sorted(reaches.get(names.get(verdict.node, verdict.node), ())) or every:
                per_output.setdefault(output, []).append(verdict)
        found = {}
        for output, verdicts in per_output.items():
            more = f" (+{len(verdicts) - 1} more failing nodes)" if len(verdicts) > 1 else ""
            found[output] = f"node audit: node {verdicts[0].line()}{more}"
        return found


def _node_key(parts) -> str:
    """What a one-node model is: the node, the types it reads, its weights and the values fed to it."""
    node, inputs, initializers, feeds = parts
    digest = hashlib.sha256(node.SerializeToString(deterministic=True))
    for value in inputs:
        digest.update(value.SerializeToString(deterministic=True))
    for tensor in initializers:
        digest.update(tensor.SerializeToString(deterministic=True))
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _outputs_reached(model: onnx.ModelProto, nodes: set[str]) -> dict[str, set[str]]:
    """{node name: the graph outputs computed from it} in the main graph, for `nodes`."""
    outputs = {o.name for o in model.graph.output}
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    reached: dict[str, set[str]] = {}
    for node in model.graph.node:
        if node.name not in nodes:
            continue
        seen, stack, found = set(), list(node.output), set()
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor in outputs:
                found.add(tensor)
            for reader in readers.get(tensor, []):
                stack.extend(reader.output)
        reached[node.name] = found
    return reached
