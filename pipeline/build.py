"""`pack build`: recipe → repaired, converted, verified, compressed package in dist/<name>/.

A build is the table of keyed stages in pipeline/stages/ (one module each, in run order), run here
by `stage_table.run_stage`. Each stage reads a slice of the `BuildSettings` and the artefacts
earlier stages made; each is keyed by the one key function (pipeline/keys.py), chained from the
stages it reads, so the last stage's key names the whole package: a passed package stored under
it (pipeline/reuse.py, shared through pipeline/shared_cache.py) is linked into place instead of
built. This module keeps what is not a stage: the options, the settings the keys hold, the runner,
the lock entry the convert stage finds (written here, so a stored package also answers the rebuild
after the write), and reuse. The package is assembled in a temporary folder beside its destination
and renamed into place at the end, so a build that stops on bad input (PackError, exit 2) leaves
nothing half-written.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipeline.cache import file_sha256, reading_through, staging_folder, swap_into_place
from pipeline.errors import PackError, recorded_warnings, say_again
from pipeline.keys import as_data
from pipeline.lockfile import fp16_lock_for, lock_for
from pipeline.progress import Progress
from pipeline.recipe import InputSpec, Recipe, find_recipe, load_recipe_file, parse_input_option, recipe_from_model
from pipeline.report.record import Record, read_record
from pipeline.reuse import KILL_AT_ENV, browser_version, link_tree, reuse_enabled, store_package, stored_outcome, stored_package
from pipeline.runtime import local_runtime
from pipeline.shared_cache import StoreSession
from pipeline.source import is_url
from pipeline.stage_table import Ledger, Stage, StageRun, run_stage, stage_keys
from pipeline.stages import ARTEFACTS, STAGES
from pipeline.stages.context import BuildLocks, BuildOptions, StageContext

__all__ = ["BuildOptions", "BuildResult", "BuildSettings", "build", "load_build_recipe"]


@dataclass
class BuildResult:
    package_dir: Path
    report: Record
    reused: str | None = None  # the build key, when a stored package with the same inputs was linked into place
    lock: Path | None = None  # the lock file the build read or wrote, when there is one (the summary names it)
    shared: str | None = None  # what the build read from and wrote to its shared store (one line), when it did

    @property
    def exit_code(self) -> int:
        """The one verdict (report.json `passed` = manifest `verification.passed` = report.html's badge)."""
        return 0 if self.report["passed"] else 1


def stage_boundary(name: str) -> None:
    """The fault tests' one hook: SIGKILL this process as it enters the stage named by KILL_AT_ENV
    (a stage's name, or `store`/`finish`), to prove a build killed anywhere leaves nothing a
    rebuild trips on."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def load_build_recipe(options: BuildOptions) -> Recipe:
    recipe_path = find_recipe(options.target)
    if recipe_path is not None:
        recipe = load_recipe_file(recipe_path)
        if options.name:
            raise PackError(f"--name names the package of a bare model; recipe {recipe_path} names its own (key 'name')")
        if options.source_sha256 and not options.source:
            raise PackError(f"--sha256 checks --source or a model given as the target; for recipe {recipe_path} set its key 'source.sha256', or give --source with --sha256")
    elif is_url(options.target) or options.target.endswith(".onnx") or Path(options.target).exists():
        recipe = recipe_from_model(Path(urlsplit(options.target).path) if is_url(options.target) else Path(options.target), options.name)
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


def build_locks(recipe: Recipe, options: BuildOptions) -> BuildLocks:
    return BuildLocks(source=lock_for(recipe, options.lock), fp16=fp16_lock_for(recipe, options.lock))


# --- the settings a build's result depends on ---------------------------------------------------


@dataclass(frozen=True)
class BuildSettings:
    """Everything a build's result depends on besides the source bytes (which the fetch keys):
    each stage reads a slice of it by dotted name (`Stage.settings`) and its key holds that slice.
    Tools appear by what decides their results (versions, shipped bytes), never by where they lie."""

    recipe: dict[str, Any]  # the recipe as data: no machine paths, files as their sha256
    options: dict[str, Any]  # the options that change results
    fp16_lock: dict | None  # the lock's fp16 entry as this build reads it
    runtime: str  # onnxruntime-web's version (a local build: with its shipped files' sha256)
    browser: str | None  # the Chromium that verifies, by its version (None: --no-browser)
    mesa: str | None  # the Mesa whose lavapipe runs the WebGPU kernels, by its version
    engines: dict[str, str | None]  # the other engines that verify (firefox, webkit), by version or library bytes (None: not installed)
    environment: dict[str, str]  # the PACK_* settings some stage declares as changing its result


# Recipe keys no stage's key holds: where the recipe file lies (its content is what counts), and
# how the source is found and checked (the fetch is keyed by the bytes it yields: the same file
# from a path, a URL or a registry package is the same input).
RECIPE_KEYS_OUTSIDE_KEYS = ("path", "source", "source_sha256", "source_data_sha256", "source_size", "source_opset", "source_precision", "source_instructions")


def result_settings(table: tuple[Stage, ...] = STAGES) -> tuple[str, ...]:
    """The environment settings that change some stage's result: the allow-list the keys hold
    (every other PACK_* setting says where things live or how a command moves packages)."""
    return tuple(sorted({name.split(".", 1)[1] for stage in table for name in stage.settings if name.startswith("environment.")}))


def build_settings(recipe: Recipe, options: BuildOptions, locks: BuildLocks) -> BuildSettings:
    from pipeline.stages.browser_verify import build_engines
    from pipeline.verify.engines.browser.chromium import chromium_path
    from pipeline.verify.engines.browser.driven import engine_identity
    from pipeline.verify.engines.webgpu_kernels import mesa_version

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
    environment = {name: os.environ[name] for name in result_settings() if name in os.environ}
    driven = [name for name in build_engines(options.engines, recipe.verify_engines) if name != "chromium"] if options.browser else []
    return BuildSettings(recipe_data, options_data, locks.fp16.get(recipe.name, "fp16"), runtime,
                         browser_version(chromium_path()) if options.browser else None, mesa_version(),
                         {name: engine_identity(name) for name in driven}, environment)


# --- the runner ---------------------------------------------------------------------------------


def _reuse_stored(key: str, options: BuildOptions, recipe: Recipe, locks: BuildLocks) -> BuildResult | None:
    """A stored package of a passed build with the same key, linked into place; None when none."""
    stored = stored_package(key)
    if stored is None:
        return None
    destination = options.out_dir / recipe.name
    _make_out_dir(options.out_dir)
    with staging_folder(options.out_dir, prefix=f".{recipe.name}.build-") as staging:
        link_tree(stored, staging)
        report = read_record(staging)
        swap_into_place(staging, destination)
    # what building would have done besides the package: say its warnings, write its lock entry
    outcome = stored_outcome(key)
    say_again([line for line in outcome.get("warnings", []) if isinstance(line, str)])
    if isinstance(outcome.get("fp16_lock"), dict):
        _write_fp16_lock(locks, recipe, outcome["fp16_lock"])
    return BuildResult(destination, report, reused=key, lock=locks.path)


def _write_fp16_lock(locks: BuildLocks, recipe: Recipe, entry: dict | None) -> bool:
    """The fp16 entry convert found, in the lock file (when it changes it); True when written."""
    if entry is None or locks.fp16.path is None or locks.fp16.get(recipe.name, "fp16") == entry:
        return False
    locks.fp16.put(recipe.name, "fp16", entry)
    return True


def _make_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(f"--out {out_dir}: cannot write there ({error.strerror or error}); give --out a writable folder") from None


def build(options: BuildOptions, progress: Progress, shared: StoreSession | None = None) -> BuildResult:
    """Run the stage table: the fetch, then (unless a stored package has the last stage's key) the
    rest, with the package assembled in a staging folder renamed into place at the end. `shared`:
    the store the cache reads through and writes back to for this build (opened and checked by the
    command line); None leaves the cache as the caller set it (local only, from the command line)."""
    if shared is None:
        return _run_build(options, progress)
    with reading_through(shared):
        result = _run_build(options, progress)
    return replace(result, shared=shared.traffic_line())


def _run_build(options: BuildOptions, progress: Progress) -> BuildResult:
    table = list(STAGES)
    record = StageRun()
    recipe = load_build_recipe(options)
    locks = build_locks(recipe, options)
    context = StageContext(options, progress, locks)
    ledger: Ledger = {"recipe": recipe, "timings": record.seconds}  # the write stage reports every stage's time (its own as far as it got)

    def run(stage: Stage, key: str | None = None) -> None:  # announced: a log line as each begins and ends (pipeline/progress.py)
        progress.step(f"stage {stage.name}", run_stage)(stage, ledger, record, context, stage_boundary, key, ARTEFACTS)

    run(table[0])
    settings = build_settings(recipe, options, locks)
    keys = stage_keys(table, settings, ledger)
    # Remote browsers are no input pack can hash (the device behind a URL changes): never reused.
    package_key = keys[table[-1].name] if options.reuse and reuse_enabled() and options.grid is None else None
    if package_key is not None:
        reused = _reuse_stored(package_key, options, recipe, locks)
        if reused is not None:
            progress.note(f"nothing changed since the stored build {package_key[:12]}: its package is linked into place")
            return reused
    staged = next(index for index, stage in enumerate(table) if stage.name == "models")
    # the fetch runs on a reuse too, and says its own warnings there: the others are recorded
    with recorded_warnings() as said:
        for stage in table[1:staged]:
            run(stage, keys[stage.name])
        lock_written = _write_fp16_lock(locks, recipe, ledger["fp16_lock"])
        destination = options.out_dir / recipe.name
        _make_out_dir(options.out_dir)
        with staging_folder(options.out_dir, prefix=f".{recipe.name}.build-") as staging:
            context.staging = staging
            for stage in table[staged:]:
                run(stage, keys[stage.name])
            report = ledger["report"]
            if package_key is not None and report["passed"]:
                stage_boundary("store")
                outcome = {"warnings": said, "fp16_lock": ledger["fp16_lock"]}
                store_package(package_key, staging, outcome)
                if lock_written:  # the rebuild after the write reads the entry: its key, the same package
                    after = stage_keys(table, build_settings(recipe, options, locks), ledger)[table[-1].name]
                    store_package(after, staging, outcome)
            stage_boundary("finish")
            swap_into_place(staging, destination)
    return BuildResult(destination, report, lock=locks.path)
