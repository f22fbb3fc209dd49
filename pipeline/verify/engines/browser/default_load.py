"""The package as an app loads it: one page imports the shipped loader.js, calls
`load()` with nothing but its base URL, so the manifest's defaults decide (pre-warm, the desktop
platform chain, the selection mode, refusals, priors, threads), runs the sample and hands the
outputs back; they are judged against the build's fp32 reference with the bounds of the pair the
loader landed on (`thresholds[ep][variant]`), as every browser check is.

The per-(EP, variant) checks (harness.py) say each pair computes the right numbers; this says the
loader's default path reaches one of them: a pre-warm that breaks a model on zeros, a chain that
starts on a pair the build refused or a fallback that never arrives shows here and nowhere else.

It runs on the final manifest (after the verdict: refusals, narrowed chains, `loader.select`),
served from memory beside the staging folder: one extra page in the local Chromium. Its checks
have `stage: "default-load"` (one per output; one for the whole load when it produced none) and
carry what the load did (`platform`, `chain`, `select`, `prewarm`, `fallbacks`, `prewarmError`,
`threads`); a failed one fails the package (`default_load_problems`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pipeline.errors import PackError
from pipeline.manifest import ENGINES  # noqa: F401 - the engines' one list; parse_engines checks against it
from pipeline.verify.judgement.checks import Check, check, output_checks, rounded_metrics

STAGE = "default-load"
# What the page is asked: page/default_load.js's load() with the manifest's defaults and the sample run.
EVALUATE = "(base) => window.__packDefaultLoad(base)"


DRIVEN = ("firefox", "webkit")  # driven from outside Playwright, each by its module beside this one


def parse_engines(text: str) -> tuple[str, ...]:
    """`--engines chromium,firefox` as a tuple, each once; PackError (bad input) for another name."""
    names = tuple(dict.fromkeys(name.strip().lower() for name in str(text).split(",") if name.strip()))
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise PackError(f"--engines {text!r}: use a comma-separated list of {', '.join(ENGINES)}")
    return names


def verify_default_load(package_dir: Path, manifest: dict, reference: dict[str, np.ndarray], *, gpu: bool = False, browser=None,
                        timeout_s: float | None = None, engine: str = "chromium") -> list[Check]:
    """The default load's checks on `package_dir` with `manifest` served as its manifest.json, in
    `engine`: chromium (`browser`: an open Playwright browser, else the local Chromium is launched
    with the `gpu` flags), firefox (firefox.py) or webkit (webkit.py); `not-verifiable` naming the
    install line where the engine is not installed."""
    if engine in DRIVEN:
        return _driven_default_load(engine, package_dir, manifest, reference, timeout_s)
    if engine != "chromium":
        raise PackError(f"engine {engine!r}: not one of {', '.join(ENGINES)}")
    from contextlib import ExitStack

    from pipeline.package_server import running_server
    from pipeline.verify.engines.browser.chromium import launch_browser
    from pipeline.verify.engines.browser.pages import PAGE_DIR, PAGE_PREFIX

    watchdog_ms = int((manifest.get("loader") or {}).get("watchdogMs") or 60000)
    limit_ms = int((timeout_s or 0) * 1000) or 6 * watchdog_ms  # creation (3x) + pre-warm + sample + run, and a fallback's
    with ExitStack() as stack:
        server = stack.enter_context(running_server(Path(package_dir), {PAGE_PREFIX: PAGE_DIR}, manifest=json.dumps(manifest).encode()))
        if browser is None:
            browser = stack.enter_context(launch_browser(gpu=gpu))
        context = browser.new_context()
        stack.callback(context.close)
        page = context.new_page()
        page.set_default_timeout(limit_ms)
        try:
            page.goto(server.url + PAGE_PREFIX.lstrip("/") + "default_load.html")
            page.wait_for_function("() => typeof window.__packDefaultLoad === 'function'", timeout=30_000)
            result = page.evaluate(EVALUATE, server.url)
        except Exception as error:  # the page crashed or did not answer: the load failed
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            result = {"ok": False, "message": f"the page did not answer: {first}", "fallbacks": []}
    return judge_default_load(manifest, reference, result)


def _driven_default_load(engine: str, package_dir: Path, manifest: dict, reference: dict[str, np.ndarray], timeout_s: float | None) -> list[Check]:
    """The default load in an engine pack drives from outside (firefox.py, webkit.py: each has
    INSTALL, unavailable() and run_page(url, base, timeout_ms)); not-verifiable naming the install
    line where the engine is not installed."""
    from pipeline.package_server import running_server
    from pipeline.verify.engines.browser import firefox, webkit
    from pipeline.verify.engines.browser.pages import PAGE_DIR, PAGE_PREFIX

    driver = {"firefox": firefox, "webkit": webkit}[engine]
    why = driver.unavailable()
    if why:
        return [check(STAGE, "*", "*", "not-verifiable", detail=why, check=STAGE, engine=engine, install=driver.INSTALL)]
    watchdog_ms = int((manifest.get("loader") or {}).get("watchdogMs") or 60000)
    limit_ms = int((timeout_s or 0) * 1000) or 6 * watchdog_ms
    with running_server(Path(package_dir), {PAGE_PREFIX: PAGE_DIR}, manifest=json.dumps(manifest).encode()) as server:
        result = driver.run_page(server.url + PAGE_PREFIX.lstrip("/") + "default_load.html", server.url, limit_ms)
    if result.get("notRunnable"):  # the driver's own tools could not be installed: the engine did not run
        return [check(STAGE, "*", "*", "not-verifiable", detail=result["message"], check=STAGE, engine=engine)]
    return judge_default_load(manifest, reference, result, engine=engine)


def judge_default_load(manifest: dict, reference: dict[str, np.ndarray], result: dict, engine: str = "chromium") -> list[Check]:
    """The checks of one default load's `result` (page/default_load.js's answer) in `engine`."""
    from pipeline.verify.engines.browser.pages import decode_tensor

    loader = manifest.get("loader") or {}
    chain = list((manifest.get("executionProviders") or {}).get("desktop") or ["webgpu", "wasm"])
    facts = {"check": STAGE, "engine": engine, "platform": "desktop", "chain": chain, "select": loader.get("select", "chain"), "prewarm": loader.get("prewarm", True)}
    if result.get("browser"):
        facts["browser"] = result["browser"]
    # what the page saw (isolation, SharedArrayBuffer, navigator.gpu) and heard (console warnings):
    # the evidence for its threads and its EP, also where the driver has no console (WebKit)
    for key in ("page", "warnings"):
        if result.get(key):
            facts[key] = result[key]
    if not result.get("ok"):
        tried = "; ".join(f"{f.get('ep')}/{f.get('variant')} ({f.get('phase')}): {f.get('error')}" for f in result.get("fallbacks") or [])
        detail = f"load() with the manifest's defaults failed: {result.get('message')}" + (f" [{tried}]" if tried and tried not in str(result.get("message")) else "")
        return [check(STAGE, chain[0] if chain else "*", "*", "failed", detail=detail, fallbacks=result.get("fallbacks") or [], **facts)]
    info = result["info"]
    ep, variant, bundle = info["ep"], info["variant"], info["bundle"]
    facts.update(fallbacks=info.get("fallbacks") or [], prewarmError=info.get("prewarmError"), threads=info.get("threads"),
                 threadsWhy=info.get("threadsWhy"), loadMs=round(result.get("loadMs") or 0, 1))
    base = {"stage": STAGE, "ep": ep, "variant": variant, "bundle": bundle, **facts}
    bounds = ((manifest.get("thresholds") or {}).get(ep) or {}).get(variant)
    if not bounds:
        return [check(**base, status="not-verifiable", detail=f"manifest.json has no thresholds for {ep}/{variant}")]
    outputs = {name: decode_tensor(encoded) for name, encoded in result["outputs"].items()}
    missing = [name for name in reference if name not in outputs]
    if missing:
        return [check(**base, status="failed", detail=f"the default load's run has no output {', '.join(missing)}")]
    kinds = {o["name"]: o.get("kind", "tensor") for o in manifest.get("outputs") or []}
    checks = output_checks(base, reference, {name: outputs[name].astype(np.float32) if outputs[name].dtype == np.float16 else outputs[name] for name in outputs}, bounds, kinds)
    for entry in checks:
        entry["metrics"] = rounded_metrics(entry["metrics"])
    return checks


def default_load_problems(checks: list[Check]) -> list[str]:
    """The verdict's lines for a default load that failed (the package fails with them)."""
    failed = [c for c in checks if c["stage"] == STAGE and c["status"] == "failed"]
    return [f"default load{_in(c)} ({c['ep']}/{c['variant']}{' ' + c['output'] if c.get('output') else ''}): {c.get('detail', 'failed')}" for c in failed]


def _in(check_: Check) -> str:
    """' in firefox' for another engine than Chromium (the build's own), '' for Chromium."""
    engine = check_.get("engine", "chromium")
    return "" if engine == "chromium" else f" in {engine}"


def default_load_lines(checks: list[Check]) -> list[str]:
    """One line per engine for the summary: where the loader's defaults landed, each output's figure and bound."""
    engines: dict[str, list[Check]] = {}
    for c in checks:
        if c["stage"] == STAGE:
            engines.setdefault(c.get("engine", "chromium"), []).append(c)
    return [_line(mine) for mine in engines.values()]


def _line(mine: list[Check]) -> str:
    from pipeline.verify.judgement.metrics import format_metrics

    first = mine[0]
    label = "default load" + _in(first) + ":"
    how = f"desktop chain {' > '.join(first.get('chain') or [])}, pre-warm {'on' if first.get('prewarm', True) else 'off'}, select {first.get('select')}"
    worst = "failed" if any(c["status"] == "failed" for c in mine) else "passed" if all(c["status"] == "passed" for c in mine) else mine[0]["status"]
    mark = {"passed": "ok  ", "failed": "FAIL", "not-verifiable": "n/v ", "skipped": "skip"}.get(worst, worst)
    if first["variant"] == "*":
        return f"{label} {mark} {first.get('detail', '')}".rstrip()
    bundle = f" [{first['bundle']} bundle]" if first.get("bundle") and first["bundle"] != first["ep"] else ""
    landed = f"{first['ep']}/{first['variant']}{bundle}"
    figures = "; ".join(
        f"{c['output']} {format_metrics(c.get('metrics') or {}, c.get('threshold') or {})}" + (f" ({c['detail']})" if c["status"] != "passed" and c.get("detail") else "")
        for c in mine if c.get("output")
    ) or (first.get("detail") or "")
    after = [f"{f['ep']}/{f['variant']} ({f['phase']})" if f.get("variant") else f"{f['ep']} ({f.get('error', '')[:80]})" for f in first.get("fallbacks") or []]
    extra = (f"; passed over {', '.join(after)}" if after else "") + ("; a pre-warm error kept the provider: the sample ran" if first.get("prewarmError") else "")
    threads = f"; {first['threads']} thread{'s' if first['threads'] != 1 else ''}" if first.get("threads") else ""
    if first.get("threads") == 1 and first.get("threadsWhy"):  # one thread on a multi-core machine needs its reason beside it
        threads += f": {first['threadsWhy']}"
    return f"{label} {mark} {landed} ({how}{threads}{extra}): {figures}"


def skipped_default_load(why: str) -> list[Check]:
    """--no-browser (or remote browsers only): the default load was not run."""
    return [check(STAGE, "*", "*", "skipped", detail=why, check=STAGE)]


def default_load_stage(package_dir: Path, manifest: dict, checks: list[Check], verdict: dict, reference: dict[str, np.ndarray], *,
                       enabled: bool, gpu: bool, remote_only: bool = False, engines: tuple[str, ...] = ("chromium",)) -> dict:
    """The build's default-load stage: its checks after the others, one load per engine (`--engines`;
    Chromium, the build's own, unless remote browsers only); a failed one fails the package (the
    verdict and the manifest's verification.passed). Returns {checks, manifest, verdict}."""
    if not enabled:
        found = skipped_default_load("--no-browser")
    else:
        found = []
        for engine in engines:
            if engine == "chromium" and remote_only:
                found += skipped_default_load("remote browsers only (--browser/--cdp): the default load runs in the local Chromium")
            else:
                found += verify_default_load(package_dir, manifest, reference, gpu=gpu, engine=engine)
    problems = default_load_problems(found)
    if problems:
        verdict = {**verdict, "passed": False, "verdict": [*verdict["verdict"], *problems]}
        manifest = {**manifest, "verification": {**manifest["verification"], "passed": False}}
    return {"checks": [*checks, *found], "manifest": manifest, "verdict": verdict}
