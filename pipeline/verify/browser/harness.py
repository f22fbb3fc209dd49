"""Browser checks: run a built package in headless Chromium on every (bundle, EP, variant) it ships.

For each platform chain of manifest["executionProviders"], the chain's bundle (webgpu when the
chain has webgpu, else wasm: ARCHITECTURE.md) runs each EP of the chain with each variant of
manifest["variantFor"][ep]. A run goes through the package's own loader.js on a fresh page of one
shared browser, feeds the package's sample inputs and compares every output with the fp32 host
reference (pipeline.verify.metrics). Besides exceptions, a run fails on WebGPU errors, onnxruntime
error lines, output-size warnings, NaN/Inf and the watchdog. A variant that needs an adapter feature
the adapter lacks (fp16 without shader-f16) is "not-verifiable", never "passed".
"""

from __future__ import annotations

import base64
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.runtime import resolve_runtime
from pipeline.verify.browser import logs
from pipeline.verify.browser.chromium import gpu_errors, launch_browser, new_watched_page, probe_adapter
from pipeline.verify.browser.package import BrowserRun, load_manifest, plan_runs
from pipeline.verify.browser.server import running_server
from pipeline.verify.metrics import LOWER_BOUNDS, compare, judge
from pipeline.verify.thresholds import threshold_for

HARNESS_DIR = Path(__file__).parent
HARNESS_PREFIX = "/__pack__/"
RUNTIME_PREFIX = "/__pack__/runtime/"  # the installed onnxruntime-web dist/, for --bundle diagnostics
DEFAULT_WATCHDOG_MS = 60_000
STEADY_RUNS = 3
STEADY_BUDGET_MS = 5_000

NUMPY_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64, "bool": np.bool_,
}


@dataclass
class BrowserResult:
    checks: list[dict] = field(default_factory=list)  # report.json check entries, stage "browser"
    report: dict = field(default_factory=dict)  # report.json "browser": adapter, per-run facts

    @property
    def failed(self) -> bool:
        return any(check["status"] == "failed" for check in self.checks)


def verify_in_browser(
    package_dir: Path,
    references: dict[str, np.ndarray],
    thresholds: dict[str, dict[str, dict]],
    *,
    gpu: bool = False,
    progress: Progress | None = None,
    bundle: str | None = None,
    watchdog_ms: int | None = None,
    browser=None,
) -> BrowserResult:
    """Verify `package_dir` in headless Chromium against fp32 `references` (output name -> array).

    thresholds[variant][output] bounds each comparison; for fp16 on WebGPU each bound is widened
    to at least the WebGPU fp16 default (its kernels accumulate in fp16).
    `bundle` (diagnostic) replaces the shipped bundle of every run with one of the installed
    runtime ("root" = the JSEP build the package never ships), to show what it would do.
    `browser` reuses an open Playwright browser (tests); otherwise one is launched and closed.
    """
    progress = progress or Progress.quiet()
    package_dir = Path(package_dir)
    manifest = load_manifest(package_dir)
    runs = plan_runs(manifest)
    watchdog = watchdog_ms or int((manifest.get("loader") or {}).get("watchdogMs") or DEFAULT_WATCHDOG_MS)
    mounts = {HARNESS_PREFIX: HARNESS_DIR}
    diagnostic_runtime = None
    if bundle is not None:
        version = manifest["runtime"]["version"]
        installed = resolve_runtime(version, progress)
        if bundle not in installed.bundles:
            raise PackError(f"--bundle {bundle}: unknown; choose one of {', '.join(sorted(installed.bundles))}")
        diagnostic_runtime = installed.bundles[bundle]
        mounts[RUNTIME_PREFIX] = diagnostic_runtime.module.parent

    result = BrowserResult()
    with ExitStack() as stack:
        server = stack.enter_context(running_server(package_dir, mounts))
        launch_start = time.monotonic()
        if browser is None:
            browser = stack.enter_context(launch_browser(gpu=gpu))
        adapter = _adapter_facts(browser, server.url)
        result.report = {
            "chromium": browser.version,
            "gpu": gpu,
            "adapter": adapter,
            "launch_ms": round(1000 * (time.monotonic() - launch_start)),
            "bundleOverride": bundle,
            "runs": [],
            "eps": {},  # run label -> the figures a summary prints (see run_summary)
        }
        with progress.task("Browser checks", total=len(runs)) as task:
            for planned in runs:
                if diagnostic_runtime is not None:
                    runtime_urls = {
                        "module": server.url + RUNTIME_PREFIX[1:] + diagnostic_runtime.module.name,
                        "wasm": server.url + RUNTIME_PREFIX[1:] + diagnostic_runtime.wasm.name,
                    }
                else:
                    runtime_urls = planned.bundle  # the loader takes a shipped bundle by its key
                checks, run_report = _verify_run(
                    browser, server.url, manifest, planned, runtime_urls, adapter, references, thresholds, watchdog
                )
                if bundle is not None:
                    run_report["bundle"] = f"{bundle} (override of {planned.bundle})"
                    for check in checks:
                        check["bundle"] = run_report["bundle"]
                result.checks.extend(checks)
                result.report["runs"].append(run_report)
                result.report["eps"][run_label(run_report)] = run_summary(run_report)
                task.advance()
    return result


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
    if run_report.get("error"):
        summary["error"] = run_report["error"]
    return summary


def _adapter_facts(browser, base_url: str) -> dict:
    page, _ = new_watched_page(browser)
    try:
        page.goto(base_url + HARNESS_PREFIX[1:] + "harness.html")
        return probe_adapter(page)
    finally:
        page.context.close()


def _verify_run(
    browser, base_url: str, manifest: dict, planned: BrowserRun, runtime: str | dict, adapter: dict,
    references: dict[str, np.ndarray], thresholds: dict[str, dict[str, dict]], watchdog_ms: int,
) -> tuple[list[dict], dict]:
    variant = manifest["variants"][planned.variant]
    missing = _missing_features(planned.ep, variant, adapter)
    base = {"stage": "browser", "ep": planned.ep, "variant": planned.variant, "bundle": planned.bundle}
    run_report: dict = {
        "bundle": planned.bundle, "ep": planned.ep, "variant": planned.variant, "platforms": planned.platforms,
        "input_shapes": {name: t["dims"] for name, t in manifest["sample"]["tensors"].items()},
        "expected_output_shapes": {o["name"]: list(references[o["name"]].shape) for o in manifest["outputs"] if o["name"] in references},
    }
    if planned.ep == "webgpu" and not adapter.get("available"):
        detail = f"no WebGPU adapter on this browser ({adapter.get('reason', 'requestAdapter() returned null')})"
        run_report.update(status="not-verifiable", detail=detail)
        return [dict(base, status="not-verifiable", detail=detail)], run_report

    page, watch = new_watched_page(browser)
    try:
        page.goto(base_url + HARNESS_PREFIX[1:] + "harness.html")
        page.wait_for_function("() => window.__packHarnessReady === true", timeout=30_000)
        if planned.ep == "webgpu":
            probe_adapter(page)  # a fresh page may need its own retry before onnxruntime asks
        outcome = _run_in_page(page, {
            "ep": planned.ep, "variant": planned.variant, "runtime": runtime, "watchdogMs": watchdog_ms,
            "steadyRuns": STEADY_RUNS, "steadyBudgetMs": STEADY_BUDGET_MS,
        }, watchdog_ms)
        gpu_error_list = gpu_errors(page) if not outcome.get("hung") else []
    finally:
        try:
            page.context.close()
        except Exception:  # noqa: BLE001 - a hung renderer may refuse a clean close; the browser closes it later
            pass

    console = [line for line in watch.lines]
    placement = logs.parse_placement(console)
    run_report.update(
        info=outcome.get("info"),
        timings_ms=_rounded(outcome.get("timings") or {}),
        cpu_fallback=placement.cpu_nodes if planned.ep != "wasm" else [],
        kernels_without_ep_support=placement.unsupported,
        all_nodes_on_cpu=placement.all_on_cpu and planned.ep != "wasm",
        slowest_kernels=logs.slowest_kernels(console, runs=_profiled_runs(outcome)),
        crossOriginIsolated=outcome.get("crossOriginIsolated"),
    )
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
            return [dict(base, status="not-verifiable", detail=detail)], run_report
        detail = (f"{planned.ep} ({planned.bundle} bundle) failed at {outcome.get('stage')}: {_short(error)}; "
                  f"inputs {run_report['input_shapes']}, expected outputs {run_report['expected_output_shapes']}")
        if signals:
            detail += f"; signals: {_short('; '.join(signals))}"
        run_report.update(status="failed", detail=detail)
        return [dict(base, status="failed", detail=detail)], run_report

    checks = []
    actual_shapes = {}
    for output in manifest["outputs"]:
        name = output["name"]
        check = dict(base, output=name)
        encoded = (outcome.get("outputs") or {}).get(name)
        if name not in references:
            raise PackError(f"references: no fp32 reference for output {name!r}; pass the host reference of every output")
        if encoded is None or "bytes" not in encoded:
            why = encoded.get("error") if encoded else "the run returned no such output"
            checks.append(dict(check, status="failed", detail=f"output {name}: {why}"))
            continue
        actual = decode_tensor(encoded)
        actual_shapes[name] = list(actual.shape)
        kind = output.get("kind", "tensor")
        threshold = webgpu_aware_threshold(thresholds[planned.variant][name], kind, variant["precision"], planned.ep)
        metrics = compare(references[name], actual, kind)
        passed, reason = judge(metrics, threshold)
        check.update(metrics=_json_metrics(metrics), threshold=threshold)
        if signals:
            check.update(status="failed", detail=f"{'; '.join(signals)[:500]}" + (f"; {reason}" if reason else ""))
        elif not passed:
            check.update(status="failed", detail=reason)
        elif missing:
            check.update(status="not-verifiable", detail=(
                f"not verifiable on this adapter: variant {planned.variant} requires {', '.join(missing)}, "
                "which the adapter lacks; the outputs matched but the variant cannot have run as shipped"))
        else:
            check.update(status="passed")
        checks.append(check)
    run_report["output_shapes"] = actual_shapes
    statuses = {check["status"] for check in checks}
    run_report["status"] = "failed" if "failed" in statuses else ("not-verifiable" if "not-verifiable" in statuses else "passed")
    return checks, run_report


def _run_in_page(page, options: dict, watchdog_ms: int) -> dict:
    """Start the run, then wait for its result; a page that stops answering ends at the watchdog.

    The in-page watchdog covers each stage; this one (every stage's allowance plus slack) catches a
    main thread that never yields, which no in-page timer can.
    """
    page.evaluate("options => window.packHarness.start(options)", options)
    limit_ms = watchdog_ms * (4 + options["steadyRuns"]) + 10_000
    try:
        page.wait_for_function("() => window.__packResult !== null", timeout=limit_ms, polling=200)
    except Exception as error:  # noqa: BLE001 - Playwright TimeoutError or a crashed page
        return {"ok": False, "stage": "watchdog", "hung": True,
                "error": f"watchdog: no result within {limit_ms} ms ({type(error).__name__})"}
    return page.evaluate("() => window.__packResult")


def decode_tensor(encoded: dict) -> np.ndarray:
    dtype = NUMPY_DTYPES.get(encoded["type"])
    if dtype is None:
        raise PackError(f"browser output type {encoded['type']!r}: not supported by the harness")
    raw = base64.b64decode(encoded["bytes"])
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).reshape(encoded["dims"])


def webgpu_aware_threshold(threshold: dict, kind: str, precision: str, ep: str) -> dict:
    """`threshold`, each bound widened to at least the WebGPU fp16 default when fp16 runs on WebGPU.

    onnxruntime-web's WebGPU kernels accumulate fp16 in fp16 (1-2 % of the largest output on long
    reductions), which host (CPU, fp32-accumulating) thresholds do not allow for. The default still
    fails zeros, wrong slices and overflow, whose errors are of order 100 % of the range.
    """
    if not (ep == "webgpu" and precision == "fp16"):
        return dict(threshold)
    webgpu = threshold_for(kind, precision, ep)
    widened = dict(threshold)
    for key, bound in webgpu.items():
        if key in widened:
            widened[key] = min(widened[key], bound) if key in LOWER_BOUNDS else max(widened[key], bound)
    return widened


def _profiled_runs(outcome: dict) -> int:
    timings = outcome.get("timings") or {}
    if "first_run_ms" not in timings:
        return 1  # the first run failed (or never started): at most one run was profiled
    return 1 + int(timings.get("steady_runs") or 0)


def _missing_features(ep: str, variant: dict, adapter: dict) -> list[str]:
    if ep != "webgpu":
        return []
    features = set(adapter.get("features") or [])
    return [feature for feature in variant.get("requires", []) if feature not in features]


def _json_metrics(metrics: dict) -> dict:
    return {key: (round(value, 6) if isinstance(value, float) else value) for key, value in metrics.items()}


def _rounded(timings: dict) -> dict:
    return {key: (round(value, 1) if isinstance(value, float) else value) for key, value in timings.items()}


def _short(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
