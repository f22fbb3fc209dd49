"""Host checks and `webgpu-kernels` checks of each variant against the fp32 reference, and the
thresholds the browser checks use."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.verify.host import run_model
from pipeline.verify import webgpu_kernels
from pipeline.verify.metrics import compare, format_metrics, judge
from pipeline.verify.thresholds import threshold_for


def host_checks(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, report: dict, progress: Progress, model_files: dict[str, Path]) -> None:
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
            report["checks"].append({**base, "status": "failed", "metrics": {}, "threshold": {}, "detail": detail})
            continue
        bounds = {name: threshold_for(_kind(recipe, name), variant.precision, "cpu", _override(recipe, name, variant)) for name in reference}
        report["checks"].extend(output_checks(base, reference, run.outputs, bounds, {name: _kind(recipe, name) for name in reference}))


def _kind(recipe: Recipe, output: str) -> str:
    spec = recipe.outputs.get(output)
    return spec.kind if spec else "tensor"


def _override(recipe: Recipe, output: str, variant: Variant) -> dict | None:
    spec = recipe.outputs.get(output)
    return spec.thresholds.get(variant.name) if spec else None


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


def webgpu_thresholds(variants: list[Variant], reference: dict[str, np.ndarray], recipe: Recipe) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] on WebGPU (fp16 accumulates in fp16 there), recipe overrides included."""
    return {v.name: {name: threshold_for(_kind(recipe, name), v.precision, "webgpu", _override(recipe, name, v)) for name in reference} for v in variants}


def webgpu_kernel_stage(variants: list[Variant], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], recipe: Recipe, report: dict, progress: Progress, model_files: dict[str, Path], ep_options: dict) -> dict:
    """The build's `webgpu-kernels` stage: fp16/fp32 variants with the recipe's WebGPU bounds;
    checks into report["checks"], the stage's facts into report["webgpu_kernels"]. Returns the
    WebGPU EP options the package should ship (`ep_options` plus a layout that fixed a failure)."""
    float_variants = [v for v in variants if v.precision in ("fp16", "fp32")]
    if not float_variants:
        return ep_options
    models = {v.name: model_files[v.name] for v in float_variants}
    kinds = {name: _kind(recipe, name) for name in reference}
    checks, facts = webgpu_kernel_checks(models, reference, feeds, webgpu_thresholds(float_variants, reference, recipe), kinds, progress, ep_options)
    report["checks"].extend(checks)
    report["webgpu_kernels"] = facts
    if "layout" in facts:
        report["steps"].append({"name": "layout", "changed": True, "records": [facts["layout"]]})
    return facts["ep_options"]


def webgpu_kernel_checks(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict | None = None, retry_layout: bool = True) -> tuple[list[dict], dict]:
    """The `webgpu-kernels` stage: each variant in `models` on onnxruntime's WebGPU kernels outside
    the browser, on lavapipe, against `thresholds[variant][output]`. Returns the checks and the
    stage's facts (adapter, EP options; per variant: nodes on WebGPU, CPU fallback, times).

    As in the browser, a failure under the EP's default NHWC layout is retried with
    `preferredLayout: NCHW` (onnxruntime's NHWC transform breaks some real graphs' Conv, GTCRN's
    among them); when that passes, it is the result and facts["layout"] says why. `pack verify`
    checks a package as shipped (`retry_layout=False`)."""
    ep_options = dict(ep_options or {})
    reason = webgpu_kernels.unavailable_reason()
    facts: dict = {"description": webgpu_kernels.DESCRIPTION, "adapter": webgpu_kernels.adapter_name() if reason is None else None, "ep_options": ep_options, "runs": {}}
    if reason:
        return [{"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": v, "status": "skipped", "metrics": {}, "threshold": {}, "detail": f"not available: {reason}"} for v in models], facts
    checks, facts["runs"] = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, ep_options)
    failed = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in checks if c["status"] == "failed"]
    if failed and retry_layout and "preferredLayout" not in ep_options:
        progress.note(f"{webgpu_kernels.STAGE}: failed with the NHWC layout; trying preferredLayout NCHW")
        nchw = {**ep_options, "preferredLayout": "NCHW"}
        retry, runs = _kernel_pass(models, reference, feeds, thresholds, kinds, progress, nchw)
        if not any(c["status"] == "failed" for c in retry):
            checks, facts["runs"], facts["ep_options"] = retry, runs, nchw
            facts["layout"] = {"what": "webgpu preferredLayout NCHW: passes on webgpu-kernels where NHWC failed", "nhwc_failures": failed}
    return checks, facts


def _kernel_pass(models: dict[str, Path], reference: dict[str, np.ndarray], feeds: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], kinds: dict[str, str], progress: Progress, ep_options: dict) -> tuple[list[dict], dict]:
    checks: list[dict] = []
    runs: dict = {}
    for variant, model_path in models.items():
        base = {"stage": webgpu_kernels.STAGE, "ep": "webgpu", "variant": variant}
        progress.note(f"{webgpu_kernels.STAGE} check {variant}: {webgpu_kernels.DESCRIPTION}")
        run = webgpu_kernels.run_on_webgpu(model_path, feeds, ep_options)
        runs[variant] = {"webgpu_nodes": run.webgpu_nodes, "cpu_fallback_nodes": run.cpu_fallback_nodes, **run.timings_ms}
        if run.not_verifiable:
            checks.append({**base, "status": "not-verifiable", "metrics": {}, "threshold": {}, "detail": run.not_verifiable})
        elif run.outputs is None:
            checks.append({**base, "status": "failed", "metrics": {}, "threshold": {}, "detail": run.error or "no outputs"})
        else:
            checks.extend(output_checks(base, reference, run.outputs, thresholds[variant], kinds))
    return checks, runs


RUN_ORDER = ("failed", "not-verifiable", "skipped", "passed")


def webgpu_kernel_runs(checks: list[dict]) -> list[dict]:
    """manifest.verification.runs entries of the stage: one per variant, refusing the variant on
    the WebGPU EP of every bundle when a check failed."""
    runs: dict[str, dict] = {}
    for check in checks:
        if check["stage"] != webgpu_kernels.STAGE:
            continue
        run = runs.setdefault(check["variant"], {"stage": webgpu_kernels.STAGE, "bundle": "*", "ep": "webgpu", "variant": check["variant"], "status": "passed"})
        # the worst status wins (failed, then not-verifiable, then skipped); its first check explains it
        if RUN_ORDER.index(check["status"]) < RUN_ORDER.index(run["status"]):
            run["status"] = check["status"]
            run["detail"] = check_detail(check)
    return [runs[name] for name in sorted(runs)]


def check_detail(check: dict) -> str:
    """One line: the output, its figure against the bound, or the check's reason."""
    output = f"{check['output']}: " if check.get("output") else ""
    return f"{output}{check.get('detail') or format_metrics(check.get('metrics', {}), check.get('threshold', {}))}"


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
        check = {"stage": "host", "ep": "cpu", "variant": variant.name, "output": entry["name"], "status": "passed" if passed else "failed", "metrics": metrics, "threshold": {"nan": 0, "inf": 0}}
        if not passed:
            check["detail"] = f"shape {list(value.shape)} vs declared {expected}" if not shape_ok else "non-finite outputs"
        else:
            check["detail"] = "runs with finite outputs of the declared shape (the quantized source is its own reference)"
        checks.append(check)
    return checks


def browser_thresholds(variants: list[Variant], reference: dict[str, np.ndarray], recipe: Recipe) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] for the browser harness: the wasm bounds with the recipe's
    overrides. The harness takes each output's kind from the manifest and widens fp16 on webgpu."""
    return {v.name: {name: threshold_for(_kind(recipe, name), v.precision, "wasm", _override(recipe, name, v)) for name in reference} for v in variants}
