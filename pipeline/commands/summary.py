"""The human-readable end of a build or verify: one line per check with figure and threshold."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.verify.metrics import format_metrics

MARKS = {"passed": "ok  ", "failed": "FAIL", "not-verifiable": "n/v ", "skipped": "skip"}


def check_line(check: dict) -> str:
    ep = check["ep"] + (f"@{check['bundle']}" if check.get("bundle") and check["bundle"] != check["ep"] else "")
    where = f"{check['stage']:<7} {ep:<13} {check['variant']:<9}"
    output = f" {check['output']}" if check.get("output") else ""
    figures = format_metrics(check.get("metrics", {}), check.get("threshold", {}))
    detail = check.get("detail")
    tail = "  ".join(part for part in (figures, detail if check["status"] != "passed" else None) if part)
    return f"  {MARKS.get(check['status'], check['status'])} {where}{output}  {tail}".rstrip()


def print_summary(report: dict, package_dir: Path) -> None:
    echo = lambda line="": typer.echo(line, err=False)  # noqa: E731
    echo(f"package {report['name']} -> {package_dir}")
    source = report.get("source", {})
    if source:
        echo(f"  source {source.get('uri')} ({source.get('precision', '?')}: {source.get('precision_reason', '')})")
    for step in report.get("steps", []):
        if step.get("changed") or step.get("refused"):
            what = step.get("refused") or "; ".join(r.get("what") or r.get("warning") or str(r) for r in step.get("records", [])[:3])
            echo(f"  step {step['name']}: {what}")
    for name, reason in report.get("variants_refused", {}).items():
        echo(f"  variant {name} refused: {reason}")
    echo("checks:")
    for check in report["checks"]:
        echo(check_line(check))
    browser = report.get("browser") or {}
    for ep, info in (browser.get("eps") or {}).items():
        if isinstance(info, dict):
            fallback = info.get("cpu_fallback_nodes") or info.get("cpuFallback") or []
            times = ", ".join(f"{k} {v:.0f} ms" for k, v in info.items() if k.endswith("_ms") and isinstance(v, (int, float)))
            echo(f"  browser {ep}: {times}" + (f"; CPU fallback: {', '.join(map(str, fallback[:8]))}" if fallback else ""))
    timings = ", ".join(f"{k.removesuffix('_s')} {v:.1f}s" for k, v in report.get("timings", {}).items())
    echo(f"timings: {timings}")
    browser_ran = any(c["stage"] == "browser" and c["status"] in ("passed", "failed") for c in report["checks"])
    if not browser_ran:
        echo("NOT browser-verified (--no-browser): host checks only")
    verdict = "PASSED" if report["passed"] else "FAILED"
    echo(f"{verdict}: {sum(c['status'] == 'passed' for c in report['checks'])} passed, {sum(c['status'] == 'failed' for c in report['checks'])} failed, {sum(c['status'] == 'not-verifiable' for c in report['checks'])} not verifiable, {sum(c['status'] == 'skipped' for c in report['checks'])} skipped")
