"""Host checks and `webgpu-kernels` checks of each variant against the fp32 reference, and the
thresholds the browser checks use."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from pipeline.graph.model_io import model_bytes
from pipeline.precision.kept import DID_NOT_RUN, Evaluator
from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.verify import node_audit, webgpu_kernels
from pipeline.verify.host import HostRun, run_model
from pipeline.verify.metrics import compare, judge
from pipeline.verify.thresholds import threshold_for

# Ops whose kernels onnxruntime's NHWC layout transform rewrites on WebGPU.
LAYOUT_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "Resize", "InstanceNormalization", "BatchNormalization", "DepthToSpace", "SpaceToDepth", "GridSample"})
# A quantized source is its own reference: its host check bounds non-finite values only.
SELF_REFERENCE_BOUNDS = {"nan": 0, "inf": 0}


def host_checks(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, progress: Progress, model_files: dict[str, Path]) -> list[dict]:
    """report.json check entries (stage "host") of each variant on onnxruntime CPU."""
    checks: list[dict] = []
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
            checks.append({**base, "status": "failed", "metrics": {}, "threshold": {}, "detail": detail})
            continue
        bounds = {name: _bounds(variant, name, recipe, "cpu") for name in reference}
        checks.extend(output_checks(base, reference, run.outputs, bounds, {name: _kind(recipe, name) for name in reference}))
    return checks


def output_checks(base: dict, reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray], bounds: dict[str, dict], kinds: dict[str, str]) -> list[dict]:
    """One check per output of `reference`: its figures against `bounds[output]`."""
    checks = []
    for name, expected in reference.items():
        metrics = compare(expected, outputs[name], kinds.get(name, "tensor"))
        passed, reason = judge(metrics, bounds[name])
        check = {**base, "output": name, "status": "passed" if passed else "failed", "metrics": metrics, "threshold": bounds[name]}
        if reason:
            check["detail"] = reason
        checks.append(check)
    return checks


def self_reference_checks(variant: Variant, outputs: dict[str, np.ndarray], declared: list[dict]) -> list[dict]:
    """A quantized source is its own reference: on the host it can only show that it runs, with
    finite outputs of the declared shapes; the browser checks then compare against these outputs."""
    checks = []
    for entry in declared:
        value = outputs[entry["name"]]
        expected = entry["shape"]
        shape_ok = len(expected) == value.ndim and all(not isinstance(d, int) or d in (0, n) for d, n in zip(expected, value.shape))
        floating = value.dtype.kind == "f"
        metrics = {"shape_ok": shape_ok, "nan": int(np.isnan(value).sum()) if floating else 0, "inf": int(np.isinf(value).sum()) if floating else 0}
        passed = shape_ok and not metrics["nan"] and not metrics["inf"]
        check = {"stage": "host", "ep": "cpu", "variant": variant.name, "output": entry["name"], "status": "passed" if passed else "failed", "metrics": metrics, "threshold": dict(SELF_REFERENCE_BOUNDS)}
        if not passed:
            check["detail"] = f"shape {list(value.shape)} vs declared {expected}" if not shape_ok else "non-finite outputs"
        else:
            check["detail"] = "runs with finite outputs of the declared shape (the quantized source is its own reference)"
        checks.append(check)
    return checks


def _kind(recipe: Recipe, output: str) -> str:
    spec = recipe.outputs.get(output)
    return spec.kind if spec else "tensor"


def _bounds(variant: Variant, output: str, recipe: Recipe, ep: str) -> dict:
    spec = recipe.outputs.get(output)
    override = spec.thresholds.get(variant.name) if spec else None
    return threshold_for(_kind(recipe, output), variant.precision, ep, override)


def browser_thresholds(variants: list[Variant], reference: dict[str, np.ndarray], recipe: Recipe) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] for the browser harness: the wasm bounds with the recipe's
    overrides. The harness takes each output's kind from the manifest and widens fp16 on webgpu."""
    return {variant.name: {name: _bounds(variant, name, recipe, "wasm") for name in reference} for variant in variants}


def threshold_table(variants: list[Variant], reference: dict[str, np.ndarray], recipe: Recipe, variant_for: dict[str, list[str]]) -> dict[str, dict[str, dict[str, dict]]]:
    """manifest `thresholds[ep][variant][output]`: the bounds the build's checks use, exactly: the
    host checks' (cpu), and the browser harness's for every variant on each EP (fp16 on webgpu
    widened as the harness widens it)."""
    from pipeline.verify.browser.harness import webgpu_aware_threshold

    table: dict[str, dict[str, dict[str, dict]]] = {"cpu": {}}
    for variant in variants:
        table["cpu"][variant.name] = {
            name: dict(SELF_REFERENCE_BOUNDS) if variant.precision == "quantized" else _bounds(variant, name, recipe, "cpu")
            for name in reference
        }
    by_name = {variant.name: variant for variant in variants}
    browser = browser_thresholds(variants, reference, recipe)
    for ep in ("wasm", "webgpu"):
        # every variant an EP can be asked for is checked in the browser (plan_runs), wasm x fp16 too
        for name in (by_name if ep in variant_for else []):
            variant = by_name[name]
            table.setdefault(ep, {})[name] = {
                output: webgpu_aware_threshold(bounds, _kind(recipe, output), variant.precision, ep) for output, bounds in browser[name].items()
            }
    return table


def webgpu_thresholds(variants: list[Variant], reference: dict[str, np.ndarray], recipe: Recipe) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] on WebGPU: the bounds manifest `thresholds.webgpu` records (the
    browser's, fp16 widened for fp16 accumulation)."""
    from pipeline.verify.browser.harness import webgpu_aware_threshold

    browser = browser_thresholds(variants, reference, recipe)
    return {v.name: {name: webgpu_aware_threshold(bounds, _kind(recipe, name), v.precision, "webgpu") for name, bounds in browser[v.name].items()} for v in variants}


@dataclass
class KernelOutcome:
    checks: list[dict] = field(default_factory=list)  # report.json checks, stage "webgpu-kernels"
    facts: dict | None = None  # report.json "webgpu_kernels"
    ep_options: dict = field(default_factory=dict)  # the WebGPU EP options the checks settled on
    steps: list[dict] = field(default_factory=list)


def webgpu_kernel_stage(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, progress: Progress, model_files: dict[str, Path], ep_options: dict) -> KernelOutcome:
    """The build's `webgpu-kernels` stage on the fp16/fp32 variants, with the WebGPU bounds.
    `ep_options` are the package's WebGPU EP options; the outcome's are those plus a layout that
    fixed a failure."""
    float_variants = [v for v in variants if v.precision in ("fp16", "fp16w", "fp32")]
    if not float_variants:
        return KernelOutcome(ep_options=dict(ep_options))
    models = {v.name: model_files[v.name] for v in float_variants}
    kinds = {name: _kind(recipe, name) for name in reference}
    checks, facts = webgpu_kernel_checks(models, reference, feeds, webgpu_thresholds(float_variants, reference, recipe), kinds, progress, ep_options)
    steps = [{"name": "layout", "changed": True, "records": [facts["layout"]]}] if "layout" in facts else []
    return KernelOutcome(checks, facts, facts["ep_options"], steps)


def webgpu_kernel_checks(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict | None = None, retry_layout: bool = True, reference_model: Path | None = None) -> tuple[list[dict], dict]:
    """The `webgpu-kernels` stage: each variant in `models` on onnxruntime's WebGPU kernels outside
    the browser, on lavapipe, against `thresholds[variant][output]`. Returns the checks and the
    stage's facts (adapter, EP options; per variant: nodes on WebGPU, CPU fallback, times).

    As in the browser, a failure under the EP's default NHWC layout is retried with
    `preferredLayout: NCHW` (onnxruntime's NHWC transform breaks some real graphs' Conv, GTCRN's
    among them); when that passes, it is the result and facts["layout"] says why. `pack verify`
    checks a package as shipped (`retry_layout=False`).

    A variant too heavy to run whole on lavapipe is audited node by node against
    `reference_model` (default: the `fp32` variant's file); see pipeline.verify.node_audit."""
    ep_options = dict(ep_options or {})
    reference_model = reference_model or models.get("fp32")
    reason = webgpu_kernels.unavailable_reason()
    facts: dict = {"description": webgpu_kernels.DESCRIPTION, "adapter": webgpu_kernels.adapter_name() if reason is None else None, "ep_options": ep_options, "runs": {}}
    if reason:
        return [{"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": v, "status": "skipped", "metrics": {}, "threshold": {}, "detail": f"not available: {reason}"} for v in models], facts
    checks, facts["runs"], audit = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, ep_options, reference_model)
    failed = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in checks if c["status"] == "failed"]
    # a node audit's failures in ops the NHWC transform does not touch are not the layout's doing
    layout_failure = any(c["status"] == "failed" and (not c.get("failed_ops") or set(c["failed_ops"]) & LAYOUT_OPS) for c in checks)
    if failed and layout_failure and retry_layout and "preferredLayout" not in ep_options:
        progress.note(f"{webgpu_kernels.STAGE}: failed with the NHWC layout; trying preferredLayout NCHW")
        nchw = {**ep_options, "preferredLayout": "NCHW"}
        retry, runs, retry_audit = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, nchw, reference_model)
        if not any(c["status"] == "failed" for c in retry):
            checks, facts["runs"], facts["ep_options"], audit = retry, runs, nchw, retry_audit
            facts["layout"] = {"what": "webgpu preferredLayout NCHW: passes on webgpu-kernels where NHWC failed", "nhwc_failures": failed}
    if audit is not None:
        facts["audit"] = audit.facts()
    return checks, facts


def _kernel_pass(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict, reference_model: Path | None) -> tuple[list[dict], dict, object]:
    """Whole runs of the variants lavapipe can run; a node audit of those over its limits and of
    those whose whole run did not finish in time."""
    by_variant: dict[str, list[dict]] = {}
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
            by_variant[variant] = [{**base, "status": "not-verifiable", "metrics": {}, "threshold": {}, "detail": run.not_verifiable}]
        elif run.outputs is None:
            by_variant[variant] = [{**base, "status": "failed", "metrics": {}, "threshold": {}, "detail": run.error or "no outputs"}]
        else:
            by_variant[variant] = output_checks(base, reference, run.outputs, thresholds[variant], kinds)
    audit = None
    if audited and reference_model is not None:
        progress.note(f"{webgpu_kernels.STAGE}: {next(iter(audited.values())).split(':')[0]}; auditing {', '.join(audited)} node by node")
        audit = node_audit.audit_variants(reference_model, {variant: (models[variant], variant) for variant in audited}, feeds, ep_options, progress)
        for variant, why in audited.items():
            check, runs[variant] = audit_check({"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": variant}, audit, variant, why)
            by_variant[variant] = [check]
    checks = [check for variant in models for check in by_variant.get(variant, [])]
    return checks, runs, audit


def audit_check(base: dict, audit: "node_audit.AuditResult", variant: str, why_audited: str) -> tuple[dict, dict]:
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
        check = {**base, "status": "failed", "metrics": failed[0].metrics, "threshold": failed[0].threshold, "detail": detail,
                 "node": failed[0].node, "op": failed[0].op, "shape": failed[0].shape, "failed_ops": sorted({v.op for v in failed})}
    elif not verdicts or unverifiable and len(unverifiable) == len(verdicts):
        why = unverifiable[0].detail if unverifiable else "no node could be audited"
        check = {**base, "status": "not-verifiable", "metrics": {}, "threshold": {}, "detail": f"{why_audited}; the node audit could not run: {why}"}
    else:
        worst = max((v for v in verdicts if "rel_l2" in v.metrics), key=lambda v: v.metrics["rel_l2"], default=None)
        figure = f"; worst {worst.line()}" if worst else ""
        skipped = f"; {len(unverifiable)} nodes not verifiable there, {len(audit.not_audited)} not auditable (report.json webgpu_kernels.audit)" if unverifiable or audit.not_audited else ""
        check = {**base, "status": "passed", "metrics": worst.metrics if worst else {}, "threshold": worst.threshold if worst else {}, "detail": f"{audited}: every node within bounds{figure}{skipped}"}
    return check, run


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
        found = {}
        for name, expected in reference().items():
            spec = recipe.outputs.get(name)
            kind = spec.kind if spec else "tensor"
            threshold = threshold_for(kind, "fp16", ep, spec.thresholds.get("fp16") if spec else None)
            passed, reason = judge(compare(expected, result.outputs[name], kind), threshold)
            if not passed:
                found[name] = reason
        return found

    def failures(path: Path) -> dict[str, str]:
        found = failures_once(run, path)
        if found and retry is not None and "*" not in found and not failures_once(retry, path):
            return {}
        return found

    return failures


def _fp16_judge(run: Callable[[Path, dict[str, np.ndarray]], HostRun], ep: str, reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe, retry: Callable[[Path, dict[str, np.ndarray]], HostRun] | None = None) -> Callable[[Path], tuple[bool, str]]:
    failures = _fp16_failures(run, ep, reference, feeds, recipe, retry)

    def judge_model(path: Path) -> tuple[bool, str]:
        found = failures(path)
        if "*" in found:
            return False, found["*"]
        return not found, "; ".join(f"{name}: {why}" for name, why in found.items()) or "passed"

    judge_model.failures = failures  # per output, for the search
    return judge_model


def fp16_evaluators(reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe) -> list[Evaluator]:
    """The checks an fp16 candidate must pass in the keep-in-fp32 search: the host CPU check, and
    the WebGPU-kernel check (fp16 accumulation) when that stage is available on this machine."""
    host = _fp16_judge(run_model, "cpu", reference, feeds, recipe)
    evaluators = [Evaluator("host cpu", host, host.failures)]
    try:
        from pipeline.verify import webgpu_kernels
    except ImportError:
        return evaluators
    if webgpu_kernels.unavailable_reason() is None:
        nchw = lambda path, run_feeds: webgpu_kernels.run_on_webgpu(path, run_feeds, {"preferredLayout": "NCHW"})  # noqa: E731
        kernels = _fp16_judge(webgpu_kernels.run_on_webgpu, "webgpu", reference, feeds, recipe, retry=nchw)
        evaluators.append(Evaluator("webgpu-kernels", kernels, kernels.failures))
    return evaluators


def onnxruntime_refusal(feeds: dict[str, np.ndarray]) -> Callable[[onnx.ModelProto], str | None]:
    """onnxruntime's reason for refusing a converted model (run in a child), or None if it runs."""
    def refusal(model: onnx.ModelProto) -> str | None:
        with tempfile.TemporaryDirectory(prefix="pack-fp16-load-") as tmp:
            path = Path(tmp) / "fp16.onnx"
            path.write_bytes(model_bytes(model))
            run = run_model(path, feeds)
        if run.outputs is not None or run.crashes:
            return None  # a crash names no node to keep: the host check reports it
        return run.error or "onnxruntime refused the model"

    return refusal


def contradicted_kernel_errors(kernel_checks: list[dict], browser_checks: list[dict]) -> list[dict]:
    """A `webgpu-kernels` run that errored (no outputs: the native EP plugin fails some `If`
    subgraphs with "All inputs must be tensors on WebGPU buffers") while the browser passed the same
    variant on WebGPU is evidence about the plugin, not the package: not-verifiable, with the error.
    A wrong output (figures) stays a failure."""
    passed_in_browser = {c["variant"] for c in browser_checks if c["ep"] == "webgpu" and c["status"] == "passed"}
    failed_in_browser = {c["variant"] for c in browser_checks if c["ep"] == "webgpu" and c["status"] == "failed"}
    fixed = []
    for check in kernel_checks:
        if check["status"] == "failed" and not check.get("metrics") and check["variant"] in passed_in_browser - failed_in_browser:
            check = {**check, "status": "not-verifiable", "detail": f"runtime error on the native WebGPU EP ({check.get('detail', 'no outputs')}), contradicted by the browser, which ran {check['variant']} on WebGPU and passed"}
        fixed.append(check)
    return fixed
