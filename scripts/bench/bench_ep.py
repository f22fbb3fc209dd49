"""Benchmark built packages per EP in headless Chromium, through each package's own loader: webgpu
fp32, webgpu fp16 (and fp16w where the package ships it) and wasm side by side (and one onnxruntime-web release beside another with
--runtime given twice).

    .venv/bin/python scripts/bench/bench_ep.py dist/gtcrn [dist/other ...] [--gpu] [--runtime VERSION|DIR]
                                               [--pages 3] [--steady 10] [--threads 4] [--json out.json|-]
    .venv/bin/python scripts/bench/bench_ep.py dist/gtcrn --smoke --json -   # one page, one steady run

Per package and configuration (webgpu fp32, webgpu fp16, webgpu fp16w, wasm fp32 with --threads threads), with
production settings (the loader's own session options, default logging, no profiling):
session create, first run and steady run (median of --steady runs on one page), each the median
over --pages fresh pages; peak GPU buffer bytes (the page wraps GPUDevice.createBuffer and
GPUBuffer.destroy and keeps the peak of the live total); and the WebGPU/WASM steady-speed ratio.
Then a separate, labelled profiling pass per configuration (verbose logs, onnxruntime's profiler,
one run) lists the slowest kernels and the nodes placed on the CPU; its times are not speed.

A configuration the package or adapter cannot run (no fp16 variant, no shader-f16, no adapter) is
listed as such. `--json` writes the figures and the manifest `measurements` entries (source
"benchmark"; `-`: to stdout, the table then goes to stderr). On SwiftShader (no GPU) keep to small
models: it runs ~0.2 GFLOP/s. `--gpu` needs a hardware Vulkan adapter (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.errors import PackError  # noqa: E402
from pipeline.runtime import runtime_from_option  # noqa: E402
from pipeline.verify.engines.browser import logs  # noqa: E402
from pipeline.verify.engines.browser.run_plan import load_manifest  # noqa: E402
from pipeline.verify.engines.browser.pages import BrowserRunner  # noqa: E402

WATCHDOG_MS = 120_000
STEADY_BUDGET_MS = 20_000
OTHER_RUNTIME = "bench"


def configurations(manifest: dict, threads: int) -> list[dict]:
    """(label, bundle, EP, variant, threads) for webgpu fp32, webgpu fp16, webgpu fp16w (when the
    package ships it), wasm fp32 (or the package's nearest variants when it ships no fp32)."""
    by_precision = {}
    for name, variant in manifest["variants"].items():
        by_precision.setdefault(variant.get("precision"), name)
    fp32 = by_precision.get("fp32") or next(iter(manifest["variants"]))
    fp16 = by_precision.get("fp16")
    fp16w = by_precision.get("fp16w")
    bundles = manifest["runtime"]["bundles"]
    webgpu_bundle = "webgpu" if "webgpu" in bundles else None
    configs = []
    if webgpu_bundle:
        configs.append({"label": "webgpu fp32", "bundle": "webgpu", "ep": "webgpu", "variant": fp32})
        configs.append({"label": "webgpu fp16", "bundle": "webgpu", "ep": "webgpu", "variant": fp16})
        if fp16w:
            configs.append({"label": "webgpu fp16w", "bundle": "webgpu", "ep": "webgpu", "variant": fp16w})
    configs.append({"label": f"wasm fp32 x{threads}", "bundle": webgpu_bundle or "wasm", "ep": "wasm", "variant": fp32, "threads": threads})
    return configs


def run_config(runner: BrowserRunner, config: dict, runtime_key: str | None, pages: int, steady: int, profile: bool) -> dict:
    options = {"ep": config["ep"], "variant": config["variant"], "watchdogMs": WATCHDOG_MS,
               "steadyRuns": steady, "steadyBudgetMs": STEADY_BUDGET_MS, "pass": "timed",
               "runtime": runner.runtime_urls(runtime_key, config["bundle"]) if runtime_key else config["bundle"]}
    if config.get("threads"):
        options["numThreads"] = config["threads"]
    samples, errors = [], []
    for _ in range(pages):
        page = runner.open_page()
        try:
            if config["ep"] == "webgpu":
                page.probe_adapter()
            outcome = page.run("package", options, WATCHDOG_MS * (4 + steady) + 10_000)
        finally:
            page.close()
        if not outcome.get("ok"):
            errors.append(f"{outcome.get('stage')}: {outcome.get('error')}")
            break
        timings = outcome["timings"]
        samples.append({"create": timings["session_create_ms"], "first": timings["first_run_ms"], "steady": timings["steady_run_ms"],
                        "steady_runs": timings.get("steady_runs"), "peak": (outcome.get("gpuMemory") or {}).get("peak_bytes"),
                        "threads": (outcome.get("info") or {}).get("threads") or (outcome.get("info") or {}).get("numThreads")})
    result = {**config, "pages": len(samples)}
    if errors:
        result["error"] = errors[0][:400]
    if samples:
        for key in ("create", "first", "steady"):
            result[f"{key}_ms"] = round(statistics.median(s[key] for s in samples), 2)
        peaks = [s["peak"] for s in samples if s["peak"] is not None]
        result["gpu_peak_bytes"] = max(peaks) if peaks and config["ep"] == "webgpu" else None
        result["steady_runs"] = samples[0]["steady_runs"]
        result["threads_used"] = samples[0]["threads"]
    if profile and samples:
        result["profile"] = profile_pass(runner, options)
    return result


def profile_pass(runner: BrowserRunner, options: dict) -> dict:
    """The labelled profiling pass: slowest kernels and CPU placement; its times are not speed."""
    page = runner.open_page()
    try:
        if options["ep"] == "webgpu":
            page.probe_adapter()
        mark = page.watch.mark()
        outcome = page.run("package", dict(options, **{"pass": "profile"}), WATCHDOG_MS * 4 + 10_000)
        console = page.watch.since(mark)
    finally:
        page.close()
    placement = logs.parse_placement(console)
    return {"ok": bool(outcome.get("ok")), "error": outcome.get("error"),
            "slowest_kernels": logs.slowest_kernels(console, runs=1),
            "cpu_nodes": [] if options["ep"] == "wasm" else placement.cpu_nodes}


def bench_package(package: Path, runtime, args, facts: dict) -> dict:
    """One package in its own browser (as `pack verify` runs it): a crashed GPU process or browser
    ends this package's figures, not the whole benchmark."""
    manifest = load_manifest(package)
    runtimes = {OTHER_RUNTIME: runtime} if runtime is not None else {}
    with BrowserRunner(package, runtimes=runtimes, gpu=args.gpu) as runner:
        facts["chromium"] = runner.browser.version
        adapter = runner.probe_adapter()
        facts.setdefault("adapter", adapter)
        features = set(adapter.get("features") or [])
        results = []
        for config in configurations(manifest, args.threads):
            if config["variant"] is None:
                results.append({**config, "skipped": "the package ships no such variant"})
                continue
            requires = manifest["variants"][config["variant"]].get("requires") or []
            if config["ep"] == "webgpu" and not adapter.get("available"):
                results.append({**config, "skipped": f"no WebGPU adapter ({adapter.get('reason')})"})
                continue
            if config["ep"] == "webgpu" and any(feature not in features for feature in requires):
                results.append({**config, "skipped": f"the adapter lacks {', '.join(f for f in requires if f not in features)}"})
                continue
            print(f"  {package.name}: {config['label']} ...", file=sys.stderr, flush=True)
            try:
                results.append(run_config(runner, config, OTHER_RUNTIME if runtime is not None else None, args.pages, args.steady, not args.no_profile))
            except Exception as error:  # noqa: BLE001 - a closed browser or page: record it, keep the rest
                results.append({**config, "error": f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"})
    wasm = next((r for r in results if r["ep"] == "wasm" and r.get("steady_ms")), None)
    ratios = {}
    for result in results:
        if result["ep"] == "webgpu" and result.get("steady_ms") and wasm:
            ratios[result["label"]] = float(f"{wasm['steady_ms'] / result['steady_ms']:.3g}")  # 3 figures: a ratio far below 1 must not round to 0
    return {"package": manifest.get("name") or package.name, "inputs": {n: t["dims"] for n, t in manifest["sample"]["tensors"].items()},
            "runtime": runtime.label if runtime is not None else manifest["runtime"]["version"],
            "results": results, "webgpu_speedup_over_wasm": ratios}


def measurements(document: dict) -> list[dict]:
    """Manifest `measurements` entries (manifest schema 2) of a benchmark run."""
    adapter = document["adapter"]
    adapter_class = {k: adapter.get(k) or "" for k in ("vendor", "architecture", "description")} if adapter.get("available") else None
    entries = {}
    for package in document["packages"]:
        entries[package["package"]] = [
            {"source": "benchmark", "browser": f"Chromium/{document['chromium']}", "adapter": adapter_class,
             "bundle": r["bundle"], "ep": r["ep"], "variant": r["variant"],
             "createMs": r["create_ms"], "firstMs": r["first_ms"], "steadyMs": r["steady_ms"]}
            for r in package["results"] if r.get("steady_ms") is not None
        ]
    return entries


def table_lines(document: dict) -> list[str]:
    adapter = document["adapter"]
    name = f"{adapter.get('vendor')} {adapter.get('architecture')} {adapter.get('description') or ''}".strip() if adapter.get("available") else "none"
    lines = [f"Chromium {document['chromium']}{' --gpu' if document['gpu'] else ''}; adapter: {name}"
             + ("; shader-f16" if "shader-f16" in (adapter.get("features") or []) else "; no shader-f16"),
             "production settings; medians over fresh pages; steady = median of the steady runs on a page",
             f"{'package':<14}{'runtime':<14}{'config':<16}{'create ms':>11}{'first ms':>11}{'steady ms':>11}{'GPU peak MiB':>14}  note"]
    for package in document["packages"]:
        for r in package["results"]:
            peak = r.get("gpu_peak_bytes")
            note = r.get("skipped") or r.get("error") or ""
            lines.append(f"{package['package']:<14}{package['runtime']:<14}{r['label']:<16}"
                         + "".join(f"{r[key]:>11.1f}" if r.get(key) is not None else f"{'-':>11}" for key in ("create_ms", "first_ms", "steady_ms"))
                         + (f"{peak / 2**20:>14.1f}" if peak else f"{'-':>14}") + f"  {note}"[:200])
        for label, ratio in package["webgpu_speedup_over_wasm"].items():
            verdict = f"{ratio:.2f}x faster than wasm" if ratio >= 1 else f"{1 / ratio:.2f}x slower than wasm"
            lines.append(f"{'':<28}{label}: {verdict} (steady)")
    lines.append("slowest kernels (separate profiling pass: verbose logs + onnxruntime profiler, not timing):")
    for package in document["packages"]:
        for r in package["results"]:
            profile = r.get("profile")
            if not profile:
                continue
            kernels = ", ".join(f"{k['node']} {k['op']} {k['per_run_us'] / 1000:.2f} ms ({k['clock']})" for k in profile["slowest_kernels"][:5])
            cpu = f"; {len(profile['cpu_nodes'])} nodes on CPU" if profile["cpu_nodes"] else ""
            lines.append(f"  {package['package']} {r['label']}: {kernels or profile.get('error') or 'none'}{cpu}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path, help="package folders made by `pack build`")
    parser.add_argument("--gpu", action="store_true", help="Chromium flags for a hardware Vulkan adapter")
    parser.add_argument("--runtime", action="append", default=[], help="onnxruntime-web to run instead of the shipped one (repeatable: side by side)")
    parser.add_argument("--pages", type=int, default=3, help="fresh pages per configuration (medians over them)")
    parser.add_argument("--steady", type=int, default=10, help="steady runs per page (median)")
    parser.add_argument("--threads", type=int, default=4, help="wasm threads")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiling pass")
    parser.add_argument("--smoke", action="store_true", help="one page and one steady run per configuration: checks the benchmark runs")
    parser.add_argument("--json", help="write the figures and measurements entries to this file (- for stdout)")
    args = parser.parse_args()
    if args.smoke:
        args.pages, args.steady = 1, 1
    try:
        runtimes = [runtime_from_option(value) for value in args.runtime] or [None]
        facts: dict = {}
        packages = [bench_package(package, runtime, args, facts) for runtime in runtimes for package in args.packages]
        document = {"chromium": facts.get("chromium"), "gpu": args.gpu, "adapter": facts.get("adapter") or {}, "packages": packages}
    except PackError as error:
        raise SystemExit(f"error: {error}") from None
    document["measurements"] = measurements(document)
    for line in table_lines(document):
        print(line, file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        print(json.dumps(document, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
