"""The human-readable end of a build or verify: one line per check with figure and threshold."""

from __future__ import annotations

import json
from pathlib import Path

from typing import TYPE_CHECKING

import typer

from pipeline.assets.delivery import delivery_lines

if TYPE_CHECKING:
    from pipeline.verify.engines.browser.harness import BrowserResult
    from pipeline.verify.package import PackageVerification

MARKS = {"passed": "ok  ", "failed": "FAIL", "not-verifiable": "n/v ", "skipped": "skip", "error": "ERR ", "refused": "refd"}


def check_line(check: dict) -> str:
    from pipeline.verify.judgement.metrics import format_metrics  # numpy: loaded only where a check is printed

    bundle = check.get("bundle")
    run = f"{check['ep']}/{check['variant']}" + (f" [{bundle} bundle]" if bundle and bundle != check["ep"] else "")
    from pipeline.verify.judgement.decisions import format_shown

    output = f" {check['output']}" if check.get("output") else ""
    if check.get("decision"):  # a decision check: what each run decided, and near-ties even when it passed
        output += f" ({check['decision']} decision)"
    figures = format_metrics(check.get("metrics", {}), check.get("threshold", {}))
    detail = check.get("detail") if check["status"] != "passed" or check.get("decision") else None
    tail = "  ".join(part for part in (figures, detail, format_shown(check.get("decided") or {})) if part)
    stage = check["stage"] + (f" in {check['engine']}" if check["stage"] == "browser" and check.get("engine") else "")
    return f"  {MARKS.get(check['status'], check['status'])} {stage:<7} {run:<28}{output}  {tail}".rstrip()


def browser_lines(browser: dict) -> list[str]:
    """The adapter, then per run: status, times, CPU-fallback nodes and the slowest kernels."""
    adapter = browser.get("adapter") or {}
    if adapter.get("available"):
        name = f"{adapter.get('vendor') or '?'} {adapter.get('architecture') or adapter.get('description') or ''}".strip()
        fallback = " (fallback adapter)" if adapter.get("isFallbackAdapter") else ""
        f16 = "shader-f16" if "shader-f16" in (adapter.get("features") or []) else "no shader-f16"
        adapter_text = f"{name}{fallback}; {f16}"
    else:
        adapter_text = f"none ({adapter.get('reason')})"
    lines = [f"browser: Chromium {browser.get('chromium')}{' --gpu' if browser.get('gpu') else ''}; WebGPU adapter: {adapter_text}"]
    for label, run in (browser.get("eps") or {}).items():
        times = ", ".join(f"{key.removesuffix('_ms').replace('_', ' ')} {run[key]:.0f} ms" for key in ("session_create_ms", "first_run_ms", "steady_run_ms") if key in run)
        lines.append(f"  {label}: {run.get('status')}; {times or 'no timings'}")
        nodes = run.get("cpu_fallback_nodes") or []
        if nodes:
            more = f" (+{len(nodes) - 12} more)" if len(nodes) > 12 else ""
            lines.append(f"    CPU fallback: {', '.join(nodes[:12])}{more}")
        if run.get("slowest_kernels"):
            lines.append(f"    slowest kernels: {', '.join(run['slowest_kernels'][:5])}")
    return lines


def engines_lines(browser: dict) -> list[str]:
    """Each other engine's runs (`--engines`), after Chromium's and what its times say."""
    return [line for engine, report in (browser.get("engines") or {}).items() for line in engine_lines(engine, report)]


def engine_lines(engine: str, report: dict) -> list[str]:
    """Another engine's per-(EP, variant) runs (`--engines`): its browser, its adapter, per run status and times."""
    seconds = f" ({report['seconds']:.0f} s)" if report.get("seconds") is not None else ""
    if report.get("unavailable"):
        return [f"browser in {engine}: not verifiable{seconds}: {report['unavailable']}"]
    adapter = report.get("adapter") or {}
    gpu = f"{adapter.get('vendor') or '?'} {adapter.get('architecture') or adapter.get('description') or ''}".strip() if adapter.get("available") else f"none ({adapter.get('reason')})"
    lines = [f"browser in {engine}: {report.get('version')}{seconds}; WebGPU adapter: {gpu}"]
    for label, run in (report.get("eps") or {}).items():
        times = ", ".join(f"{key.removesuffix('_ms').replace('_', ' ')} {run[key]:.0f} ms" for key in ("session_create_ms", "first_run_ms", "steady_run_ms") if key in run)
        lines.append(f"  {label}: {run.get('status')}; {times or 'no timings'}")
    return lines


def device_lines(browser: dict, checks: list[dict]) -> list[str]:
    """Several browsers (report.browser.endpoints/devices): per device its browser, OS and adapter,
    the endpoints that ran on it, their checks and per-EP times; then endpoints that never
    reported a device (unreachable)."""
    lines = [f"browsers: {len(browser['endpoints'])}, on {len(browser['devices'])} device{'s' if len(browser['devices']) != 1 else ''}"]
    endpoints = {entry["endpoint"]: entry for entry in browser["endpoints"]}

    def endpoint_lines(entry: dict) -> list[str]:
        label = entry["endpoint"]
        head = f"  {label}: {entry['status']} ({entry['seconds']:.1f} s"
        head += f", {entry['attempts']} attempts)" if entry["attempts"] != 1 else ")"
        out = [head] + [f"    error: {why}" for why in entry.get("errors") or []]
        # an error check's detail is the endpoint's error, printed just above
        out += [f"  {check_line({**check, 'detail': None} if check['status'] == 'error' else check)}"
                for check in checks if check.get("endpoint") == label and check["stage"] == "browser"]
        eps = ((entry.get("browser") or {}).get("eps")) or {}
        for run_label, run in eps.items():
            times = ", ".join(f"{key.removesuffix('_ms').replace('_', ' ')} {run[key]:.0f} ms" for key in ("session_create_ms", "first_run_ms", "steady_run_ms") if key in run)
            out.append(f"    {run_label}: {run.get('status')}; {times or 'no timings'}")
        return out

    for device in browser["devices"]:
        lines.append(f"device: {device['label']} ({device['status']})")
        for label in device["endpoints"]:
            lines.extend(endpoint_lines(endpoints[label]))
    for entry in browser["endpoints"]:
        if entry["device"] is None:
            lines.append("device: unknown (the browser did not report one: unreachable, or lost before its probe)")
            lines.extend(endpoint_lines(entry))
    return lines


# The chain's first choice is called out when an alternative is at least this much faster.
SLOWER_CHAIN_RATIO = 1.5


def _adapter_name(adapter: dict | None) -> str:
    if not adapter:
        return "no WebGPU adapter"
    parts = [adapter.get("vendor"), adapter.get("architecture") or adapter.get("description")]
    return " ".join(part for part in parts if part) or "an unnamed adapter"


def chain_speed_lines(manifest: dict) -> list[str]:
    """Per adapter class in manifest `measurements`: when the desktop chain's first choice is measured
    slower than an alternative, one line naming both and the ratio (the loader's `select` fixes it)."""
    measurements = [m for m in manifest.get("measurements") or [] if isinstance(m.get("steadyMs"), (int, float)) and m["steadyMs"] > 0]
    chain = (manifest.get("executionProviders") or {}).get("desktop") or ["webgpu", "wasm"]
    variant_for = manifest.get("variantFor") or {}
    select = (manifest.get("loader") or {}).get("select", "chain")
    classes: dict[str, list[dict]] = {}
    machine = lambda m: (m.get("source"), m.get("browser"))  # noqa: E731
    for m in measurements:
        if m.get("adapter"):
            key = json.dumps([str(m["adapter"].get(k) or "").lower() for k in ("vendor", "architecture", "description")])
            classes.setdefault(key, []).append(m)
    # wasm runs record no adapter: they join the classes the same machine measured (or stand alone).
    for m in measurements:
        if not m.get("adapter"):
            joined = [entries for entries in classes.values() if any(machine(e) == machine(m) and e.get("adapter") for e in entries)]
            for entries in joined or [classes.setdefault("null", [])]:
                entries.append(m)
    lines = []
    for entries in classes.values():
        best: dict[tuple[str, str], float] = {}
        for m in entries:
            pair = (m["ep"], m["variant"])
            best[pair] = min(best.get(pair, float("inf")), float(m["steadyMs"]))
        first_ep = next((ep for ep in chain if any(p[0] == ep for p in best)), None)
        if first_ep is None:
            continue
        # The variant the chain runs first on this EP: the recipe's order, among those measured here.
        order = variant_for.get(first_ep) or sorted(v for e, v in best if e == first_ep)
        first_variant = next((v for v in order if (first_ep, v) in best), None)
        if first_variant is None:
            continue
        configured = best[(first_ep, first_variant)]
        (fast_ep, fast_variant), fastest = min(best.items(), key=lambda item: item[1])
        if fastest * SLOWER_CHAIN_RATIO <= configured:
            fix = "the loader's measured choice picks it on such devices" if select == "measured" else "set [loader] select = \"measured\" (or reorder execution_providers) to use it"
            lines.append(
                f"  speed: {fast_ep}/{fast_variant} {configured / fastest:.1f}× faster than {first_ep}/{first_variant} "
                f"(the chain's first choice) on {_adapter_name(next((e['adapter'] for e in entries if e.get('adapter')), None))}: "
                f"{fastest:.1f} vs {configured:.1f} ms; {fix}"
            )
    return lines


def webgpu_kernel_lines(facts: dict) -> list[str]:
    """The webgpu-kernels stage: what it is, then per variant the node placement and times."""
    where = facts.get("adapter") or "not available"
    lines = [f"webgpu-kernels: {facts.get('description')} ({where})"]
    for variant, run in (facts.get("runs") or {}).items():
        if "audit" in run:
            lines.extend(audit_lines(variant, run["audit"], (facts.get("audit") or {}).get("variants", {}).get(variant, {})))
            continue
        nodes = run.get("cpu_fallback_nodes") or []
        times = ", ".join(f"{key.removesuffix('_ms').replace('_', ' ')} {run[key]:.0f} ms" for key in ("session_create_ms", "first_run_ms") if key in run)
        lines.append(f"  {variant}: {run.get('webgpu_nodes', 0)} nodes on WebGPU, {len(nodes)} on the CPU EP{'; ' + times if times else ' (cached)'}")
        if nodes:
            more = f" (+{len(nodes) - 12} more)" if len(nodes) > 12 else ""
            lines.append(f"    CPU fallback: {', '.join(nodes[:12])}{more}")
    return lines


def audit_lines(variant: str, run: dict, facts: dict) -> list[str]:
    """A variant the webgpu-kernels stage audited node by node: counts, time, failed nodes."""
    lines = [f"  {variant}: node audit, {run['nodes']} nodes on WebGPU ({run['failed']} failed, {run['not_verifiable']} not verifiable, "
             f"{run['not_audited']} not auditable) in {run.get('total_s', 0):.0f} s"]
    for verdict in (facts.get("failed") or [])[:8]:
        lines.append(f"    {verdict['node']} ({verdict['op']}) at {verdict['shape']}: {verdict['detail']}")
    return lines


def fp16_kept_lines(report: dict) -> list[str]:
    """The fp16 nodes kept in fp32 (name, op, why), their size cost and the search's figures."""
    step = next((s for s in report.get("steps", []) if s["name"] == "fp16_keep_fp32"), None)
    if not step or not step.get("records"):
        return []
    record = step["records"][0]
    lines = []
    sizes = record.get("sizes")
    if sizes:
        count = len(record.get("kept", []))
        lines.append(f"  fp16: {count} node{'s' if count != 1 else ''} kept in fp32; weights {sizes['fp16_bytes']} B vs all-fp16 ideal {sizes['all_fp16_ideal_bytes']} B (+{sizes['kept_cost_bytes']} B) and fp32 {sizes['fp32_bytes']} B")
    for kept in record.get("kept", [])[:20]:
        lines.append(f"    kept {kept['node']} ({kept['op']}): {kept['why']}")
    search = record.get("search")
    if search:
        outcome = f"failed: {search['failed']}" if "failed" in search else ("minimal" if search.get("minimal") else f"not minimal: {search.get('stopped')}")
        fp16_refused = any(item.get("variant") == "fp16" for item in report.get("refused") or []) or "fp16" in (report.get("variants_refused") or {})
        if "failed" in search and report.get("passed") and not fp16_refused:
            # A later fix (the NCHW layout retry) passed what the search was started for.
            outcome = f"ended without a kept set, and none was needed: fp16 passed every check as shipped (the search started on: {search.get('first_failure')})"
        lines.append(f"    search: {search['trials']} trials, {search['seconds']:.1f} s over {search['candidates']} ranked nodes with {', '.join(search['evaluators'])}; {outcome}")
        for line in search.get("unfixable") or []:
            lines.append(f"    not fixable by node choice: {line}")
        for line in search.get("diagnosis") or []:
            lines.append(f"    what the search faced: {line}")
    if record.get("lock"):
        lines.append(f"    {record['lock']}")
    return lines


def variant_lines(report: dict, manifest: dict) -> list[str]:
    """With an fp16w variant: each variant's model bytes on the wire (brotli where shipped) beside
    its host error against the fp32 reference, so fp16w's price is read beside fp16's and fp32's."""
    variants = manifest.get("variants") or {}
    if not any(spec.get("widen") for spec in variants.values()):
        return []
    from pipeline.verify.judgement.metrics import format_metrics  # numpy: loaded only where a check is printed

    from pipeline.manifest import variant_files

    files = manifest.get("files") or {}

    def sizes(spec: dict) -> tuple[int, int]:  # (raw, on the wire) of the model file and its weight chunks
        entries = [files.get(path) or {} for path in variant_files(spec)]
        return sum(e.get("size", 0) for e in entries), sum(min([e.get("size", 0), *(x["size"] for x in (e.get("encodings") or {}).values())]) for e in entries)

    fp32 = sizes(variants["fp32"])[0] if "fp32" in variants else None
    lines = ["variants (model bytes on the wire, weight chunks included; host error against the fp32 reference):"]
    for name, spec in variants.items():
        raw, wire = sizes(spec)
        share = f" = {raw / fp32:.0%} of fp32's {fp32 / 1e6:.3f} MB raw" if fp32 and name != "fp32" else ""
        errors = "; ".join(
            f"{c['output']}: {format_metrics(c.get('metrics', {}), c.get('threshold', {}))}"
            for c in report.get("checks", []) if c["stage"] == "host" and c["variant"] == name and c.get("output")
        )
        lines.append(f"  {name:<6} {raw / 1e6:.3f} MB raw, {wire / 1e6:.3f} MB sent{share}; host {errors or 'not checked'}")
    return lines


def print_summary(report: dict, package_dir: Path, lock: Path | None = None) -> None:
    echo = lambda line="": typer.echo(line, err=False)  # noqa: E731
    echo(f"package {report['name']} -> {package_dir}")
    if lock is not None:
        echo(f"  lock {lock}")
    source = report.get("source", {})
    if source:
        echo(f"  source {source.get('uri')} ({source.get('precision', '?')}: {source.get('precision_reason', '')})")
    if "license" in report:
        echo(f"  license {report['license'] or 'not stated by the recipe'}")
    for step in report.get("steps", []):
        if (step.get("changed") or step.get("refused")) and step["name"] != "fp16_keep_fp32":
            what = step.get("refused") or "; ".join(r.get("what") or r.get("warning") or str(r) for r in step.get("records", [])[:3])
            echo(f"  step {step['name']}: {what}")
    for line in fp16_kept_lines(report):
        echo(line)
    for name, reason in report.get("variants_refused", {}).items():
        echo(f"  variant {name} refused: {reason}")
    for item in report.get("refused") or []:
        echo(f"  {item['variant']} on {item['ep']} [{item['bundle']} bundle] refused (the loader will not pick it): {item['by']}")
    echo("checks:")
    grid = "endpoints" in (report.get("browser") or {})  # several browsers: their checks go per device
    for check in report["checks"]:
        if not (grid and check["stage"] == "browser") and check["stage"] != "default-load":
            echo(check_line(check))
    from pipeline.verify.engines.browser.default_load import default_load_lines

    for line in default_load_lines(report["checks"]):
        echo(line)
    if report.get("webgpu_kernels"):
        for line in webgpu_kernel_lines(report["webgpu_kernels"]):
            echo(line)
    if report.get("browser"):
        for line in (device_lines(report["browser"], report["checks"]) if grid else browser_lines(report["browser"])):
            echo(line)
    manifest_path = Path(package_dir) / "manifest.json"
    manifest: dict = {}
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = {}
        for line in [*variant_lines(report, manifest), *chain_speed_lines(manifest)]:
            echo(line)
    for line in engines_lines(report.get("browser") or {}):
        echo(line)
    if manifest:
        from pipeline.assets.chunks import chunk_lines

        for line in chunk_lines(manifest):
            echo(line)
        select = (manifest.get("loader") or {}).get("select")
        if select:
            why = (report.get("loader") or {}).get("why")
            echo(f"loader: select {select}" + (f" ({why})" if why else ""))
    for line in delivery_lines(report.get("delivery")):
        echo(line)
    timings = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in report.get("timings", {}).items())
    echo(f"timings: {timings}")
    browser_ran = any(c["stage"] == "browser" and c["status"] in ("passed", "failed") for c in report["checks"])
    if not browser_ran:
        kernels_ran = any(c["stage"] == "webgpu-kernels" and c["status"] in ("passed", "failed") for c in report["checks"])
        why = "no browser finished" if grid else "--no-browser"
        echo(f"NOT browser-verified ({why}): host{' and webgpu-kernels' if kernels_ran else ''} checks only")
    for problem in report.get("verdict") or []:
        echo(f"  FAILED: {problem}")
    refused_fp = [item for item in report.get("refused") or []]
    if report["passed"] and (refused_fp or report.get("variants_refused")):
        names = sorted({item["variant"] for item in refused_fp} | set(report.get("variants_refused") or {}))
        echo(f"REFUSED VARIANTS: {', '.join(names)} (listed above; every platform chain still has a verified variant)")
    chains = manifest.get("executionProviders") or {}
    for entry in (manifest.get("verification") or {}).get("refusedEps") or []:
        # a chain that keeps the refused EP has no EP left that a variant passed on (the package fails)
        now = ", ".join(f"{platform} {' > '.join(chains[platform])}" if entry["ep"] not in chains.get(platform, [entry["ep"]]) else f"{platform} none left"
                        for platform in entry["platforms"])
        echo(f"REFUSED EP: {entry['ep']} (no variant passed on it: {entry['evidence']}); chains now: {now}")
    from pipeline.verify.engines.browser.default_load import narrowed_lines

    for line in narrowed_lines(manifest):
        echo(line)
    echo(f"{'PASSED' if report['passed'] else 'FAILED'}: {check_counts(report)}")


def check_counts(report: dict) -> str:
    """`4 passed, 0 failed, 0 not verifiable, 6 skipped`: a build's checks by status (its last line;
    a catalog build's line per package)."""
    counts = {status: sum(c["status"] == status for c in report["checks"]) for status in ("passed", "failed", "not-verifiable", "skipped", "error")}
    errors = f", {counts['error']} error" if counts["error"] else ""
    return f"{counts['passed']} passed, {counts['failed']} failed, {counts['not-verifiable']} not verifiable, {counts['skipped']} skipped{errors}"


def verify_lines(verification: PackageVerification) -> list[str]:
    """`pack verify`'s summary: per check, per run and a verdict; several runtimes side by side,
    the runtime-independent webgpu-kernels checks before their verdict line."""
    if verification.result is not None:
        return summary_lines(verification.result, verification.kernel_facts, verification.policy, verification.failed)
    lines = side_by_side_lines(verification.runtimes)
    lines[-1:-1] = [check_line(check) for check in verification.kernel_checks] + webgpu_kernel_lines(verification.kernel_facts)
    return lines


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
        lines = [browser[0], "checks:", *(check_line(check) for check in result.checks), "runs:", *browser[1:], *engines_lines(result.report)]
    if kernel_facts:
        lines.extend(webgpu_kernel_lines(kernel_facts))
    if policy:
        lines.append(f"browsers: {policy}")
    counts = {status: sum(c["status"] == status for c in result.checks) for status in MARKS}
    verdict = "FAILED" if (result.failed if failed is None else failed) else "PASSED"
    errors = f", {counts['error']} error" if counts.get("error") else ""
    refused = f", {counts['refused']} refused by the build" if counts.get("refused") else ""
    lines.append(f"{verdict}: {counts['passed']} passed, {counts['failed']} failed, {counts['not-verifiable']} not verifiable{refused}{errors}")
    return lines
