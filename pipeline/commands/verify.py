"""`pack verify DIST/NAME`: re-run the browser checks and the webgpu-kernels checks on a built package.

The reference is recomputed on the host from the package itself (its fp32 variant on onnxruntime
CPU, fed the package's sample), and each check keeps the threshold the build recorded in the
manifest's `thresholds` (recipe overrides included). The result goes to stdout; the package's
published files are not modified, only its report.html and report.data.npz (pipeline/report),
which show this verification. `--runtime A --runtime B` runs the same package on other
onnxruntime-web builds (npm versions, dev builds, local builds) and prints them side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from pipeline.commands.browsers import DEFAULT_BUDGET_S, BrowserOption, BudgetOption, CdpOption, RemoteChromiumOption, RequireAllOption, grid_settings
from pipeline.commands.common import cli_errors, print_json, progress_for, require_package_folder
from pipeline.commands.summary import MARKS, browser_lines, check_line, device_lines, webgpu_kernel_lines
from pipeline.errors import PackError
from pipeline.runtime import runtime_from_option
from pipeline.verify.browser.plan import load_manifest
from pipeline.verify.thresholds import threshold_for

if TYPE_CHECKING:  # numpy is imported where used: every `pack` command would load it otherwise
    import numpy as np

    from pipeline.verify.browser.harness import BrowserResult

# The most faithful variant available is the reference when a package ships no fp32 one.
REFERENCE_PRECISIONS = ("fp32", "fp16")


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
) -> None:
    """Verify a built package in headless Chromium on WebGPU and WASM, and on onnxruntime's WebGPU kernels on lavapipe where installed (exit 1 when a check fails)."""
    with cli_errors():
        # Imported here: the browser harness and onnxruntime load only when this command runs.
        from pipeline.verify.browser.chromium import launch_browser
        from pipeline.verify.browser.grid import exit_policy, verify_on_grid
        from pipeline.verify.browser.harness import verify_in_browser
        from pipeline.verify.host import reference_outputs

        grid = grid_settings(browsers, cdps, require_all=require_all, budget_s=browser_budget_s, remote_chromium=remote_chromium)
        if grid is not None and runtime:
            raise PackError("--runtime with --browser/--cdp: compare runtimes on one browser at a time; drop one of them")
        require_package_folder(package, "verify")
        progress = progress_for(json_output)
        manifest = load_manifest(package)
        runtimes = [runtime_from_option(value, "--runtime", progress) for value in runtime or []]
        labels = [rt.label for rt in runtimes]
        if len(set(labels)) != len(labels):
            raise PackError(f"--runtime: the same runtime twice ({', '.join(labels)}); give different ones")
        feeds = sample_feeds(package, manifest)
        reference_variant, reference_path = reference_model(package, manifest)
        progress.note(f"reference: {reference_path.name} on onnxruntime CPU")
        references = reference_outputs(reference_path, feeds)
        thresholds = recorded_thresholds(manifest)
        if grid is not None:
            result = verify_on_grid(grid, package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle, watchdog_ms=watchdog_ms)
        elif not runtimes:
            result = verify_in_browser(package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle, watchdog_ms=watchdog_ms)
        else:
            results = {}
            with launch_browser(gpu=gpu) as browser:
                for chosen in runtimes:
                    progress.note(f"onnxruntime-web {chosen.label}")
                    results[chosen.label] = verify_in_browser(package, references, thresholds, gpu=gpu, progress=progress, bundle=bundle,
                                                              watchdog_ms=watchdog_ms, browser=browser, runtime=chosen)
        # onnxruntime's own WebGPU kernels do not depend on the onnxruntime-web build: run once.
        kernel_checks, kernel_facts = package_kernel_checks(package, manifest, feeds, references, progress)
        kernels_failed = any(c["status"] == "failed" for c in kernel_checks)
    if runtimes:
        failed = kernels_failed or any(r.failed for r in results.values())
        document = {"name": manifest.get("name"), "passed": not failed, "reference": reference_variant,
                    "runtimes": [{"runtime": label, "passed": not r.failed, "checks": r.checks, "browser": r.report} for label, r in results.items()],
                    "webgpu_kernels": {"checks": kernel_checks, **kernel_facts}}
        lines = side_by_side_lines(results)
        # the runtimes' verdict line stays last; the runtime-independent kernel checks go before it
        lines[-1:-1] = [check_line(check) for check in kernel_checks] + webgpu_kernel_lines(kernel_facts)
    else:
        result.checks.extend(kernel_checks)
        policy_failed, why = exit_policy(result, grid)
        failed = result.failed or policy_failed
        document = {"name": manifest.get("name"), "passed": not failed, "reference": reference_variant,
                    "checks": result.checks, "browser": result.report, "webgpu_kernels": kernel_facts}
        lines = summary_lines(result, kernel_facts, why, failed)
    with cli_errors():
        if runtimes:
            checks = [dict(c, runtime=label) for label, r in results.items() for c in r.checks] + kernel_checks
            outputs = {f"{run} @{label}": kept for label, r in results.items() for run, kept in r.outputs.items()}
            browser_facts = next(iter(results.values())).report
        else:
            checks, outputs, browser_facts = result.checks, result.outputs, result.report
        by = "pack verify" + (f" --bundle {bundle}" if bundle else "") + "".join(f" --runtime {label}" for label in labels)
        _write_report(package, by, checks, outputs, browser_facts, kernel_facts, progress)
    if json_output:
        print_json(document)
    else:
        for line in lines:
            typer.echo(line)
    raise typer.Exit(1 if failed else 0)


def _write_report(package: Path, by: str, checks: list[dict], outputs: dict, browser: dict, kernels: dict, progress) -> None:
    """report.html shows this verification (the build's host checks stay); a package folder that
    cannot be written keeps its old report, with a warning: the checks above stand."""
    from pipeline.report.data import ReportData
    from pipeline.report.render import write_report

    verification = {"by": by, "checks": checks, "browser": browser, "webgpu_kernels": kernels}
    try:
        path = write_report(package, ReportData(outputs, verification), progress)
    except PackError as error:
        typer.echo(f"warning: report.html not updated: {error}", err=True)
        return
    progress.note(f"report: {path}")


def sample_feeds(package: Path, manifest: dict) -> dict[str, np.ndarray]:
    """The package's sample inputs, decoded from `sample.<h>.bin` (or its .br copy)."""
    from pipeline.assets.samples import read_sample

    return read_sample(package, manifest)[0]


def reference_model(package: Path, manifest: dict) -> tuple[str, Path]:
    """(variant name, model path) of the highest-precision variant the package ships."""
    for precision in REFERENCE_PRECISIONS:
        for name, variant in manifest["variants"].items():
            if variant.get("precision") == precision:
                from pipeline.assets.chunks import runnable_model

                return name, runnable_model(package, variant, name)
    raise PackError(f"{package / 'manifest.json'}: no fp32 or fp16 variant to compute a reference from; rebuild with an fp32 variant")


def recorded_thresholds(manifest: dict) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] for the harness: the bounds the build checked, from the
    manifest (its wasm bounds, else its webgpu ones, which the harness's own widening leaves as
    they are), else the defaults."""
    recorded = manifest["thresholds"]
    table: dict[str, dict[str, dict]] = {}
    for variant, spec in manifest["variants"].items():
        table[variant] = {}
        for output in manifest["outputs"]:
            name = output["name"]
            bounds = next((recorded[ep][variant][name] for ep in ("wasm", "webgpu") if name in recorded.get(ep, {}).get(variant, {})), None)
            table[variant][name] = dict(bounds) if bounds else threshold_for(output.get("kind", "tensor"), spec.get("precision", "fp32"), "wasm")
    return table


def package_kernel_checks(package: Path, manifest: dict, feeds: dict[str, np.ndarray], references: dict[str, np.ndarray], progress) -> tuple[list[dict], dict]:
    """The webgpu-kernels stage on the package's fp16/fp16w/fp32 variants as shipped (its WebGPU EP
    options, no layout retry), with the WebGPU bounds the build recorded in the manifest, else
    the defaults."""
    from pipeline.assets.chunks import runnable_model
    from pipeline.verify.checks import webgpu_kernel_checks

    recorded = (manifest.get("thresholds") or {}).get("webgpu") or {}
    kinds = {output["name"]: output.get("kind", "tensor") for output in manifest["outputs"]}
    models: dict[str, Path] = {}
    thresholds: dict[str, dict[str, dict]] = {}
    for name, variant in manifest["variants"].items():
        precision = variant.get("precision", "fp32")
        if precision not in ("fp16", "fp16w", "fp32"):
            continue
        # as the loader hands it to onnxruntime-web: chunks reassembled, fp16w widened
        models[name] = runnable_model(package, variant, name)
        thresholds[name] = {output: recorded.get(name, {}).get(output) or threshold_for(kinds.get(output, "tensor"), precision, "webgpu") for output in references}
    ep_options = (manifest.get("epOptions") or {}).get("webgpu") or {}
    return webgpu_kernel_checks(models, references, feeds, thresholds, kinds, progress, ep_options, retry_layout=False)


def side_by_side_lines(results: dict[str, BrowserResult]) -> list[str]:
    """Several runtimes on one package: each check once per runtime, then a speed table
    (production settings: session create / first run / median steady run, in ms)."""
    first = next(iter(results.values()))
    lines = [browser_lines(first.report)[0], "checks:"]
    width = max(len(label) for label in results)
    for label, result in results.items():
        for check in result.checks:
            lines.append(f"  [{label:<{width}}]{check_line(check)}")
    run_labels = list(dict.fromkeys(run for result in results.values() for run in result.report["eps"]))
    column = max(24, width + 2)
    lines.append("speed (ms, production settings: create / first / steady):")
    lines.append(f"  {'run':<28}" + "".join(f"{label:<{column}}" for label in results))
    for run in run_labels:
        cells = []
        for result in results.values():
            figures = result.report["eps"].get(run) or {}
            times = [figures.get(key) for key in ("session_create_ms", "first_run_ms", "steady_run_ms")]
            cells.append(" / ".join("-" if t is None else f"{t:.0f}" if t >= 10 else f"{t:.1f}" for t in times)
                         + ("" if figures.get("status") == "passed" else f" ({figures.get('status')})"))
        lines.append(f"  {run:<28}" + "".join(f"{cell:<{column}}" for cell in cells))
    labels = list(results)
    if len(labels) >= 2:
        base, other = results[labels[0]].report["eps"], results[labels[1]].report["eps"]
        for run in run_labels:
            a, b = (base.get(run) or {}).get("steady_run_ms"), (other.get(run) or {}).get("steady_run_ms")
            if a and b:
                lines.append(f"  {run}: {labels[1]} steady is {a / b:.2f}x the speed of {labels[0]}")
    verdicts = []
    for label, result in results.items():
        counts = {status: sum(c["status"] == status for c in result.checks) for status in MARKS}
        verdicts.append(f"{label}: {'FAILED' if result.failed else 'PASSED'} ({counts['passed']} passed, {counts['failed']} failed, "
                        f"{counts['not-verifiable']} not verifiable)")
    lines.append("; ".join(verdicts))
    return lines


def summary_lines(result: BrowserResult, kernel_facts: dict | None = None, policy: str | None = None, failed: bool | None = None) -> list[str]:
    """Per-check lines, per-run browser facts (per device on several browsers), the
    webgpu-kernels facts, and a verdict."""
    if "endpoints" in result.report:
        other = [check_line(check) for check in result.checks if check["stage"] != "browser"]
        lines = [*device_lines(result.report, result.checks), *(["checks:", *other] if other else [])]
    else:
        browser = browser_lines(result.report)
        lines = [browser[0], "checks:", *(check_line(check) for check in result.checks), "runs:", *browser[1:]]
    if kernel_facts:
        lines.extend(webgpu_kernel_lines(kernel_facts))
    if policy:
        lines.append(f"browsers: {policy}")
    counts = {status: sum(c["status"] == status for c in result.checks) for status in MARKS}
    verdict = "FAILED" if (result.failed if failed is None else failed) else "PASSED"
    errors = f", {counts['error']} error" if counts.get("error") else ""
    lines.append(f"{verdict}: {counts['passed']} passed, {counts['failed']} failed, {counts['not-verifiable']} not verifiable{errors}")
    return lines
