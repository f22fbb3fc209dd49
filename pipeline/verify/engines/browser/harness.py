"""Browser checks: run a built package in headless Chromium on every (bundle, EP, variant) it ships.

For each platform chain of manifest["executionProviders"], the chain's bundle (webgpu when the
chain has webgpu, else wasm: ARCHITECTURE.md) runs each EP of the chain with every variant the
package ships (the loader can be asked for any: run_plan.py). A run goes through the package's own loader.js on a fresh page of one
shared browser, feeds the package's sample inputs and compares every output with the fp32 host
reference (pipeline.verify.judgement.metrics). Besides exceptions, a run fails on WebGPU errors, onnxruntime
error lines, output-size warnings, NaN/Inf and the watchdog. A variant that needs an adapter feature
the adapter lacks (fp16 without shader-f16) is "not-verifiable", never "passed".
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import PackError
from pipeline.manifest import Manifest, manifest_bytes, validate
from pipeline.progress import Progress
from pipeline.runtime import Runtime, resolve_runtime
from pipeline.verify.engines.browser import logs
from pipeline.verify.engines.browser.devices import device_facts
from pipeline.verify.engines.browser.driven import driver_for
from pipeline.verify.engines.browser.run_plan import PlannedRun, load_manifest, plan_runs
from pipeline.verify.engines.browser.pages import BrowserRunner, RunnerPage, decode_tensor
from pipeline.verify.judgement.checks import Check, any_failed, check, decision_check, judged, numeric_bounds, rounded_metrics, tagged

DEFAULT_WATCHDOG_MS = 60_000
STEADY_RUNS = 3
STEADY_BUDGET_MS = 5_000
# The outputs a run compared are kept for the build report (report.html draws them), each at most
# this many elements: a larger one keeps a strided sample of its last two axes (images) or its
# first elements (anything else), and says so.
KEPT_OUTPUT_ELEMENTS = 1 << 20
OTHER_RUNTIME = "other"  # the mount key of a runtime that replaces the shipped one


class BudgetSpent(Exception):
    """An endpoint's time budget ran out before its runs did."""


@dataclass
class BrowserResult:
    checks: list[Check] = field(default_factory=list)  # report.json check entries, stage "browser"
    report: dict = field(default_factory=dict)  # report.json "browser": adapter, per-run facts
    # run label -> output name -> what the browser produced (bounded: kept_output)
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any_failed(self.checks)


def verify_in_browser(
    package_dir: Path,
    references: dict[str, np.ndarray],
    thresholds: dict[str, dict[str, dict[str, dict]]],
    *,
    gpu: bool = False,
    progress: Progress | None = None,
    bundle: str | None = None,
    watchdog_ms: int | None = None,
    browser=None,
    runtime: Runtime | None = None,
    profile: bool = True,
    deadline: float | None = None,
    result: BrowserResult | None = None,
    manifest: Manifest | None = None,
    engine: str = "chromium",
) -> BrowserResult:
    """Verify `package_dir` in headless Chromium against fp32 `references` (output name -> array).

    thresholds[ep][variant][output] bounds each comparison: the manifest's `thresholds` table
    (pipeline/verify/judgement/thresholds.py: `threshold_table` in a build, `recorded_thresholds` in `pack verify`).
    Each run's times come from a pass with production settings (the loader's session options,
    default logging, no profiling); with `profile`, a second, labelled pass on the same page
    (verbose logs, onnxruntime's profiler, one run) gives the CPU-fallback placement and the
    slowest kernels, and its times are never reported as speed.
    `runtime` runs every check on that onnxruntime-web instead of the one the package ships (the
    same bundle key; `pack verify --runtime`). `bundle` (diagnostic) replaces the bundle of every
    run with that one of the shipped (or `runtime`'s) version ("root" = the JSEP build the
    package never ships), to show what it would do.
    `browser` reuses an open Playwright browser (tests, remote endpoints); otherwise one is
    launched and closed. `deadline` (time.monotonic()) is an endpoint's time budget: past it,
    BudgetSpent. `result` collects into a caller's BrowserResult and skips the runs it holds
    already (a reconnect resumes where the lost connection stopped).
    `manifest`: the package's manifest in memory, served as its manifest.json in place of the
    file (`pack build` checks its staging folder before it writes the manifest); None: the file.
    `engine` firefox or webkit: the same runs and judgement in that engine (driven.py); its checks
    carry `engine`, and an engine not installed makes each run `not-verifiable` with its install line.
    """
    progress = progress or Progress.quiet()
    package_dir = Path(package_dir)
    served = None
    if manifest is None:
        manifest = load_manifest(package_dir)
    else:
        served = manifest_bytes(validate(manifest, package_dir / "manifest.json (in memory)"))
    runs = plan_runs(manifest)
    watchdog = watchdog_ms or int((manifest.get("loader") or {}).get("watchdogMs") or DEFAULT_WATCHDOG_MS)
    if bundle is not None and runtime is None:
        runtime = resolve_runtime(manifest["runtime"]["version"], progress)
    if runtime is not None and bundle is not None and bundle not in runtime.bundles:
        raise PackError(f"--bundle {bundle}: unknown; choose one of {', '.join(sorted(runtime.bundles))}")

    result = result if result is not None else BrowserResult()
    if engine != "chromium":
        why = driver_for(engine).unavailable()
        if why:
            result.checks.extend(check("browser", planned.ep, planned.variant, "not-verifiable", detail=why, bundle=planned.bundle,
                                       engine=engine, install=driver_for(engine).INSTALL) for planned in runs)
            result.report = {"engine": engine, "unavailable": why, "runs": []}
            return result
    done = {(r["bundle"], r["ep"], r["variant"]) for r in (result.report or {}).get("runs", [])}
    launch_start = time.monotonic()
    with ExitStack() as stack:
        runner = stack.enter_context(BrowserRunner(
            package_dir, runtimes={OTHER_RUNTIME: runtime} if runtime is not None else {}, gpu=gpu, browser=browser, manifest=served, engine=engine))
        adapter, navigator = runner.probe_device()
        result.report = {
            **({"chromium": runner.browser_version} if engine == "chromium" else {"engine": engine, "version": runner.browser_version}),
            "device": device_facts(runner.browser_version, runner.browser_name, adapter, navigator),
            "gpu": gpu,
            "adapter": adapter,
            "launch_ms": round(1000 * (time.monotonic() - launch_start)),
            "bundleOverride": bundle,
            "runtime": runtime_facts(manifest, runtime),
            "timing": "production settings (no profiling, default logging); profile pass separate",
            "runs": list((result.report or {}).get("runs", [])),
            "eps": dict((result.report or {}).get("eps", {})),  # run label -> the figures a summary prints (see run_summary)
        }
        with progress.task("Browser checks", total=len(runs)) as task:
            for planned in runs:
                if (planned.bundle, planned.ep, planned.variant) in done:
                    task.advance()
                    continue
                if deadline is not None and time.monotonic() >= deadline:
                    raise BudgetSpent(f"time budget spent after {len(result.report['runs'])} of {len(runs)} runs")
                if runtime is not None:
                    runtime_urls = runner.runtime_urls(OTHER_RUNTIME, bundle or planned.bundle)
                else:
                    runtime_urls = planned.bundle  # the loader takes a shipped bundle by its key
                checks, run_report, produced = _verify_run(
                    runner, manifest, planned, runtime_urls, adapter, references, thresholds, watchdog, profile, deadline
                )
                if bundle is not None:
                    run_report["bundle"] = f"{bundle} (override of {planned.bundle})"
                    for entry in checks:
                        entry["bundle"] = run_report["bundle"]
                if engine != "chromium":
                    checks = tagged(checks, engine=engine)
                result.checks.extend(checks)
                result.report["runs"].append(run_report)
                result.report["eps"][run_label(run_report)] = run_summary(run_report)
                if produced:
                    result.outputs[run_label(run_report)] = produced
                task.advance()
    return result


def runtime_facts(manifest: dict, runtime: Runtime | None) -> dict:
    """Which onnxruntime-web ran the checks: the shipped one, or another (`--runtime`)."""
    shipped = (manifest.get("runtime") or {}).get("version")
    if runtime is None:
        return {"version": shipped, "shipped": True}
    facts = {"version": runtime.version, "shipped": False, "packageRuntime": shipped}
    if runtime.local:
        facts["path"] = str(runtime.root)
    return facts


def run_label(run_report: dict) -> str:
    """"webgpu/fp16"; the bundle is named only when it is not the one a chain with that EP loads
    first ("wasm/fp32 [wasm bundle]" is the apple-mobile path, "wasm/fp32" the desktop fallback)."""
    label = f"{run_report['ep']}/{run_report['variant']}"
    default_bundle = "webgpu"
    return label if run_report["bundle"] == default_bundle else f"{label} [{run_report['bundle']} bundle]"


def run_summary(run_report: dict) -> dict:
    """Flat per-run figures: times in ms, CPU-fallback nodes, slowest kernels, status."""
    timings = run_report.get("timings_ms") or {}
    summary = {key: timings[key] for key in ("session_create_ms", "first_run_ms", "steady_run_ms") if timings.get(key) is not None}
    summary["status"] = run_report.get("status")
    summary["cpu_fallback_nodes"] = [f"{n['op']} ({n['node']})" for n in run_report.get("cpu_fallback") or []]
    summary["slowest_kernels"] = [f"{k['node']} {k['op']} {k['per_run_us'] / 1000:.2f} ms/run" for k in run_report.get("slowest_kernels") or []]
    if (run_report.get("gpu_memory") or {}).get("peak_bytes"):
        summary["gpu_peak_bytes"] = run_report["gpu_memory"]["peak_bytes"]
    if run_report.get("error"):
        summary["error"] = run_report["error"]
    return summary


def kept_output(array: np.ndarray, kind: str) -> tuple[np.ndarray, str | None]:
    """`array` bounded to KEPT_OUTPUT_ELEMENTS for the report, and how it was cut (None: whole)."""
    if array.size <= KEPT_OUTPUT_ELEMENTS:
        return array, None
    if kind == "image" and array.ndim >= 2:
        step = int(np.ceil(np.sqrt(array.size / KEPT_OUTPUT_ELEMENTS)))
        kept = array[..., ::step, ::step]
        if kept.size <= KEPT_OUTPUT_ELEMENTS:
            return np.ascontiguousarray(kept), f"every {step}th row and column of {list(array.shape)}"
    return array.reshape(-1)[:KEPT_OUTPUT_ELEMENTS].copy(), f"the first {KEPT_OUTPUT_ELEMENTS} of {array.size} values of {list(array.shape)}"


def _verify_run(
    runner: BrowserRunner, manifest: dict, planned: PlannedRun, runtime: str | dict, adapter: dict,
    references: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict[str, dict]]], watchdog_ms: int, profile: bool,
    deadline: float | None = None,
) -> tuple[list[Check], dict, dict[str, np.ndarray]]:
    """The run's checks, its report.json facts, and the outputs it compared (bounded)."""
    variant = manifest["variants"][planned.variant]
    missing = _missing_features(planned.ep, variant, adapter)
    base = {"stage": "browser", "ep": planned.ep, "variant": planned.variant, "bundle": planned.bundle}
    run_report: dict = {
        "bundle": planned.bundle, "ep": planned.ep, "variant": planned.variant, "platforms": planned.platforms,
        "default": planned.default,
        "input_shapes": {name: t["dims"] for name, t in manifest["sample"]["tensors"].items()},
        "expected_output_shapes": {o["name"]: list(references[o["name"]].shape) for o in manifest["outputs"] if o["name"] in references},
    }
    if planned.ep == "webgpu" and not adapter.get("available"):
        detail = f"no WebGPU adapter on this browser ({adapter.get('reason', 'requestAdapter() returned null')})"
        run_report.update(status="not-verifiable", detail=detail)
        return [check(**base, status="not-verifiable", detail=detail)], run_report, {}

    options = {"ep": planned.ep, "variant": planned.variant, "runtime": runtime, "watchdogMs": watchdog_ms,
               "steadyRuns": STEADY_RUNS, "steadyBudgetMs": STEADY_BUDGET_MS}
    page = runner.open_page()
    try:
        if planned.ep == "webgpu":
            page.probe_adapter()  # a fresh page may need its own retry before onnxruntime asks
        outcome = page.run("package", dict(options, **{"pass": "timed"}), _within(_limit_ms(watchdog_ms, STEADY_RUNS), deadline))
        stuck = outcome.get("hung") or outcome.get("crashed")
        if outcome.get("hung") and deadline is not None and time.monotonic() >= deadline - 1:
            # cut short by the endpoint's budget, not by the package's own watchdog: no verdict
            raise BudgetSpent(f"time budget spent during {planned.ep}/{planned.variant} [{planned.bundle} bundle]")
        gpu_error_list = [] if stuck else page.gpu_errors()
        console = list(page.watch.lines)
        verbose = sum(1 for line in console if logs.is_verbose(line))
        # the profile pass costs a second session: where placement matters (webgpu) and on the runs a
        # chain picks by default; a non-default wasm variant (wasm x fp16) is only checked and timed.
        # A run that failed gets it too (its placement says what ran where), unless its page hung.
        wanted = profile and not stuck and (planned.ep == "webgpu" or planned.default)
        if wanted and not outcome.get("ok"):
            # work the in-page watchdog abandoned (a session still being created) keeps running on
            # that page; a second session beside it can deadlock onnxruntime's wasm: start afresh
            page.close()
            page = runner.open_page()
        profiled = _profile_pass(page, options, watchdog_ms, deadline) if wanted else None
    finally:
        page.close()

    run_report.update(
        info=outcome.get("info"),
        timings_ms=_rounded({k: v for k, v in (outcome.get("timings") or {}).items() if k != "steady_all_ms"}),
        gpu_memory=outcome.get("gpuMemory") if planned.ep == "webgpu" else None,
        crossOriginIsolated=outcome.get("crossOriginIsolated"),
        timed_pass={"settings": "production (the loader's session options, default logging, no profiling)",
                    "verbose_log_lines": verbose},
    )
    if profiled is not None:
        run_report.update(profiled)
    signals = logs.failure_signals(console, gpu_error_list)
    if signals:
        run_report["signals"] = signals

    if not outcome.get("ok"):
        error = outcome.get("error", "no result")
        run_report.update(error=error, failed_stage=outcome.get("stage"))
        if missing and logs.names_missing_feature(error):
            detail = (f"not verifiable on this adapter: variant {planned.variant} requires {', '.join(missing)}, "
                      f"which the adapter lacks; onnxruntime refused: {_short(error)}")
            run_report.update(status="not-verifiable", detail=detail)
            return [check(**base, status="not-verifiable", detail=detail)], run_report, {}
        detail = (f"{planned.ep} ({planned.bundle} bundle) failed at {outcome.get('stage')}: {_short(error)}; "
                  f"inputs {run_report['input_shapes']}, expected outputs {run_report['expected_output_shapes']}")
        if signals:
            detail += f"; signals: {_short('; '.join(signals))}"
        run_report.update(status="failed", detail=detail)
        return [check(**base, status="failed", detail=detail)], run_report, {}

    checks = []
    actual_shapes = {}
    produced: dict[str, np.ndarray] = {}
    for output in manifest["outputs"]:
        name = output["name"]
        encoded = (outcome.get("outputs") or {}).get(name)
        if name not in references:
            raise PackError(f"references: no fp32 reference for output {name!r}; pass the host reference of every output")
        if encoded is None or "bytes" not in encoded:
            why = encoded.get("error") if encoded else "the run returned no such output"
            checks.append(check(**base, output=name, status="failed", detail=f"output {name}: {why}"))
            continue
        actual = decode_tensor(encoded)
        actual_shapes[name] = list(actual.shape)
        kind = output.get("kind", "tensor")
        produced[name], cut = kept_output(actual, kind)
        if cut:
            run_report.setdefault("outputs_kept", {})[name] = cut
        threshold = dict(thresholds[planned.ep][planned.variant][name])
        metrics, status, reason = judged(references[name], actual, kind, threshold, output.get("parts"))
        if signals:
            status, detail = "failed", f"{'; '.join(signals)[:500]}" + (f"; {reason}" if reason else "")
        elif status != "passed":
            detail = reason
        elif missing:
            status, detail = "not-verifiable", (
                f"not verifiable on this adapter: variant {planned.variant} requires {', '.join(missing)}, "
                "which the adapter lacks; the outputs matched but the variant cannot have run as shipped")
        else:
            status, detail = "passed", None
        checks.append(check(**base, output=name, status=status, metrics=rounded_metrics(metrics), threshold=numeric_bounds(threshold), detail=detail))
        if output.get("decision"):  # the decision beside the numbers (checks.decision_check)
            decided = decision_check(base, name, references[name], actual, output["decision"], threshold)
            if missing and decided["status"] == "passed":
                decided = {**decided, "status": "not-verifiable", "detail": f"not verifiable on this adapter: variant {planned.variant} requires {', '.join(missing)}"}
            checks.append(decided)
    run_report["output_shapes"] = actual_shapes
    statuses = {entry["status"] for entry in checks}
    run_report["status"] = "failed" if "failed" in statuses else ("not-verifiable" if "not-verifiable" in statuses else "passed")
    return checks, run_report, produced


def _profile_pass(page: RunnerPage, options: dict, watchdog_ms: int, deadline: float | None = None) -> dict:
    """The labelled profiling pass: a second session on the same page with verbose logs and
    onnxruntime's profiler, one run. Its figures are placement and kernel times, never speed."""
    mark = page.watch.mark()
    outcome = page.run("package", dict(options, **{"pass": "profile"}), _within(_limit_ms(watchdog_ms, 0), deadline))
    console = page.watch.since(mark)
    placement = logs.parse_placement(console)
    ep = options["ep"]
    facts = {
        "cpu_fallback": placement.cpu_nodes if ep != "wasm" else [],
        "kernels_without_ep_support": placement.unsupported,
        "all_nodes_on_cpu": placement.all_on_cpu and ep != "wasm",
        "slowest_kernels": logs.slowest_kernels(console, runs=1),
        "profile_pass": {"settings": "logSeverityLevel 0, enableProfiling (not production: its times are not speed)",
                         "ok": bool(outcome.get("ok"))},
    }
    if not outcome.get("ok"):
        facts["profile_pass"]["error"] = _short(outcome.get("error", "no result"))
    return facts


def _within(limit_ms: int, deadline: float | None) -> int:
    """`limit_ms`, cut to what is left of an endpoint's time budget (at least 1 s)."""
    if deadline is None:
        return limit_ms
    return max(1000, min(limit_ms, int(1000 * (deadline - time.monotonic()))))


def _limit_ms(watchdog_ms: int, steady_runs: int) -> int:
    """Python-side limit of one pass: every in-page stage's allowance plus slack."""
    return watchdog_ms * (4 + steady_runs) + 10_000


def _missing_features(ep: str, variant: dict, adapter: dict) -> list[str]:
    if ep != "webgpu":
        return []
    features = set(adapter.get("features") or [])
    return [feature for feature in variant.get("requires", []) if feature not in features]


def _rounded(timings: dict) -> dict:
    return {key: (round(value, 1) if isinstance(value, float) else value) for key, value in timings.items()}


def _short(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
