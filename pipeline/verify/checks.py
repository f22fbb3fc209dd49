"""Host checks of each variant against the fp32 reference, and the thresholds the browser checks use."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from pipeline.graph.model_io import model_bytes
from pipeline.precision.kept import DID_NOT_RUN, Evaluator
from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.verify.host import HostRun, run_model
from pipeline.verify.metrics import compare, judge
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
        for name, expected in reference.items():
            spec = recipe.outputs.get(name)
            kind = spec.kind if spec else "tensor"
            threshold = threshold_for(kind, variant.precision, "cpu", spec.thresholds.get(variant.name) if spec else None)
            metrics = compare(expected, run.outputs[name], kind)
            passed, reason = judge(metrics, threshold)
            check = {**base, "output": name, "status": "passed" if passed else "failed", "metrics": metrics, "threshold": threshold}
            if reason:
                check["detail"] = reason
            report["checks"].append(check)


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
    table: dict[str, dict[str, dict]] = {}
    for variant in variants:
        table[variant.name] = {}
        for name in reference:
            spec = recipe.outputs.get(name)
            kind = spec.kind if spec else "tensor"
            override = spec.thresholds.get(variant.name) if spec else None
            table[variant.name][name] = threshold_for(kind, variant.precision, "wasm", override)
    return table


def _fp16_judge(run: Callable[[Path, dict[str, np.ndarray]], HostRun], ep: str, reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe) -> Callable[[Path], tuple[bool, str]]:
    def judge_model(path: Path) -> tuple[bool, str]:
        result = run(path, feeds)
        if getattr(result, "not_verifiable", None):
            return True, f"not verifiable: {result.not_verifiable}"  # e.g. over lavapipe's buffer limit
        if result.outputs is None:
            return False, f"{DID_NOT_RUN}: {result.error or 'no outputs'}"
        for name, expected in reference().items():
            spec = recipe.outputs.get(name)
            kind = spec.kind if spec else "tensor"
            threshold = threshold_for(kind, "fp16", ep, spec.thresholds.get("fp16") if spec else None)
            passed, reason = judge(compare(expected, result.outputs[name], kind), threshold)
            if not passed:
                return False, f"{name}: {reason}"
        return True, "passed"

    return judge_model


def fp16_evaluators(reference: Callable[[], dict[str, np.ndarray]], feeds: dict[str, np.ndarray], recipe: Recipe) -> list[Evaluator]:
    """The checks an fp16 candidate must pass in the keep-in-fp32 search: the host CPU check, and
    the WebGPU-kernel check (fp16 accumulation) when that stage is available on this machine."""
    evaluators = [Evaluator("host cpu", _fp16_judge(run_model, "cpu", reference, feeds, recipe))]
    try:
        from pipeline.verify import webgpu_kernels
    except ImportError:
        return evaluators
    if webgpu_kernels.unavailable_reason() is None:
        evaluators.append(Evaluator("webgpu-kernels", _fp16_judge(webgpu_kernels.run_on_webgpu, "webgpu", reference, feeds, recipe)))
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
