"""Verify a built package (`pack verify DIST/NAME`): the browser checks and the webgpu-kernels checks
of the package as shipped.

The reference is recomputed on the host from the package itself (its fp32 variant on onnxruntime
CPU, fed the package's sample: pipeline/sample_file.py), and each check keeps the threshold the
build recorded in the manifest's `thresholds` (recipe overrides included; thresholds.py
`recorded_thresholds`). Several onnxruntime-web builds (`--runtime`) run the same package one after
the other; several browsers (`--browser`, `--cdp`) at once (browser/grid.py).

How a variant's model file is opened is the caller's (`model_file`): a model over `[assets]
chunk_mib` ships its weights in chunks that pipeline/assets/chunks.py reassembles, a later stage
than this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.sample_file import read_sample
from pipeline.verify.judgement.checks import Check, any_failed, refused_by_build, tagged
from pipeline.verify.judgement.thresholds import FLOAT_PRECISIONS, manifest_judging, recorded_kernel_thresholds, recorded_thresholds

if TYPE_CHECKING:
    import numpy as np

    from pipeline.runtime import Runtime
    from pipeline.verify.engines.browser.grid import GridSettings
    from pipeline.verify.engines.browser.harness import BrowserResult

# The most faithful variant available is the reference when a package ships no fp32 one.
REFERENCE_PRECISIONS = ("fp32", "fp16")
# (package folder, manifest variant entry, variant name) -> a model file onnxruntime can open
ModelFile = Callable[[Path, dict, str], Path]


@dataclass
class PackageVerification:
    """What `pack verify` found: one browser result (the shipped runtime, on one or several
    browsers), or one per `--runtime`; and the webgpu-kernels checks, which do not depend on the
    onnxruntime-web build and run once."""

    reference: str  # the variant the host reference was computed from
    kernel_checks: list[Check]
    kernel_facts: dict  # report.json "webgpu_kernels"
    result: BrowserResult | None = None  # its checks include the kernel checks
    runtimes: dict[str, BrowserResult] = field(default_factory=dict)  # runtime label -> result
    policy: str | None = None  # what the several-browsers policy says (browser/grid.py exit_policy)
    failed: bool = False

    def checks(self) -> list[Check]:
        """Every check; with several runtimes, each browser check tagged with its runtime."""
        if self.result is not None:
            return self.result.checks
        return [entry for label, result in self.runtimes.items() for entry in tagged(result.checks, runtime=label)] + self.kernel_checks

    def outputs(self) -> dict:
        """run label -> output -> what the browser produced (report.data.npz)."""
        if self.result is not None:
            return self.result.outputs
        return {f"{run} @{label}": kept for label, result in self.runtimes.items() for run, kept in result.outputs.items()}

    def browser(self) -> dict:
        """report.json "browser" facts (the first runtime's, with several)."""
        return self.result.report if self.result is not None else next(iter(self.runtimes.values())).report

    def document(self, name: str | None) -> dict:
        """The `pack verify --json` document."""
        head = {"name": name, "passed": not self.failed, "reference": self.reference}
        if self.result is not None:
            return {**head, "checks": self.result.checks, "browser": self.result.report, "webgpu_kernels": self.kernel_facts}
        return {**head, "runtimes": [{"runtime": label, "passed": not r.failed, "checks": r.checks, "browser": r.report} for label, r in self.runtimes.items()],
                "webgpu_kernels": {"checks": self.kernel_checks, **self.kernel_facts}}


def verify_package(package: Path, manifest: dict, model_file: ModelFile, *, runtimes: list[Runtime] | None = None, grid: GridSettings | None = None,
                   gpu: bool = False, bundle: str | None = None, watchdog_ms: int | None = None, progress: Progress | None = None,
                   engines: tuple[str, ...] = ("chromium",)) -> PackageVerification:
    """The browser checks of `package` (on each of `runtimes` when given, else on the shipped one,
    on `grid`'s browsers when given) and its webgpu-kernels checks, against a host reference.
    `engines` other than Chromium (which always runs: the build's engine) rerun the browser checks
    in Firefox or WebKit besides it (harness.py `engine`); each engine's failures are judged against
    the build's runs as that engine reads them (pipeline.manifest.in_engine)."""
    from pipeline.verify.engines.browser.chromium import launch_browser
    from pipeline.verify.engines.browser.grid import exit_policy, verify_on_grid
    from pipeline.verify.engines.browser.harness import verify_in_browser
    from pipeline.verify.engines.host import reference_outputs

    progress = progress or Progress.quiet()
    feeds = read_sample(package, manifest)[0]
    reference, reference_path = reference_model(package, manifest, model_file)
    progress.note(f"reference: {reference_path.name} on onnxruntime CPU")
    references = reference_outputs(reference_path, feeds)
    thresholds = recorded_thresholds(manifest)
    result, results = None, {}
    if grid is not None:
        result = verify_on_grid(grid, package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle, watchdog_ms=watchdog_ms)
    elif not runtimes:
        result = verify_in_browser(package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle, watchdog_ms=watchdog_ms)
    else:
        with launch_browser(gpu=gpu) as browser:
            for chosen in runtimes:
                progress.note(f"onnxruntime-web {chosen.label}")
                results[chosen.label] = verify_in_browser(package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle,
                                                          watchdog_ms=watchdog_ms, browser=browser, runtime=chosen)
    others = [engine for engine in engines if engine != "chromium"]
    if others and runtimes:
        raise PackError("--engines with --runtime: compare runtimes in Chromium, engines on the shipped runtime; drop one of them")
    for engine in others:
        progress.note(f"browser checks in {engine}")
        found = verify_in_browser(package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle, watchdog_ms=watchdog_ms, engine=engine, profile=False)
        assert result is not None  # no --runtime: one result
        result.checks.extend(found.checks)
        result.report = {**result.report, "engines": {**result.report.get("engines", {}), engine: found.report}}
        result.outputs.update({f"{label} @{engine}": kept for label, kept in found.outputs.items()})
    # onnxruntime's own WebGPU kernels do not depend on the onnxruntime-web build: run once.
    kernel_checks, kernel_facts = package_kernel_checks(package, manifest, feeds, references, progress, model_file)
    # a failure where the build already refused the triple fails nothing: the loader never runs it
    kernel_checks = refused_by_build(kernel_checks, manifest)
    for browser_result in ([result] if result is not None else []) + list(results.values()):
        browser_result.checks[:] = refused_by_build(browser_result.checks, manifest)
    verification = PackageVerification(reference, kernel_checks, kernel_facts, result, results)
    if result is None:
        verification.failed = any_failed(kernel_checks) or any(r.failed for r in results.values())
    else:
        result.checks.extend(kernel_checks)
        policy_failed, verification.policy = exit_policy(result, grid)
        verification.failed = result.failed or policy_failed
    return verification


def reference_model(package: Path, manifest: dict, model_file: ModelFile) -> tuple[str, Path]:
    """(variant name, model path) of the highest-precision variant the package ships."""
    for precision in REFERENCE_PRECISIONS:
        for name, variant in manifest["variants"].items():
            if variant.get("precision") == precision:
                return name, model_file(package, variant, name)
    raise PackError(f"{package / 'manifest.json'}: no fp32 or fp16 variant to compute a reference from; rebuild with an fp32 variant")


def package_kernel_checks(package: Path, manifest: dict, feeds: dict[str, np.ndarray], references: dict[str, np.ndarray], progress: Progress,
                          model_file: ModelFile) -> tuple[list[Check], dict]:
    """The webgpu-kernels stage on the package's fp16/fp16w/fp32 variants as shipped (its WebGPU EP
    options, no layout retry), with the WebGPU bounds the build recorded in the manifest, else
    the defaults."""
    from pipeline.verify.stages import webgpu_kernel_checks

    kinds = {output["name"]: output.get("kind", "tensor") for output in manifest["outputs"]}
    models: dict[str, Path] = {}
    for name, variant in manifest["variants"].items():
        if variant.get("precision", "fp32") not in FLOAT_PRECISIONS:
            continue
        # as the loader hands it to onnxruntime-web: chunks reassembled, fp16w widened
        models[name] = model_file(package, variant, name)
    thresholds = recorded_kernel_thresholds(manifest, list(references))
    ep_options = (manifest.get("epOptions") or {}).get("webgpu") or {}
    return webgpu_kernel_checks(models, references, feeds, thresholds, kinds, progress, ep_options, retry_layout=False, judging=manifest_judging(manifest))
