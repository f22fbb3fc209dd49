"""`pack build`: recipe → repaired, converted, verified, compressed package in dist/<name>/.

Stages run in pipeline order; each records a step or checks in the report. The package is
assembled in a temporary folder beside its destination and renamed into place at the end, so a
build that stops on bad input (PackError, exit 2) leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
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

from pipeline.assets.package import io_entries, write_package
from pipeline.assets.samples import make_feeds
from pipeline.errors import PackError
from pipeline.graph import registry
from pipeline.graph.model_io import load_model, model_bytes
from pipeline.graph.passes.base import PassSettings
from pipeline.loader.render import render_loader
from pipeline.precision.variants import Variant, make_variants
from pipeline.progress import Progress
from pipeline.recipe import InputSpec, Recipe, find_recipe, load_recipe_file, parse_input_option, recipe_from_model
from pipeline.runtime import max_ir_version
from pipeline.source import resolve_source
from pipeline.verify.checks import browser_thresholds, host_checks, self_reference_checks
from pipeline.verify.host import run_model


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
    """The repairs detection asks for (unless `repairs.auto = false`) and those the recipe names,
    in run order, then the IR version cap for the recipe's runtime."""
    where = recipe.path or "recipe"
    known = registry.names()
    for name in recipe.repairs:
        if name not in known:
            raise PackError(f"{where}: key 'repairs.passes': unknown repair '{name}'; known: {', '.join(sorted(known))}")
    try:
        max_ir_version(recipe.runtime_version)  # the last pass needs it: refuse before any work
    except PackError as error:
        raise PackError(f"{where}: key 'runtime.version': {error}") from None
    names = registry.auto_repairs(model) if recipe.repairs_auto else []
    return registry.run_passes(model, [*names, *recipe.repairs], PassSettings(runtime_version=recipe.runtime_version))


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
            manifest, model_paths = write_package(staging, recipe, variants, feeds, reference_model, progress)
        with timer.stage("host_verify"):
            reference = _reference_outputs(reference_model, variants, model_paths, feeds, source_path)
            manifest["outputs"] = io_entries(reference_model, reference, recipe, outputs=True)
            host_checks([v for v in variants if v.precision != "quantized"], reference, feeds, recipe, report, progress, model_paths)
            for variant in variants:
                if variant.precision == "quantized":
                    report["checks"].extend(self_reference_checks(variant, reference, manifest["outputs"]))
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
