"""`pack verify DIST/NAME`: re-run the browser checks and the webgpu-kernels checks on a built package
(pipeline/verify/package.py). The result goes to stdout; the package's published files are not
modified, only its report.html and report.data.npz (pipeline/report), which show this verification.
`--runtime A --runtime B` runs the same package on other onnxruntime-web builds (npm versions, dev
builds, local builds) and prints them side by side.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from pipeline.commands.browsers import DEFAULT_BUDGET_S, BrowserOption, BudgetOption, CdpOption, RemoteChromiumOption, RequireAllOption, grid_settings
from pipeline.commands.common import CacheUrlOption, cli_errors, open_shared_store, print_json, progress_for, require_package_folder
from pipeline.errors import PackError
from pipeline.runtime import runtime_from_option

if TYPE_CHECKING:
    from pipeline.verify.package import PackageVerification


def verify(
    package: Annotated[Path, typer.Argument(help="A package folder made by `pack build` (dist/<name>).")],
    gpu: Annotated[bool, typer.Option("--gpu", help="Launch Chromium with the flags for a hardware Vulkan adapter (verifies fp16 on WebGPU where the GPU has shader-f16).")] = False,
    bundle: Annotated[Optional[str], typer.Option("--bundle", help="Diagnostic: run every check on this bundle of the installed onnxruntime-web instead of the shipped one (webgpu, wasm, or root = the JSEP build pack never ships).")] = None,
    watchdog_ms: Annotated[Optional[int], typer.Option("--watchdog-ms", min=1000, help="Per-stage time limit in the browser; default: the manifest's loader.watchdogMs.")] = None,
    runtime: Annotated[Optional[list[str]], typer.Option("--runtime", help="Run on this onnxruntime-web instead of the shipped one: an exact npm version (dev builds too) or a local build's folder. Repeat to compare runtimes side by side.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print checks and browser facts as JSON; no progress output.")] = False,
    browsers: BrowserOption = None,
    cdps: CdpOption = None,
    require_all: RequireAllOption = False,
    browser_budget_s: BudgetOption = DEFAULT_BUDGET_S,
    remote_chromium: RemoteChromiumOption = None,
    cache_url: CacheUrlOption = None,
    engines: Annotated[str, typer.Option("--engines", help="Browser engines that rerun the checks, comma-separated: chromium (always runs: the build's engine), firefox (Debian's firefox-esr), webkit (WebKitGTK's MiniBrowser under Xvfb); an engine not installed is not-verifiable with the install line.")] = "chromium",
) -> None:
    """Verify a built package in headless Chromium on WebGPU and WASM, and on onnxruntime's WebGPU kernels on lavapipe where installed (exit 1 when a check fails)."""
    with cli_errors():
        # Imported here: the browser harness and onnxruntime load only when this command runs.
        from pipeline.assets.chunks import runnable_model
        from pipeline.cache import reading_through
        from pipeline.commands.summary import verify_lines
        from pipeline.verify.engines.browser.default_load import parse_engines
        from pipeline.verify.engines.browser.run_plan import load_manifest
        from pipeline.verify.package import verify_package

        chosen_engines = parse_engines(engines)
        grid = grid_settings(browsers, cdps, require_all=require_all, budget_s=browser_budget_s, remote_chromium=remote_chromium)
        if grid is not None and runtime:
            raise PackError("--runtime with --browser/--cdp: compare runtimes on one browser at a time; drop one of them")
        shared = open_shared_store(cache_url)  # runtimes and WebGPU-kernel runs read through it
        require_package_folder(package, "verify")
        progress = progress_for(json_output)
        manifest = load_manifest(package)
        with reading_through(shared) if shared is not None else nullcontext():  # none named: the cache as the caller left it
            runtimes = [runtime_from_option(value, "--runtime", progress) for value in runtime or []]
            labels = [rt.label for rt in runtimes]
            if len(set(labels)) != len(labels):
                raise PackError(f"--runtime: the same runtime twice ({', '.join(labels)}); give different ones")
            verification = verify_package(package, manifest, runnable_model, runtimes=runtimes, grid=grid, gpu=gpu, bundle=bundle,
                                          watchdog_ms=watchdog_ms, progress=progress, engines=chosen_engines)
        lines = verify_lines(verification)
        by = "pack verify" + (f" --engines {','.join(chosen_engines)}" if chosen_engines != ("chromium",) else "") + (f" --bundle {bundle}" if bundle else "") + "".join(f" --runtime {label}" for label in labels)
        _write_report(package, by, verification, progress)
    if json_output:
        print_json(verification.document(manifest.get("name")))
    else:
        for line in lines:
            typer.echo(line)
    raise typer.Exit(1 if verification.failed else 0)


def _write_report(package: Path, by: str, verification: PackageVerification, progress) -> None:
    """report.html shows this verification (the build's host checks stay); a package folder that
    cannot be written keeps its old report, with a warning: the checks above stand."""
    from pipeline.report.data import ReportData
    from pipeline.report.render import write_report

    facts = {"by": by, "passed": not verification.failed,  # the badge follows the exit code
             "checks": verification.checks(), "browser": verification.browser(), "webgpu_kernels": verification.kernel_facts}
    try:
        path = write_report(package, ReportData(verification.outputs(), facts), progress)
    except PackError as error:
        typer.echo(f"warning: report.html not updated: {error}", err=True)
        return
    progress.note(f"report: {path}")
