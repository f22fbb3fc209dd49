"""`pack build`: recipe → repaired, converted, verified, compressed package in dist/<name>/.

Stages run in pipeline order; each records a step or checks in the report. The package is
assembled in a temporary folder beside its destination and renamed into place at the end, so a
build that stops on bad input (PackError, exit 2) leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx

from pipeline.assets.files import PackageFile, add_hashed_file
from pipeline.assets.samples import declared_shape, make_feeds, sample_bytes, tensor_dtype
from pipeline.cache import cache_dir
from pipeline.errors import PackError
from pipeline.graph import passes as graph_passes
from pipeline.graph.hazards import preferred_layout
from pipeline.graph.model_io import load_model, model_bytes
from pipeline.graph.passes.ir_version import ir_version_cap
from pipeline.precision.detect import detect_precision
from pipeline.precision.fp16 import FP16Refused, convert_to_fp16, upcast_to_fp32
from pipeline.progress import Progress
from pipeline.recipe import InputSpec, Recipe, find_recipe, load_recipe_file, parse_input_option, recipe_from_model
from pipeline.runtime import resolve_runtime
from pipeline.source import resolve_source
from pipeline.verify.host import run_model
from pipeline.verify.metrics import compare, judge
from pipeline.verify.thresholds import threshold_for

# Cached conversions are keyed by the code that makes them too: editing any of these files, or
# another onnx / onnxconverter-common, invalidates them without a version to remember to bump.
_CONVERSION_CODE = ("precision/fp16.py", "graph/passes/fp16_ready.py", "graph/passes/topo_sort.py")


@dataclass
class BuildOptions:
    target: str  # recipe name, recipe path, or model path
    source: str | None = None
    source_sha256: str | None = None  # for --source; the recipe's sha256 belongs to its own source
    inputs_npz: Path | None = None
    input_shapes: list[str] = field(default_factory=list)
    out_dir: Path = Path("dist")
    browser: bool = True
    gpu: bool = False


@dataclass
class Variant:
    name: str  # manifest key: fp32 | fp16 | quantized
    precision: str
    model: onnx.ModelProto
    origin: str  # how it was made, for the summary
    requires: list[str] = field(default_factory=list)


@dataclass
class BuildResult:
    package_dir: Path
    report: dict

    @property
    def exit_code(self) -> int:
        return 0 if self.report["passed"] else 1


class Timer:
    """Wall time per stage, in report.json `timings` as `<stage>_s`."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[f"{name}_s"] = round(time.perf_counter() - start, 3)


def load_build_recipe(options: BuildOptions) -> Recipe:
    recipe_path = find_recipe(options.target)
    if recipe_path is not None:
        recipe = load_recipe_file(recipe_path)
    elif options.target.endswith(".onnx") or Path(options.target).exists():
        recipe = recipe_from_model(Path(options.target))
        recipe.source = options.target
    else:
        raise PackError(f"'{options.target}': not a built-in recipe, a .toml recipe or an .onnx model; `pack recipes` lists the recipes")
    if options.source:
        recipe.source = options.source
        recipe.source_sha256 = options.source_sha256
    if not recipe.source:
        where = recipe.path or options.target
        raise PackError(f"{where}: no source; set recipe key 'source.uri' or pass --source")
    for option in options.input_shapes:
        name, shape = parse_input_option(option)
        spec = recipe.inputs.setdefault(name, InputSpec(name=name))
        spec.shape = shape
    return recipe


def _repair(model: onnx.ModelProto, recipe: Recipe) -> tuple[onnx.ModelProto, list[dict]]:
    names = list(graph_passes.auto_repairs(model)) if recipe.repairs_auto else []
    for name in recipe.repairs:
        if name not in graph_passes.PASSES:
            where = recipe.path or "recipe"
            raise PackError(f"{where}: key 'repairs.passes': unknown repair '{name}'; known: {', '.join(sorted(graph_passes.PASSES))}")
        if name not in names:
            names.append(name)
    steps = []
    for name in names:
        result = graph_passes.PASSES[name](model)
        steps.append(result.as_step(name))
        model = result.model
    # Always last, and again on every variant: conversion can raise the IR version too.
    result = ir_version_cap(model)
    if result.changed:
        steps.append(result.as_step(ir_version_cap.name))
    return result.model, steps


def _work_key(source_bytes_sha: str, recipe: Recipe) -> str:
    package_dir = Path(__file__).resolve().parent
    code = hashlib.sha256(b"".join((package_dir / name).read_bytes() for name in _CONVERSION_CODE)).hexdigest()
    versions = [metadata.version("onnx"), metadata.version("onnxconverter-common")]
    config = json.dumps([code, versions, source_bytes_sha, recipe.repairs_auto, recipe.repairs, sorted(recipe.fp16_block_ops)])
    return hashlib.sha256(config.encode()).hexdigest()


def _cached_fp16(model: onnx.ModelProto, key: str, block_ops: list[str]) -> tuple[onnx.ModelProto | None, list[dict], str | None]:
    """fp16 conversion, reused from the work cache when the source and settings are unchanged."""
    folder = cache_dir("work", key)
    model_file, steps_file = folder / "fp16.onnx", folder / "fp16.steps.json"
    if steps_file.exists():
        cached = json.loads(steps_file.read_text())
        if cached.get("refused"):
            return None, cached["steps"], cached["refused"]
        if model_file.exists():
            return onnx.load(str(model_file)), cached["steps"], None
    try:
        converted, steps = convert_to_fp16(model, block_ops)
        refused = None
        model_file.write_bytes(model_bytes(converted))
    except FP16Refused as error:
        converted, steps, refused = None, [{"name": "fp16_convert", "changed": False, "records": [], "refused": str(error)}], str(error)
    steps_file.write_text(json.dumps({"steps": steps, "refused": refused}))
    return converted, steps, refused


def make_variants(model: onnx.ModelProto, recipe: Recipe, source_sha: str, report: dict) -> tuple[list[Variant], onnx.ModelProto]:
    """The variants to ship and the fp32 model that serves as the host reference."""
    precision, why = detect_precision(model)
    report["source"]["precision"] = precision
    report["source"]["precision_reason"] = why
    if precision == "quantized":
        report["steps"].append({"name": "fp16_convert", "changed": False, "records": [{"what": f"already quantized ({why}); shipped as is"}]})
        return [Variant("quantized", "quantized", model, "source (quantized)")], model
    if precision == "fp16":
        reference, step = upcast_to_fp32(model)
        report["steps"].append({"name": "fp16_convert", "changed": False, "records": [{"what": f"already fp16 ({why}); shipped as is"}]})
        variants = []
        if "fp16" in recipe.variants:
            variants.append(Variant("fp16", "fp16", model, "source (already fp16)", ["shader-f16"]))
        if "fp32" in recipe.variants:
            report["steps"].append(step)
            variants.append(Variant("fp32", "fp32", reference, "upcast from the fp16 source"))
        return variants, reference
    variants = []
    if "fp16" in recipe.variants:
        converted, steps, refused = _cached_fp16(model, _work_key(source_sha, recipe), recipe.fp16_block_ops)
        report["steps"].extend(steps)
        if refused:
            report["variants_refused"]["fp16"] = refused
        else:
            variants.append(Variant("fp16", "fp16", converted, "converted", ["shader-f16"]))
    if "fp32" in recipe.variants or not variants:
        variants.append(Variant("fp32", "fp32", model, "source"))
    return variants, model


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


def _self_reference_checks(variant: Variant, outputs: dict[str, np.ndarray], declared: list[dict]) -> list[dict]:
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
    overrides, plus `kind`. The harness widens fp16 on webgpu through `threshold_for(..., 'webgpu')`."""
    table: dict[str, dict[str, dict]] = {}
    for variant in variants:
        table[variant.name] = {}
        for name in reference:
            spec = recipe.outputs.get(name)
            kind = spec.kind if spec else "tensor"
            override = spec.thresholds.get(variant.name) if spec else None
            table[variant.name][name] = {"kind": kind, **threshold_for(kind, variant.precision, "wasm", override)}
    return table


def _io_entries(model: onnx.ModelProto, values: dict[str, np.ndarray] | None, recipe: Recipe, outputs: bool) -> list[dict]:
    initializers = {t.name for t in model.graph.initializer}
    infos = model.graph.output if outputs else [i for i in model.graph.input if i.name not in initializers]
    entries = []
    for info in infos:
        entry = {"name": info.name, "shape": declared_shape(info), "dtype": tensor_dtype(info)}
        if values is not None and info.name in values:
            entry["sampleShape"] = list(values[info.name].shape)
        if outputs:
            spec = recipe.outputs.get(info.name)
            entry["kind"] = spec.kind if spec else "tensor"
        entries.append(entry)
    return entries


def _variant_for(variants: list[Variant], recipe: Recipe) -> dict[str, list[str]]:
    names = [v.name for v in variants]
    eps = sorted({ep for chain in recipe.chains.values() for ep in chain}, key=["webgpu", "wasm"].index)
    table = {}
    for ep in eps:
        if ep == "webgpu":
            order = [n for n in ("fp16", "fp32", "quantized") if n in names]
        else:
            # wasm gets the variant the recipe marks for it; others only when that one is absent.
            marked = [recipe.wasm_variant] if recipe.wasm_variant in names else []
            order = marked or [n for n in ("fp32", "quantized", "fp16") if n in names][:1]
        table[ep] = order
    return table


def write_package(staging: Path, recipe: Recipe, variants: list[Variant], feeds: dict[str, np.ndarray], reference_model: onnx.ModelProto, reference: dict[str, np.ndarray], progress: Progress) -> tuple[dict, dict[str, Path]]:
    """Model files, sample, runtime files, manifest and loader into `staging`. Returns (manifest, model paths)."""
    files: list[PackageFile] = []
    model_paths: dict[str, Path] = {}
    variant_entries = {}
    for variant in variants:
        entry = add_hashed_file(staging, f"model.{variant.name}", ".onnx", model_bytes(ir_version_cap(variant.model).model), progress)
        files.append(entry)
        model_paths[variant.name] = staging / entry.path
        variant_entries[variant.name] = {"precision": variant.precision, "model": entry.path, "requires": variant.requires}
    data, tensors = sample_bytes(feeds)
    sample = add_hashed_file(staging, "sample", ".bin", data, progress)
    files.append(sample)

    runtime = resolve_runtime(recipe.runtime_version, progress)
    needed = {"webgpu" if "webgpu" in chain else "wasm" for chain in recipe.chains.values()}
    bundles = {}
    for key in sorted(needed):
        bundle = runtime.bundles[key]
        module = add_hashed_file(staging, f"ort/{bundle.module.name.removesuffix('.mjs')}", ".mjs", bundle.module.read_bytes(), progress)
        wasm = add_hashed_file(staging, f"ort/{bundle.wasm.name.removesuffix('.wasm')}", ".wasm", bundle.wasm.read_bytes(), progress)
        files += [module, wasm]
        bundles[key] = {"entry": bundle.entry, "module": module.path, "wasm": wasm.path}

    layout = preferred_layout(reference_model)
    manifest = {
        "schema": 1,
        "name": recipe.name,
        "description": recipe.description,
        "files": {f.path: f.manifest_entry() for f in sorted(files, key=lambda f: f.path)},
        "variants": variant_entries,
        "variantFor": _variant_for(variants, recipe),
        "inputs": _io_entries(reference_model, feeds, recipe, outputs=False),
        "outputs": _io_entries(reference_model, reference, recipe, outputs=True),
        "sample": {"file": sample.path, "tensors": tensors},
        "runtime": {"package": "onnxruntime-web", "version": runtime.version, "bundles": bundles},
        "executionProviders": recipe.chains,
        "epOptions": {"webgpu": {"preferredLayout": layout}} if layout else {},
        "loader": {"watchdogMs": recipe.watchdog_ms, "prewarm": recipe.prewarm},
        "verification": {"browser": False, "passed": False},
    }
    return manifest, model_paths


def _reference_outputs(reference_model: onnx.ModelProto, variants: list[Variant], model_paths: dict[str, Path], feeds: dict[str, np.ndarray], source_path: Path) -> dict[str, np.ndarray]:
    """fp32 outputs on onnxruntime CPU: the reference every check compares against."""
    shipped = next((model_paths[v.name] for v in variants if v.model is reference_model), None)
    with tempfile.TemporaryDirectory(prefix="pack-ref-") as tmp:
        model_file = shipped or Path(tmp) / "reference.onnx"
        if shipped is None:
            model_file.write_bytes(model_bytes(reference_model))
        run = run_model(model_file, feeds)
    if run.outputs is None:
        raise PackError(f"{source_path.name}: onnxruntime cannot run the model on the sample inputs: {run.error}; check the inputs (--input/--inputs) and the model")
    return run.outputs


def _webgpu_failed(checks: list[dict]) -> bool:
    return any(c["ep"] == "webgpu" and c["status"] == "failed" for c in checks)


def _browser_checks(staging: Path, manifest: dict, reference: dict[str, np.ndarray], thresholds: dict, gpu: bool, report: dict, progress: Progress) -> None:
    """Browser verification through the package's loader. When WebGPU fails under the EP's default
    NHWC layout, the same package is tried with `preferredLayout: 'NCHW'` (onnxruntime-web 1.30's
    NHWC transform breaks some real graphs, GTCRN's Conv among them); if that passes, the manifest
    keeps it, and the step records both figures."""
    from pipeline.verify.browser.chromium import launch_browser
    from pipeline.verify.browser.harness import verify_in_browser

    with launch_browser(gpu=gpu) as browser:
        result = verify_in_browser(staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser)
        if _webgpu_failed(result.checks) and "preferredLayout" not in manifest["epOptions"].get("webgpu", {}):
            progress.note("webgpu failed with the NHWC layout; trying preferredLayout NCHW")
            manifest["epOptions"] = {**manifest["epOptions"], "webgpu": {**manifest["epOptions"].get("webgpu", {}), "preferredLayout": "NCHW"}}
            _write_json(staging / "manifest.json", manifest)
            retry = verify_in_browser(staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser)
            fixed = not _webgpu_failed(retry.checks)
            failed_before = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in result.checks if c["ep"] == "webgpu" and c["status"] == "failed"]
            report["steps"].append({
                "name": "layout",
                "changed": fixed,
                "records": [{"what": "webgpu preferredLayout NCHW: " + ("passes where NHWC failed" if fixed else "fails too; kept NHWC"), "nhwc_failures": failed_before}],
            })
            if fixed:
                result = retry
            else:
                del manifest["epOptions"]["webgpu"]["preferredLayout"]
                if not manifest["epOptions"]["webgpu"]:
                    del manifest["epOptions"]["webgpu"]
                _write_json(staging / "manifest.json", manifest)
    report["checks"].extend(result.checks)
    report["browser"] = result.report


def _write_json(path: Path, document: dict) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _finish(staging: Path, destination: Path) -> None:
    """Swap the finished package into place: old one aside, new one in, old one removed."""
    old = None
    if destination.exists():
        old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
        destination.rename(old)
    staging.rename(destination)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(options: BuildOptions, progress: Progress) -> BuildResult:
    timer = Timer()
    report: dict = {"name": None, "passed": False, "refused": None, "checks": [], "steps": [], "timings": timer.timings, "source": {}, "variants_refused": {}}
    with timer.stage("fetch"):
        recipe = load_build_recipe(options)
        report["name"] = recipe.name
        source_path = resolve_source(recipe.source, recipe.source_sha256, recipe.base_dir, progress)
    report["source"].update(uri=recipe.source, file=source_path.name)
    with timer.stage("repair"):
        progress.note(f"loading and repairing {source_path.name}")
        model = load_model(source_path)
        source_sha = hashlib.sha256(model_bytes(model)).hexdigest()
        report["source"]["sha256"] = source_sha
        model, steps = _repair(model, recipe)
        report["steps"].extend(steps)
    with timer.stage("samples"):
        feeds = make_feeds(model, recipe, options.inputs_npz)
    with timer.stage("convert"):
        progress.note(f"precision: {', '.join(recipe.variants)} variants of {recipe.name}")
        variants, reference_model = make_variants(model, recipe, source_sha, report)

    options.out_dir.mkdir(parents=True, exist_ok=True)
    destination = options.out_dir / recipe.name
    staging = Path(tempfile.mkdtemp(prefix=f".{recipe.name}.build-", dir=options.out_dir))
    try:
        with timer.stage("assets"):
            manifest, model_paths = write_package(staging, recipe, variants, feeds, reference_model, {}, progress)
        with timer.stage("host_verify"):
            reference = _reference_outputs(reference_model, variants, model_paths, feeds, source_path)
            manifest["outputs"] = _io_entries(reference_model, reference, recipe, outputs=True)
            host_checks([v for v in variants if v.precision != "quantized"], reference, feeds, recipe, report, progress, model_paths)
            for variant in variants:
                if variant.precision == "quantized":
                    report["checks"].extend(_self_reference_checks(variant, reference, manifest["outputs"]))
        from pipeline.loader.render import render_loader

        render_loader(staging, manifest)
        _write_json(staging / "manifest.json", manifest)
        with timer.stage("browser_verify"):
            if options.browser:
                _browser_checks(staging, manifest, reference, browser_thresholds(variants, reference, recipe), options.gpu, report, progress)
            else:
                for ep, names in manifest["variantFor"].items():
                    for name in names:
                        report["checks"].append({"stage": "browser", "ep": ep, "variant": name, "status": "skipped", "metrics": {}, "threshold": {}, "detail": "--no-browser"})
        ran = [c for c in report["checks"] if c["status"] in ("passed", "failed")]
        report["passed"] = bool(ran) and all(c["status"] == "passed" for c in ran)
        browser_ran = any(c["stage"] == "browser" and c["status"] in ("passed", "failed") for c in report["checks"])
        manifest["verification"] = {"browser": browser_ran, "passed": report["passed"]}
        # Per (bundle, EP, variant) browser status: the loader skips a pair recorded as failed.
        runs = report.get("browser", {}).get("runs", []) if options.browser else []
        manifest["verification"]["runs"] = sorted(
            ({key: run[key] for key in ("bundle", "ep", "variant", "status")} for run in runs),
            key=lambda run: (run["bundle"], run["ep"], run["variant"], run["status"]),
        )
        _write_json(staging / "manifest.json", manifest)
        _write_json(staging / "report.json", report)
        _finish(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BuildResult(destination, report)
