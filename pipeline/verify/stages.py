"""The host and `webgpu-kernels` stages: each variant on onnxruntime CPU (host.py) and on
onnxruntime's WebGPU kernels on lavapipe (webgpu_kernels.py, node by node where a whole run is too
heavy: node_audit.py), each output checked against the fp32 reference (checks.py) within its bounds
(thresholds.py); and the fp16 search's evaluators, the same checks on a candidate conversion."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from pipeline.cache import temporary_folder
from pipeline.errors import PackError
from pipeline.graph.model_io import model_bytes
from pipeline.precision.kept_nodes import DID_NOT_RUN, Evaluator
from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.verify.engines import node_audit, webgpu_kernels
from pipeline.verify.judgement.checks import Check, check, layout_verdict, output_checks, output_failures
from pipeline.verify.engines.host import HostRun, run_model
from pipeline.verify.judgement.thresholds import FLOAT_PRECISIONS, ep_thresholds, output_judging, output_kind, recipe_bounds, search_bounds

# Ops whose kernels onnxruntime's NHWC layout transform rewrites on WebGPU.
LAYOUT_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "Resize", "InstanceNormalization", "BatchNormalization", "DepthToSpace", "SpaceToDepth", "GridSample"})


def reference_outputs(reference_model: onnx.ModelProto, variants: list[Variant], model_paths: dict[str, Path], feeds: dict[str, np.ndarray], source_path: Path) -> dict[str, np.ndarray]:
    """fp32 outputs on onnxruntime CPU: the reference every check compares against (the shipped
    fp32 file when there is one, so the run is the host check's own, cached)."""
    shipped = next((model_paths[v.name] for v in variants if v.model is reference_model), None)
    with temporary_folder("pack-ref-") as tmp:
        model_file = shipped or Path(tmp) / "reference.onnx"
        if shipped is None:
            model_file.write_bytes(model_bytes(reference_model))
        run = run_model(model_file, feeds)
    if run.outputs is None:
        raise PackError(f"{source_path.name}: onnxruntime cannot run the model on the sample inputs: {run.error}; check the inputs (--input/--inputs) and the model")
    for name, values in run.outputs.items():
        bad = ~np.isfinite(values) if values.dtype.kind == "f" else None
        if bad is not None and bad.any():
            index = [int(i) for i in np.argwhere(bad)[0]] if values.ndim else []
            raise PackError(f"{source_path.name}: the fp32 reference output '{name}' has {int(bad.sum())} NaN or Inf values of {values.size} (first at index {index}) "
                            "on finite sample inputs: the model yields NaN on this sample; give another (--inputs, or the recipe's inputs tables)")
    return run.outputs


def host_checks(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, progress: Progress, model_files: dict[str, Path]) -> list[Check]:
    """report.json check entries (stage "host") of each variant on onnxruntime CPU."""
    checks: list[Check] = []
    kinds = {name: output_kind(recipe, name) for name in reference}
    for variant in variants:
        progress.note(f"host check {variant.name} on onnxruntime CPU")
        run = run_model(model_files[variant.name], feeds)
        base = {"stage": "host", "ep": "cpu", "variant": variant.name}
        if run.crashes:
            base["crashes"] = run.crashes
            base["optimization_level"] = run.level
        if run.outputs is None:
            is_if = any(n.op_type in ("If", "Loop", "Scan") for n in variant.model.graph.node)
            detail = run.error or "no outputs"
            if variant.precision == "fp16" and is_if:
                detail += "; the model has If/Loop/Scan subgraphs, which fp16 conversion does not handle: fold them (repair fold_if) or ship fp32 only (variants = ['fp32'])"
            checks.append(check(**base, status="failed", detail=detail))
            continue
        bounds = {name: recipe_bounds(recipe, variant.name, variant.precision, name, "cpu") for name in reference}
        checks.extend(output_checks(base, reference, run.outputs, bounds, kinds, {name: output_judging(recipe, name) for name in reference}))
    return checks


@dataclass
class KernelOutcome:
    checks: list[Check] = field(default_factory=list)  # report.json checks, stage "webgpu-kernels"
    facts: dict | None = None  # report.json "webgpu_kernels"
    ep_options: dict = field(default_factory=dict)  # the WebGPU EP options the checks settled on
    steps: list[dict] = field(default_factory=list)


def webgpu_kernel_stage(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, progress: Progress, model_files: dict[str, Path], ep_options: dict) -> KernelOutcome:
    """The build's `webgpu-kernels` stage on the fp16/fp32 variants, with the WebGPU bounds.
    `ep_options` are the package's WebGPU EP options; the outcome's are those plus a layout that
    fixed a failure."""
    # a quantized variant runs like any against its float twin where a chain puts it on WebGPU; a row says why not
    on_webgpu = any("webgpu" in chain for chain in recipe.chains.values())
    unjudged = [check(webgpu_kernels.STAGE, "webgpu", v.name, "skipped", detail=f"no fp32 reference to judge it by ({v.self_reference})" if v.self_reference else "no platform chain runs it on WebGPU")
                for v in variants if v.precision == "quantized" and (v.self_reference or not on_webgpu)]
    judged = [v for v in variants if v.precision in FLOAT_PRECISIONS or (v.precision == "quantized" and not v.self_reference and on_webgpu)]
    if not judged:
        return KernelOutcome(unjudged, ep_options=dict(ep_options))
    models = {v.name: model_files[v.name] for v in judged}
    kinds = {name: output_kind(recipe, name) for name in reference}
    judging = {name: output_judging(recipe, name) for name in reference}
    checks, facts = webgpu_kernel_checks(models, reference, feeds, ep_thresholds(judged, list(reference), recipe, "webgpu"), kinds, progress, ep_options, judging=judging)
    checks += unjudged
    steps = [{"name": "layout", "changed": True, "records": [facts["layout"]]}] if "layout" in facts else []
    return KernelOutcome(checks, facts, facts["ep_options"], steps)


def webgpu_kernel_checks(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict | None = None, retry_layout: bool = True, reference_model: Path | None = None,
                         judging: dict[str, dict] | None = None) -> tuple[list[Check], dict]:
    """The `webgpu-kernels` stage: each variant in `models` on onnxruntime's WebGPU kernels outside
    the browser, on lavapipe, against `thresholds[variant][output]`. Returns the checks and the
    stage's facts (adapter, EP options; per variant: nodes on WebGPU, CPU fallback, times).

    As in the browser, a failure under the EP's default NHWC layout is retried with
    `preferredLayout: NCHW` (onnxruntime's NHWC transform breaks some real graphs' Conv, GTCRN's
    among them); when that passes, it is the result and facts["layout"] says why. `pack verify`
    checks a package as shipped (`retry_layout=False`).

    A variant too heavy to run whole on lavapipe is audited node by node against
    `reference_model` (default: the `fp32` variant's file); see pipeline.verify.engines.node_audit.
    `judging`: per output its decision and parts (checks.output_checks)."""
    ep_options = dict(ep_options or {})
    reference_model = reference_model or models.get("fp32")
    reason = webgpu_kernels.unavailable_reason()
    facts: dict = {"description": webgpu_kernels.DESCRIPTION, "adapter": webgpu_kernels.adapter_name() if reason is None else None, "ep_options": ep_options, "runs": {}}
    if reason:
        return [check(webgpu_kernels.STAGE, "webgpu", v, "skipped", detail=f"not available: {reason}") for v in models], facts
    checks, facts["runs"], audit = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, ep_options, reference_model, judging)
    failed = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in checks if c["status"] == "failed"]
    # a node audit's failures in ops the NHWC transform does not touch are not the layout's doing
    layout_failure = any(c["status"] == "failed" and (not c.get("failed_ops") or set(c["failed_ops"]) & LAYOUT_OPS) for c in checks)
    if failed and layout_failure and retry_layout and "preferredLayout" not in ep_options:
        progress.note(f"{webgpu_kernels.STAGE}: failed with the NHWC layout; trying preferredLayout NCHW")
        nchw = {**ep_options, "preferredLayout": "NCHW"}
        retry, runs, retry_audit = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, nchw, reference_model, judging)
        adopted = layout_verdict(checks, retry)
        if adopted:
            checks, facts["runs"], facts["ep_options"], audit = retry, runs, nchw, retry_audit
            facts["layout"] = {"what": adopted.replace(" passes where", " passes on webgpu-kernels where"), "nhwc_failures": failed}
    if audit is not None:
        facts["audit"] = audit.facts()
    return checks, facts


def _kernel_pass(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict, reference_model: Path | None,
                 judging: dict[str, dict] | None = None) -> tuple[list[Check], dict, object]:
    """Whole runs of the variants lavapipe can run; a node audit of those over its limits and of
    those whose whole run did not finish in time."""
    by_variant: dict[str, list[Check]] = {}
    runs: dict = {}
    audited = {variant: why for variant, path in models.items() if (why := webgpu_kernels.whole_run_limit(path, feeds))}
    for variant, model_path in models.items():
        base = {"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": variant}
        if variant in audited and reference_model is not None:
            continue
        progress.note(f"{webgpu_kernels.STAGE} check {variant}: {webgpu_kernels.DESCRIPTION}")
        run = webgpu_kernels.run_on_webgpu(model_path, feeds, ep_options)
        runs[variant] = {"webgpu_nodes": run.webgpu_nodes, "cpu_fallback_nodes": run.cpu_fallback_nodes, **run.timings_ms}
        if run.not_verifiable and run.not_verifiable.startswith(webgpu_kernels.TIMED_OUT) and reference_model is not None:
            audited[variant] = run.not_verifiable
        elif run.not_verifiable:
            by_variant[variant] = [check(**base, status="not-verifiable", detail=run.not_verifiable)]
        elif run.outputs is None:
            by_variant[variant] = [check(**base, status="failed", detail=run.error or "no outputs")]
        else:
            by_variant[variant] = output_checks(base, reference, run.outputs, thresholds[variant], kinds, judging)
    audit = None
    if audited and reference_model is not None:
        progress.note(f"{webgpu_kernels.STAGE}: {next(iter(audited.values())).split(':')[0]}; auditing {', '.join(audited)} node by node")
        audit = node_audit.audit_variants(reference_model, {variant: (models[variant], variant) for variant in audited}, feeds, ep_options, progress)
        for variant, why in audited.items():
            verdict, runs[variant] = audit_check({"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": variant}, audit, variant, why)
            by_variant[variant] = [verdict]
    checks = [entry for variant in models for entry in by_variant.get(variant, [])]
    return checks, runs, audit


def audit_check(base: dict, audit: "node_audit.AuditResult", variant: str, why_audited: str) -> tuple[Check, dict]:
    """The stage's check of a variant judged by the node audit (failed when any node failed, naming
    the worst), and its runs entry for report.json."""
    verdicts = audit.verdicts.get(variant, [])
    failed = sorted(audit.failed(variant), key=lambda v: -v.metrics.get("rel_l2", 1e9))
    unverifiable = [v for v in verdicts if v.status == "not-verifiable"]
    run = {"audit": {"nodes": len(verdicts), "failed": len(failed), "not_verifiable": len(unverifiable), "not_audited": len(audit.not_audited), **audit.timings_s}}
    audited = f"node audit of {len(verdicts)} nodes ({why_audited.split(':')[0]})"
    if failed:
        more = f" (+{len(failed) - 1} more: " + ", ".join(f"{v.node} ({v.op})" for v in failed[1:6]) + (", ..." if len(failed) > 6 else "") + ")" if len(failed) > 1 else ""
        detail = f"node {failed[0].line()}{more}; {audited}"
        verdict = check(**base, status="failed", metrics=failed[0].metrics, threshold=failed[0].threshold, detail=detail,
                        node=failed[0].node, op=failed[0].op, shape=failed[0].shape, failed_ops=sorted({v.op for v in failed}))
    elif not verdicts or unverifiable and len(unverifiable) == len(verdicts):
        why = unverifiable[0].detail if unverifiable else "no node could be audited"
        verdict = check(**base, status="not-verifiable", detail=f"{why_audited}; the node audit could not run: {why}")
    else:
        worst = max((v for v in verdicts if "rel_l2" in v.metrics), key=lambda v: v.metrics["rel_l2"], default=None)
        figure = f"; worst {worst.line()}" if worst else ""
        skipped = f"; {len(unverifiable)} nodes not verifiable there, {len(audit.not_audited)} not auditable (report.json webgpu_kernels.audit)" if unverifiable or audit.not_audited else ""
        cut = sum(1 for v in verdicts if v.cut)
        # what a pass does not cover: a cut node is judged at its first outputs only, and each node on exact inputs
        coverage = f"{cut} of them cut to their first outputs, each fed the host's fp32 values (a kernel error further along a cut node, and error that builds up from node to node, are not covered)"
        verdict = check(**base, status="passed", metrics=worst.metrics if worst else {}, threshold=worst.threshold if worst else {}, detail=f"{audited}: every node within bounds, {coverage}{figure}{skipped}")
    return verdict, run


def _fp16_failures(run: Callable[[Path, dict[str, np.ndarray]], HostRun], ep: str, reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe, retry: Callable[[Path, dict[str, np.ndarray]], HostRun] | None = None) -> Callable[[Path], dict[str, str]]:
    """{output: why} for each output a candidate fails (each output judged separately; `"*"` when it
    did not run). `retry`: the run the stage itself falls back to (the NCHW layout on WebGPU): a
    candidate that fails only under the default layout passes, as the package will ship it, so no
    search starts for a failure that the layout retry fixes (GTCRN's Conv)."""
    def failures_once(runner: Callable[[Path, dict[str, np.ndarray]], HostRun], path: Path) -> dict[str, str]:
        result = runner(path, feeds)
        if getattr(result, "not_verifiable", None):
            return {}  # e.g. over lavapipe's buffer limit: blocks no candidate
        if result.outputs is None:
            return {"*": f"{DID_NOT_RUN}: {result.error or 'no outputs'}"}
        expected = reference()
        bounds = {name: search_bounds(recipe, name, ep) for name in expected}
        return output_failures(expected, result.outputs, bounds, {name: output_kind(recipe, name) for name in expected}, {name: output_judging(recipe, name) for name in expected})

    def failures(path: Path) -> dict[str, str]:
        found = failures_once(run, path)
        if found and retry is not None and "*" not in found and not failures_once(retry, path):
            return {}
        return found

    return failures


def _fp16_judge(run: Callable[[Path, dict[str, np.ndarray]], HostRun], ep: str, reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe, retry: Callable[[Path, dict[str, np.ndarray]], HostRun] | None = None) -> Callable[[Path], tuple[bool, str]]:
    failures = _fp16_failures(run, ep, reference, feeds, recipe, retry)
    judge_model = _judge_of(failures)
    judge_model.failures = failures  # per output, for the search
    return judge_model


def _judge_of(failures: Callable[[Path], dict[str, str]]) -> Callable[[Path], tuple[bool, str]]:
    """(passed, one-line detail) of a candidate from its failures per output."""
    def judge_model(path: Path) -> tuple[bool, str]:
        found = failures(path)
        if "*" in found:
            return False, found["*"]
        return not found, "; ".join(f"{name}: {why}" for name, why in found.items()) or "passed"

    return judge_model


def fp16_evaluators(reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe, model: onnx.ModelProto | None = None) -> list[Evaluator]:
    """The checks an fp16 candidate must pass in the keep-in-fp32 search: the host CPU check, and
    the WebGPU-kernel check (fp16 accumulation) when that stage is available on this machine. A
    candidate over the whole-run limit is judged as the stage judges it, by the node audit against
    the fp32 `model` (audit_evaluator.py: its failed nodes are the failures, each trial re-runs only
    the nodes whose precision changed); without `model` such a candidate blocks nothing."""
    host = _fp16_judge(run_model, "cpu", reference, feeds, recipe)
    # The host's failures are ranked from the host's own fp32 run (ranking.rank_nodes): no divergence run
    evaluators = [Evaluator("host cpu", host, host.failures)]
    try:
        from pipeline.verify.engines import webgpu_kernels
    except ImportError:
        return evaluators
    if webgpu_kernels.unavailable_reason() is None:
        nchw = lambda path, run_feeds: webgpu_kernels.run_on_webgpu(path, run_feeds, {"preferredLayout": "NCHW"})  # noqa: E731
        whole = _fp16_judge(webgpu_kernels.run_on_webgpu, "webgpu", reference, feeds, recipe, retry=nchw)
        run_whole = lambda path, run_feeds: webgpu_kernels.run_on_webgpu(path, run_feeds).outputs  # noqa: E731 - None over the whole-run limit
        if model is None:
            evaluators.append(Evaluator("webgpu-kernels", whole, whole.failures, run_outputs=run_whole))
            return evaluators
        from pipeline.verify.audit_evaluator import CandidateAudit

        audit = CandidateAudit(model, feeds, "fp16", LAYOUT_OPS)

        def failures(path: Path) -> dict[str, str]:
            return audit.failures(path) if webgpu_kernels.whole_run_limit(path, feeds) else whole.failures(path)

        def failing_nodes(path: Path) -> dict[str, str]:
            return audit.failing_nodes(path) if webgpu_kernels.whole_run_limit(path, feeds) else {}

        evaluators.append(Evaluator("webgpu-kernels", _judge_of(failures), failures, failing_nodes, audit.facts, run_whole))
    return evaluators


def onnxruntime_refusal(feeds: dict[str, np.ndarray]) -> Callable[[onnx.ModelProto], str | None]:
    """onnxruntime's reason for refusing a converted model (run in a child), or None if it runs."""
    def refusal(model: onnx.ModelProto) -> str | None:
        with temporary_folder("pack-fp16-load-") as tmp:
            path = Path(tmp) / "fp16.onnx"
            path.write_bytes(model_bytes(model))
            run = run_model(path, feeds)
        if run.outputs is not None or run.crashes:
            return None  # a crash names no node to keep: the host check reports it
        return run.error or "onnxruntime refused the model"

    return refusal
