"""`pack build`: recipe → repaired, converted, verified, compressed package in dist/<name>/.

A build is a table of keyed stages (`build_table`, run by pipeline/stage_table.py): fetch, repair,
samples, convert, models, host_verify, webgpu_kernels, files, browser_verify, judge, write. Each
reads its slice of the `BuildSettings` and the artefacts earlier stages put in the ledger, and
returns what it makes; each is keyed by the one key function (pipeline/keys.py), chained from the
stages it reads, so the last stage's key names the whole package: a passed package stored under it
(pipeline/reuse.py, shared through pipeline/shared_cache.py) is linked into place instead of built.
The manifest and report.json are each written exactly once, by the last stage: the manifest first,
then report.json (its sizes count the manifest's bytes). The browser stage is handed the manifest
in memory (served as the staging folder's manifest.json), so no provisional manifest is ever
written. The package is assembled in a temporary folder beside its destination and renamed into
place at the end, so a build that stops on bad input (PackError, exit 2) leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import numpy as np
import onnx

from pipeline.manifest import Manifest, Thresholds, Verification, adapter_runs, chains_without_refused_eps, describe_run, measurements_from, package_verdict, refused, refused_eps, run_sort_key, runs_from_checks, write_manifest
from pipeline.assets.package import ModelFiles, PackageContents, io_entries, plain_files, start_package, write_models, write_runtime, write_sample
from pipeline.assets.samples import make_feeds
from pipeline.assets.delivery import delivery_sizes
from pipeline.cache import file_sha256, staging_folder, swap_into_place as _finish, temporary_folder
from pipeline.errors import PackError, recorded_warnings, say_again
from pipeline.graph import repairs
from pipeline.graph.model_io import load_model, model_bytes
from pipeline.graph.passes.base import PassSettings
from pipeline.web.render import render_loader
from pipeline.web.select import default_select
from pipeline.precision.detect import detect_precision
from pipeline.precision.kept_nodes import Fp16Context
from pipeline.precision.variants import Variant, VariantSet, make_variants
from pipeline.progress import Progress
from pipeline.report.data import ReportData
from pipeline.report.record import Record, Refusal, make_record, read_record, write_record
from pipeline.report.render import write_report
from pipeline.recipe import InputSpec, Recipe, find_recipe, load_recipe_file, parse_input_option, recipe_from_model
from pipeline.lockfile import fp16_lock_for, lock_for
from pipeline.keys import as_data
from pipeline.reuse import KILL_AT_ENV, browser_version, link_tree, pack_settings, reuse_enabled, source_hashes, store_package, stored_outcome, stored_package
from pipeline.shared_cache import begin_traffic, check_shared_store, traffic_line as shared_traffic_line
from pipeline.stage_table import Ledger, Stage, StageCache, StageRun, run_stage, stage_keys
from pipeline.runtime import local_runtime, max_ir_version, recipe_runtime
from pipeline.source import SourceRequest, fetch_source, is_url, public_uri
from pipeline.urls import mask_url
from pipeline.verify.engines.browser.run_plan import plan_runs
from pipeline.verify.judgement.checks import contradicted_kernel_errors, layout_verdict, self_reference_checks, skipped_runs, webgpu_failures
from pipeline.verify.stages import fp16_evaluators, host_checks, onnxruntime_refusal, webgpu_kernel_stage
from pipeline.verify.judgement.thresholds import threshold_table
from pipeline.verify.engines.host import run_model


@dataclass
class BuildOptions:
    target: str  # recipe name, recipe path, or model path
    source: str | None = None
    source_sha256: str | None = None  # --sha256: the hash --source must have (else the recipe's or the lock's)
    inputs_npz: Path | None = None
    input_shapes: list[str] = field(default_factory=list)
    out_dir: Path = Path("dist")
    browser: bool = True
    gpu: bool = False
    lock: Path | None = None  # --lock; default: beside the recipe (pipeline/lockfile.py)
    reuse: bool = True  # link a stored passed build with the same inputs (pipeline/reuse.py)
    grid: Any = None  # verify.browser.grid.GridSettings: --browser/--cdp endpoints; None: the local browser
    engines: tuple[str, ...] = ("chromium",)  # --engines: where the default load runs (verify/engines/browser/default_load.py)


@dataclass
class BuildResult:
    package_dir: Path
    report: Record
    reused: str | None = None  # the build key, when a stored package with the same inputs was linked into place
    lock: Path | None = None  # the lock file the build read or wrote, when there is one (the summary names it)
    shared: str | None = None  # what the build read from and wrote to the shared cache (one line), when it did

    @property
    def exit_code(self) -> int:
        """The one verdict (report.json `passed` = manifest `verification.passed` = report.html's badge)."""
        return 0 if self.report["passed"] else 1


def lock_path(recipe: Recipe, override: Path | None) -> Path | None:
    """The lock file of this build that exists: the recipe's (source pins, kept nodes) or, for a
    bare model, the kept nodes' in the cache (lockfile.py says where each goes)."""
    for lock in (lock_for(recipe, override), fp16_lock_for(recipe, override)):
        if lock.path is not None and lock.path.is_file():
            return lock.path
    return None


def stage_boundary(name: str) -> None:
    """The fault tests' one hook: SIGKILL this process as it enters the stage named by KILL_AT_ENV
    (a `timings` stage, or `store`/`finish`), to prove a build killed anywhere leaves nothing a
    rebuild trips on."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def load_build_recipe(options: BuildOptions) -> Recipe:
    recipe_path = find_recipe(options.target)
    if recipe_path is not None:
        recipe = load_recipe_file(recipe_path)
        if options.source_sha256 and not options.source:
            raise PackError(f"--sha256 checks --source or a model given as the target; for recipe {recipe_path} set its key 'source.sha256', or give --source with --sha256")
    elif is_url(options.target) or options.target.endswith(".onnx") or Path(options.target).exists():
        recipe = recipe_from_model(Path(urlsplit(options.target).path) if is_url(options.target) else Path(options.target))
        recipe.source = options.target
        recipe.source_sha256 = options.source_sha256
    else:
        raise PackError(f"'{options.target}': not a built-in recipe, a .toml recipe or an .onnx model; `pack recipes` lists the recipes")
    if not recipe.source and not options.source:
        if recipe.source_instructions:
            raise PackError(f"{recipe.name}: {recipe.source_instructions}")
        where = recipe.path or options.target
        raise PackError(f"{where}: no source; set recipe key 'source.uri' or pass --source")
    for option in options.input_shapes:
        name, shape = parse_input_option(option)
        spec = recipe.inputs.setdefault(name, InputSpec(name=name))
        spec.shape, spec.option = shape, option
    return recipe


def source_request(recipe: Recipe, options: BuildOptions) -> SourceRequest:
    """The file this build uses (--source or the recipe's) and the published facts to check it by."""
    return SourceRequest(
        recipe_name=recipe.name,
        rebuild=f"pack build {mask_url(options.target)}",
        uri=options.source or recipe.source,
        published_uri=recipe.source,
        published_sha256=recipe.source_sha256,
        published_size=recipe.source_size,
        published_opset=recipe.source_opset,
        published_inputs=tuple(recipe.inputs),
        given_sha256=options.source_sha256,
        base_dir=Path.cwd() if options.source else recipe.base_dir,
    )


def repair_settings(recipe: Recipe, progress: Progress | None = None) -> PassSettings:
    """What the repairs depend on: the recipe's runtime and the IR versions that release loads."""
    try:
        runtime = recipe_runtime(recipe.runtime_version, recipe.runtime_path, progress)
        return PassSettings(runtime_version=runtime.version, max_ir_version=max_ir_version(runtime, progress))
    except PackError as error:
        raise PackError(f"{recipe.path or 'recipe'}: key 'runtime.version': {error}") from None


def _repair(model: onnx.ModelProto, recipe: Recipe, settings: PassSettings | None = None) -> tuple[onnx.ModelProto, list[dict]]:
    """The repairs detection asks for (unless `repairs.auto = false`) and those the recipe names,
    in run order, then the IR version cap for the recipe's runtime."""
    where = recipe.path or "recipe"
    known = repairs.names()
    for name in recipe.repairs:
        if name not in known:
            raise PackError(f"{where}: key 'repairs.passes': unknown repair '{name}'; known: {', '.join(sorted(known))}")
    names = repairs.auto_repairs(model) if recipe.repairs_auto else []
    return repairs.run_passes(model, [*names, *recipe.repairs], settings or repair_settings(recipe))


def _reference_outputs(reference_model: onnx.ModelProto, variants: list[Variant], model_paths: dict[str, Path], feeds: dict[str, np.ndarray], source_path: Path) -> dict[str, np.ndarray]:
    """fp32 outputs on onnxruntime CPU: the reference every check compares against."""
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


def _fp16_context(model: onnx.ModelProto, feeds: dict[str, np.ndarray], recipe: Recipe, options: BuildOptions, source_path: Path, progress: Progress) -> Fp16Context:
    """What the fp16 keep-in-fp32 search needs from the verify stage. The fp32 reference runs first
    when an fp16 variant will be made (it is cached, and bad input should stop the build before
    any fp16 work)."""
    reference: dict[str, dict[str, np.ndarray]] = {}
    if "fp16" in recipe.variants and detect_precision(model)[0] == "fp32":
        reference["outputs"] = _reference_outputs(model, [], {}, feeds, source_path)

    def reference_outputs() -> dict[str, np.ndarray]:
        if not reference:
            reference["outputs"] = _reference_outputs(model, [], {}, feeds, source_path)
        return reference["outputs"]

    def run_outputs(path: Path, run_feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        return run_model(path, run_feeds).outputs

    return Fp16Context(feeds, run_outputs, fp16_evaluators(reference_outputs, feeds, recipe, model), fp16_lock_for(recipe, options.lock), progress, onnxruntime_refusal(feeds))


def _host_verify(models: ModelFiles, made: VariantSet, feeds: dict[str, np.ndarray], recipe: Recipe, source_path: Path, progress: Progress) -> tuple[dict[str, np.ndarray], list[dict]]:
    """The fp32 reference outputs and the host checks of every variant against them."""
    reference = _reference_outputs(made.reference, made.variants, models.model_paths, feeds, source_path)
    checks = host_checks([v for v in made.variants if v.precision != "quantized"], reference, feeds, recipe, progress, models.check_paths)
    declared = io_entries(made.reference, reference, recipe, outputs=True)
    for variant in made.variants:
        if variant.precision == "quantized":
            checks.extend(self_reference_checks(variant, reference, declared))
    return reference, checks


@dataclass
class BrowserOutcome:
    checks: list[dict]
    report: dict | None = None  # report.json "browser" (None under --no-browser)
    ep_options: dict | None = None  # the EP options the checks settled on
    steps: list[dict] = field(default_factory=list)
    policy_failed: bool = False  # --browser endpoints ended in error beyond what the policy allows
    outputs: dict = field(default_factory=dict)  # run label -> output -> what the browser produced (report.html)


def _browser_verify(staging: Path, contents: PackageContents, thresholds: Thresholds, license: str | None, reference: dict[str, np.ndarray], gpu: bool, progress: Progress, grid=None) -> BrowserOutcome:
    """Browser verification through the package's loader, on the staging folder with the manifest
    served from memory: this one records no runs, so every variant is tried as shipped (the final
    manifest is written once the verdict is known). When WebGPU fails under the EP's default NHWC
    layout, the same package is tried with `preferredLayout: 'NCHW'` in its in-memory manifest
    (onnxruntime-web 1.30's NHWC transform breaks some real graphs, GTCRN's Conv among them); the
    package keeps it when it fails fewer WebGPU runs (checks.layout_verdict), and the step records both figures."""
    from pipeline.verify.engines.browser.grid import browsers_for, exit_policy, verify_on_grid

    ep_options = contents.ep_options
    steps = []
    with browsers_for(grid, gpu) as browser:
        served = contents.manifest(thresholds=thresholds, license=license)
        result = verify_on_grid(grid, staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser, manifest=served)
        if webgpu_failures(result.checks) and "preferredLayout" not in ep_options.get("webgpu", {}):
            progress.note("webgpu failed with the NHWC layout; trying preferredLayout NCHW")
            nchw = {**ep_options, "webgpu": {**ep_options.get("webgpu", {}), "preferredLayout": "NCHW"}}
            served = replace(contents, ep_options=nchw).manifest(thresholds=thresholds, license=license)
            retry = verify_on_grid(grid, staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser, manifest=served)
            adopted = layout_verdict(result.checks, retry.checks)
            failed_before = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in result.checks if c["ep"] == "webgpu" and c["status"] == "failed"]
            steps.append({
                "name": "layout",
                "changed": adopted is not None,
                "records": [{"what": adopted or "webgpu preferredLayout NCHW: fails as much; kept NHWC", "nhwc_failures": failed_before}],
            })
            if adopted:
                result, ep_options = retry, nchw
    policy_failed, why = exit_policy(result, grid)
    if why:
        progress.note(why)
    return BrowserOutcome(result.checks, result.report, ep_options, steps, policy_failed=policy_failed, outputs=result.outputs)


def _browser_skipped(manifest: Manifest) -> BrowserOutcome:
    """--no-browser: every run the browser checks would make, recorded as skipped."""
    return BrowserOutcome(skipped_runs(plan_runs(manifest), "--no-browser"))


def _verification(checks: list[dict]) -> Verification:
    """manifest `verification`: the verdict and one run per (stage, bundle, EP, variant)."""
    ran = [c for c in checks if c["status"] in ("passed", "failed")]
    passed = bool(ran) and all(c["status"] == "passed" for c in ran)
    browser_ran = any(c["stage"] == "browser" and c["status"] in ("passed", "failed") for c in checks)
    runs = sorted((run for stage in ("browser", "host", "webgpu-kernels") for run in runs_from_checks(checks, stage)), key=run_sort_key)
    adapters = adapter_runs(checks)
    return {"browser": browser_ran, "passed": passed, "runs": runs, **({"adapters": adapters} if adapters else {})}


def _refused_pairs(manifest: Manifest) -> list[Refusal] | None:
    """Each (bundle, EP, variant) the package lists that the refusal rule turns away, and why."""
    refusals: list[Refusal] = []
    for platform_run in plan_runs(manifest):
        run = refused(manifest, platform_run.bundle, platform_run.ep, platform_run.variant)
        if run is not None:
            refusals.append({"bundle": platform_run.bundle, "ep": platform_run.ep, "variant": platform_run.variant, "by": describe_run(run)})
    return refusals or None


# --- the settings a build's result depends on, and the stage table ------------------------------


@dataclass(frozen=True)
class BuildSettings:
    """Everything a build's result depends on besides the source bytes (which the fetch keys):
    each stage reads a slice of it (`Stage.settings`) and its key holds that slice."""

    recipe: dict[str, Any]  # the recipe as data: no machine paths, files as their sha256
    options: dict[str, Any]  # the options that change results
    lock: dict | None  # the lock entry as this build reads it
    runtime: str  # onnxruntime-web's version (a local build: with its shipped files' sha256)
    browser: str | None  # the Chromium that verifies (None: --no-browser)
    environment: dict[str, str]  # the PACK_* settings that change results


# Recipe keys no stage's key holds: where the recipe file lies (its content is what counts), and
# how the source is found and checked (the fetch is keyed by the bytes it yields: the same file
# from a path, a URL or a registry package is the same input).
RECIPE_KEYS_OUTSIDE_KEYS = ("path", "source", "source_sha256", "source_size", "source_opset", "source_precision", "source_instructions")


def _recipe_slice(*names: str) -> Callable[[BuildSettings], dict]:
    def read(settings: BuildSettings) -> dict:
        return {name: settings.recipe[name] for name in names}

    read.recipe_keys = names  # type: ignore[attr-defined]  # tests/test_build_stages.py checks every key is read
    return read


def _slice(*recipe_keys: str, **others: Callable[[BuildSettings], Any]) -> Callable[[BuildSettings], dict]:
    recipe = _recipe_slice(*recipe_keys)

    def read(settings: BuildSettings) -> dict:
        return {**recipe(settings), **{name: pick(settings) for name, pick in others.items()}}

    read.recipe_keys = recipe_keys  # type: ignore[attr-defined]
    return read


def build_settings(recipe: Recipe, options: BuildOptions, lock_entry: dict | None) -> BuildSettings:
    from pipeline.verify.engines.browser.chromium import chromium_path

    recipe_data = as_data(recipe)
    recipe_data["path"] = recipe.path.name if recipe.path else None
    for name, spec in recipe_data["inputs"].items():  # an input's sample file counts by its bytes
        given = recipe.inputs[name].file
        spec["file"] = file_sha256(given) if given is not None and Path(given).is_file() else spec["file"]
    runtime = recipe.runtime_version
    if recipe.runtime_path is not None:  # a local build: its bundles are what runs
        local = local_runtime(Path(recipe.runtime_path))  # only the files a package ships, not the build tree
        shipped = sorted({path for bundle in local.bundles.values() for path in (bundle.module, bundle.wasm, bundle.glue) if path is not None})
        runtime += ":" + "".join(file_sha256(path) for path in shipped)
    recipe_data["runtime_path"] = None  # keyed by the files above
    options_data = {
        "inputs_npz": file_sha256(options.inputs_npz) if options.inputs_npz and options.inputs_npz.is_file() else None,
        "input_shapes": sorted(options.input_shapes),
        "browser": options.browser,
        "gpu": options.gpu,
        "engines": list(options.engines),
    }
    return BuildSettings(recipe_data, options_data, lock_entry, runtime, browser_version(chromium_path()) if options.browser else None, pack_settings())


@dataclass
class _Build:
    """One build's context: what every stage function may use besides the ledger."""

    options: BuildOptions
    progress: Progress
    out_dir: Path
    staging: Path | None = None


def _stage_fetch(build: _Build, ledger: Ledger) -> dict:
    recipe, options, progress = ledger["recipe"], build.options, build.progress
    request = source_request(recipe, options)
    lock = lock_for(recipe, options.lock)
    fetched = fetch_source(request, lock, progress)
    recipe.source = request.uri
    return {"fetched": fetched}


def _stage_repair(build: _Build, ledger: Ledger) -> dict:
    recipe, fetched = ledger["recipe"], ledger["fetched"]
    build.progress.note(f"loading and repairing {fetched.path.name}")
    model = load_model(fetched.path)
    source_sha = hashlib.sha256(model_bytes(model)).hexdigest()
    settings = repair_settings(recipe, build.progress)
    model, steps = _repair(model, recipe, settings)
    return {"model": model, "source_sha": source_sha, "pass_settings": settings, "repair_steps": steps}


def _keep_repair(made: Mapping[str, Any], folder: Path) -> bool:
    """The repaired model and what the repairs recorded (a model over protobuf's 2 GB is not kept)."""
    model = made["model"]
    if model.ByteSize() > 1_900_000_000:
        return False
    (folder / "model.onnx").write_bytes(model_bytes(model))
    facts = {"source_sha": made["source_sha"], "pass_settings": asdict(made["pass_settings"]), "repair_steps": made["repair_steps"]}
    (folder / "repair.json").write_text(json.dumps(facts, sort_keys=True))
    return True


def _read_repair(folder: Path) -> dict:
    facts = json.loads((folder / "repair.json").read_text())
    model = onnx.load_from_string((folder / "model.onnx").read_bytes())
    return {"model": model, "source_sha": facts["source_sha"], "pass_settings": PassSettings(**facts["pass_settings"]), "repair_steps": facts["repair_steps"]}


def _stage_samples(build: _Build, ledger: Ledger) -> dict:
    return {"feeds": make_feeds(ledger["model"], ledger["recipe"], build.options.inputs_npz)}


def _stage_convert(build: _Build, ledger: Ledger) -> dict:
    recipe, model, source_path = ledger["recipe"], ledger["model"], ledger["fetched"].path
    build.progress.note(f"precision: {recipe.ships()} variants of {recipe.name}")
    context = _fp16_context(model, ledger["feeds"], recipe, build.options, source_path, build.progress)
    made = make_variants(model, recipe, ledger["source_sha"], context, ledger["pass_settings"])
    if recipe.source_precision and not build.options.source and made.precision != recipe.source_precision:
        raise PackError(f"{recipe.path}: key 'source.precision' says {recipe.source_precision}, but {source_path.name} is {made.precision} ({made.precision_reason}); fix the key")
    return {"made": made}


def _stage_models(build: _Build, ledger: Ledger) -> dict:
    recipe, made = ledger["recipe"], ledger["made"]
    models = write_models(build.staging, recipe, made.variants, made.reference, ledger["feeds"], build.progress)
    return {"models": models, "contents": replace(start_package(recipe), models=models, ep_options=models.ep_options)}


def _stage_host_verify(build: _Build, ledger: Ledger) -> dict:
    reference, checks = _host_verify(ledger["models"], ledger["made"], ledger["feeds"], ledger["recipe"], ledger["fetched"].path, build.progress)
    return {"reference": reference, "host_checks": checks}


def _stage_webgpu_kernels(build: _Build, ledger: Ledger) -> dict:
    contents, models = ledger["contents"], ledger["models"]
    kernels = webgpu_kernel_stage(ledger["made"].variants, ledger["reference"], ledger["feeds"], ledger["recipe"], build.progress, models.check_paths, contents.ep_options.get("webgpu", {}))
    if kernels.ep_options:
        contents = replace(contents, ep_options={**contents.ep_options, "webgpu": kernels.ep_options})
    return {"kernels": kernels, "contents": contents}


def _stage_files(build: _Build, ledger: Ledger) -> dict:
    """The sample, the runtime, the thresholds and the loader: the rest of what the package lists."""
    recipe, made, staging, progress = ledger["recipe"], ledger["made"], build.staging, build.progress
    sample = write_sample(staging, recipe, made.reference, ledger["feeds"], ledger["reference"], progress)
    runtime = write_runtime(staging, recipe, progress)
    contents = replace(ledger["contents"], sample=sample, runtime=runtime)
    thresholds = threshold_table(made.variants, ledger["reference"], recipe, ledger["models"].variant_for)
    rendered = render_loader(staging, contents.manifest(license=recipe.license), sample_rate=_sample_rate(recipe))
    return {"contents": replace(contents, plain=plain_files(staging, rendered)), "thresholds": thresholds}


def _stage_browser_verify(build: _Build, ledger: Ledger) -> dict:
    contents, recipe, options = ledger["contents"], ledger["recipe"], build.options
    if not options.browser:
        return {"browser": _browser_skipped(contents.manifest()), "contents": contents}
    browser = _browser_verify(build.staging, contents, ledger["thresholds"], recipe.license, ledger["reference"], options.gpu, build.progress, options.grid)
    return {"browser": browser, "contents": replace(contents, ep_options=browser.ep_options)}


def _stage_judge(build: _Build, ledger: Ledger) -> dict:
    """The verdict from every check, the loader's choice, refused EPs out of the chains: the final manifest."""
    recipe, made, browser, contents = ledger["recipe"], ledger["made"], ledger["browser"], ledger["contents"]
    kernels = ledger["kernels"]
    checks = ledger["host_checks"] + contradicted_kernel_errors(kernels.checks, browser.checks) + browser.checks
    verification = _verification(checks)
    if recipe.verify_require:
        verification["require"] = list(recipe.verify_require)
    measurements = measurements_from(browser.report)
    select, why = default_select(recipe.loader_select, [m["steadyMs"] for m in measurements])
    contents = replace(contents, loader={**contents.loader, "select": select})
    kept = next((v.kept_fp32 for v in made.variants if v.name == "fp16" and v.kept_fp32), None)
    final = dict(thresholds=ledger["thresholds"], measurements=measurements, license=recipe.license, fp16={"keptFp32": kept} if kept else None)
    judged = contents.manifest(verification=verification, **final)  # the runs decide; `passed` follows
    refusals = _refused_pairs(judged)
    eps_refused = refused_eps(judged)
    if eps_refused:  # an EP refused leaves the chains that keep another (the loader loads a smaller bundle)
        verification["refusedEps"] = eps_refused
        contents = replace(contents, chains=chains_without_refused_eps(judged))
        judged = contents.manifest(verification=verification, **final)
    passed, verdict = package_verdict(judged)
    if browser.policy_failed:  # --browser endpoints ended in error beyond what the policy allows
        passed = False
        verdict.append("remote browsers: endpoints ended in error beyond the exit policy (docs/remote.md)")
    manifest = contents.manifest(verification={**verification, "passed": passed}, **final)
    return {"checks": checks, "manifest": manifest, "verdict": {"passed": passed, "verdict": verdict, "refused": refusals, "loader": {"select": select, "why": why}}}


def _stage_default_load(build: _Build, ledger: Ledger) -> dict:
    """The package as an app loads it: the shipped loader's load() with the final manifest's defaults (pipeline/verify/engines/browser/default_load.py)."""
    from pipeline.verify.engines.browser.default_load import default_load_stage

    grid = build.options.grid
    return default_load_stage(build.staging, ledger["manifest"], ledger["checks"], ledger["verdict"], ledger["reference"],
                              enabled=build.options.browser, gpu=build.options.gpu, remote_only=bool(grid and grid.endpoints), engines=build.options.engines)


def _stage_write(build: _Build, ledger: Ledger) -> dict:
    """manifest.json once, then report.json (its sizes count the manifest's bytes), then report.html."""
    recipe, made, fetched, browser, verdict = ledger["recipe"], ledger["made"], ledger["fetched"], ledger["browser"], ledger["verdict"]
    staging, manifest = build.staging, ledger["manifest"]
    manifest_size = write_manifest(staging, manifest).stat().st_size  # the one write of the manifest
    report = make_record(
        name=recipe.name,
        passed=verdict["passed"],
        verdict=verdict["verdict"],
        refused=verdict["refused"],
        checks=ledger["checks"],
        steps=ledger["repair_steps"] + made.steps + ledger["kernels"].steps + browser.steps,
        timings={f"{name}_s": seconds for name, seconds in ledger["timings"].items()},
        source={"uri": public_uri(recipe.source), "file": fetched.path.name, "sha256": ledger["source_sha"], "checked": fetched.checked_against, "precision": made.precision, "precision_reason": made.precision_reason},
        license=recipe.license,
        variants_refused=made.refused,
        sample_rate=_sample_rate(recipe),
        webgpu_kernels=ledger["kernels"].facts,
        browser=browser.report,
        loader=verdict["loader"],
        delivery=delivery_sizes(manifest, manifest_size),
    )
    write_record(staging, report)  # after the manifest, once: not in manifest.files (pipeline/report)
    write_report(staging, ReportData(browser.outputs), build.progress)  # report.html: not in manifest.files either
    return {"report": report}


def _environment(settings: BuildSettings) -> dict:
    return settings.environment


# The build, in run order. Each stage's settings slice names the recipe keys it reads; the rest of a
# slice is options, the lock entry, the runtime, the browser or the PACK_* settings. A stage's code
# is what computes its result (keys.code_hash); its key chains from the stages that made what it reads.
def build_table(build: _Build) -> list[Stage]:
    def bound(function: Callable[[_Build, Ledger], dict]) -> Callable[[Ledger], dict]:
        return lambda ledger: function(build, ledger)

    def source_files(ledger: Ledger) -> dict[str, str]:
        fetched = ledger["fetched"]
        return source_hashes(fetched.path, fetched.sha256)

    def source_record(ledger: Ledger) -> dict[str, str]:
        fetched = ledger["fetched"]
        return {"uri": public_uri(ledger["recipe"].source), "file": fetched.path.name, "checked": fetched.checked_against}

    return [
        # keyed by the bytes it fetched alone: how they were found (path, URL, registry) changes nothing below
        Stage("fetch", bound(_stage_fetch), _slice(), reads=("recipe",), makes=("fetched",), content=source_files),
        Stage("repair", bound(_stage_repair), _slice("repairs_auto", "repairs", "runtime_version", "runtime_path", runtime=lambda s: s.runtime),
              reads=("fetched",), makes=("model", "source_sha", "pass_settings", "repair_steps"), code=("pipeline.graph", "pipeline.runtime"), libraries=("onnx",),
              cache=StageCache(_keep_repair, _read_repair)),
        Stage("samples", bound(_stage_samples), _slice("inputs", "seed", inputs_npz=lambda s: s.options["inputs_npz"], input_shapes=lambda s: s.options["input_shapes"]),
              reads=("model",), makes=("feeds",), code=("pipeline.assets.samples", "pipeline.assets.patterns"), libraries=("numpy",)),
        Stage("convert", bound(_stage_convert), _slice("variants", "variants_stated", "fp16_block_ops", "fp16_keep_nodes", "fp16_search", "fp16_search_trials", "fp16_search_seconds", "outputs", lock=lambda s: s.lock, environment=_environment),
              reads=("model", "feeds", "source_sha", "pass_settings"), makes=("made",), code=("pipeline.precision", "pipeline.verify"), libraries=("onnx", "onnxconverter-common", "onnxruntime", "onnxruntime-ep-webgpu", "numpy")),
        Stage("models", bound(_stage_models), _slice("chunk_mib", "max_file_mib", "description", "chains", "watchdog_ms", "prewarm", "wasm_variant"),
              reads=("made", "feeds"), makes=("models", "contents"), code=("pipeline.assets",), libraries=("onnx", "brotli")),
        Stage("host_verify", bound(_stage_host_verify), _slice("outputs"),
              reads=("models", "made", "feeds"), makes=("reference", "host_checks"), code=("pipeline.verify",), libraries=("onnxruntime", "numpy")),
        Stage("webgpu_kernels", bound(_stage_webgpu_kernels), _slice("outputs", environment=_environment),
              reads=("contents", "models", "made", "reference", "feeds"), makes=("kernels", "contents"), code=("pipeline.verify",), libraries=("onnxruntime", "onnxruntime-ep-webgpu", "numpy")),
        Stage("files", bound(_stage_files), _slice("license", "max_file_mib", "runtime_version", "runtime_path", runtime=lambda s: s.runtime),
              reads=("contents", "made", "feeds", "reference", "models"), makes=("contents", "thresholds"), code=("pipeline.assets", "pipeline.web", "pipeline.web_template", "pipeline.verify.judgement.thresholds"), libraries=("brotli", "jinja2")),
        Stage("browser_verify", bound(_stage_browser_verify), _slice(browser=lambda s: s.browser, enabled=lambda s: s.options["browser"], gpu=lambda s: s.options["gpu"]),
              reads=("contents", "thresholds", "reference"), makes=("browser", "contents"), code=("pipeline.verify", "pipeline.web_template"), libraries=("playwright",)),
        Stage("judge", bound(_stage_judge), _slice("verify_require", "loader_select", "license"),
              reads=("contents", "made", "browser", "kernels", "host_checks", "thresholds"), makes=("checks", "manifest", "verdict"), code=("pipeline.manifest", "pipeline.verify.judgement.checks", "pipeline.web.select")),
        Stage("default_load", bound(_stage_default_load), _slice(browser=lambda s: s.browser, enabled=lambda s: s.options["browser"], gpu=lambda s: s.options["gpu"], engines=lambda s: s.options.get("engines", ["chromium"])),
              reads=("manifest", "checks", "verdict", "reference"), makes=("checks", "manifest", "verdict"), code=("pipeline.verify", "pipeline.web_template"), libraries=("playwright",)),
        # the report records how the source was found and checked: keyed by that record (the fetch's
        # key, the bytes alone, does not hold it), so a reused package never names another source
        Stage("write", bound(_stage_write), _slice("name", environment=_environment),
              reads=("manifest", "checks", "verdict", "made", "browser", "kernels", "repair_steps", "fetched", "source_sha"), makes=("report",), content=source_record,
              code=("pipeline.report", "pipeline.manifest", "pipeline.build", "pipeline.stage_table"), libraries=("jinja2", "numpy")),
    ]


def _sample_rate(recipe: Recipe) -> int | None:
    return next((int(s.pattern_options["sample_rate"]) for s in recipe.inputs.values() if "sample_rate" in s.pattern_options), None)


def _reuse_stored(key: str, options: BuildOptions, recipe: Recipe) -> BuildResult | None:
    """A stored package of a passed build with the same key, linked into place; None when none."""
    stored = stored_package(key)
    if stored is None:
        return None
    destination = options.out_dir / recipe.name
    _make_out_dir(options.out_dir)
    with staging_folder(options.out_dir, prefix=f".{recipe.name}.build-") as staging:
        link_tree(stored, staging)
        report = read_record(staging)
        _finish(staging, destination)
    # what building would have done besides the package: say its warnings, write its lock entry
    outcome = stored_outcome(key)
    say_again([line for line in outcome.get("warnings", []) if isinstance(line, str)])
    kept = fp16_lock_for(recipe, options.lock)
    if isinstance(outcome.get("fp16_lock"), dict) and kept.path is not None and kept.get(recipe.name, "fp16") != outcome["fp16_lock"]:
        kept.put(recipe.name, "fp16", outcome["fp16_lock"])
    return BuildResult(destination, report, reused=key, lock=lock_path(recipe, options.lock))


def _make_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(f"--out {out_dir}: cannot write there ({error.strerror or error}); give --out a writable folder") from None




def build(options: BuildOptions, progress: Progress) -> BuildResult:
    """Run the stage table: the fetch, then (unless a stored package has the last stage's key) the
    rest, with the package assembled in a staging folder renamed into place at the end."""
    check_shared_store()  # a shared cache named but unusable is bad input: before any work
    begin_traffic()
    result = _run_build(options, progress)
    return replace(result, shared=shared_traffic_line())


def _run_build(options: BuildOptions, progress: Progress) -> BuildResult:
    run = _Build(options, progress, options.out_dir)
    table = build_table(run)
    record = StageRun()
    recipe = load_build_recipe(options)
    lock_read = lock_for(recipe, options.lock).entry(recipe.name)  # as this build reads it: a pin the fetch writes is an output
    ledger: Ledger = {"recipe": recipe}
    run_stage(table[0], ledger, record, stage_boundary)
    settings = build_settings(recipe, options, lock_read)
    keys = stage_keys(table, settings, ledger)
    # Remote browsers are no input pack can hash (the device behind a URL changes): never reused.
    package_key = keys[table[-1].name] if options.reuse and reuse_enabled() and options.grid is None else None
    if package_key is not None:
        reused = _reuse_stored(package_key, options, recipe)
        if reused is not None:
            progress.note(f"nothing changed since the stored build {package_key[:12]}: its package is linked into place")
            return reused
    staged = table.index(next(stage for stage in table if stage.name == "models"))
    # the fetch runs on a reuse too, and says its own warnings there: the others are recorded
    with recorded_warnings() as said:
        for stage in table[1:staged]:
            run_stage(stage, ledger, record, stage_boundary, keys[stage.name])
        destination = options.out_dir / recipe.name
        _make_out_dir(options.out_dir)
        with staging_folder(options.out_dir, prefix=f".{recipe.name}.build-") as staging:
            run.staging = staging
            ledger["timings"] = record.seconds  # the write stage reports every stage's time (its own as far as it got)
            for stage in table[staged:]:
                run_stage(stage, ledger, record, stage_boundary, keys[stage.name])
            report = ledger["report"]
            if package_key is not None and report["passed"]:
                stage_boundary("store")
                store_package(package_key, staging, {"warnings": said, "fp16_lock": fp16_lock_for(recipe, options.lock).get(recipe.name, "fp16")})
            stage_boundary("finish")
            _finish(staging, destination)
    return BuildResult(destination, report, lock=lock_path(recipe, options.lock))
