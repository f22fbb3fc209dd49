"""The package as an app loads it: one page imports the shipped loader.js, calls
`load()` with nothing but its base URL, so the manifest's defaults decide (pre-warm, the platform
chain, the selection mode, refusals, priors, threads), runs the sample and hands the outputs back;
they are judged against the build's fp32 reference with the bounds of the pair the loader landed
on (`thresholds[ep][variant]`), as every browser check is.

Each platform chain the manifest declares (desktop, apple-mobile, android) is loaded in each
engine: the page presents itself as a device of that platform to the loader (page/default_load.js),
first on an empty Cache Storage, then once more from what that load cached (the reload). Each
visit's peak memory is the engine's content process's (memory.py). One row per (engine, platform).

A platform chain whose default load fails, where a narrower chain (without the EPs of the pairs
that failed) loads and passes, is narrowed in the manifest with that evidence
(`verification.narrowedChains`): the package passes, as with a refused EP. Only when no narrower
chain passes does the package fail.

The per-(EP, variant) checks (harness.py) say each pair computes the right numbers; this says the
loader's default path reaches one of them: a pre-warm that breaks a model on zeros, a chain that
starts on a pair the build refused or a fallback that never arrives shows here and nowhere else.

It runs on the final manifest (after the verdict: refusals, narrowed chains, `loader.select`),
served from memory beside the staging folder. Its checks have `stage: "default-load"` (one per
output; one for the whole load when it produced none) and carry what the load did (`platform`,
`chain`, `select`, `prewarm`, `fallbacks`, `prewarmError`, `threads`, `memory`); a failed one
fails the package (`default_load_problems`) unless its chain was narrowed (`narrowedTo`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from pipeline.errors import PackError, warn
from pipeline.manifest import ENGINES  # noqa: F401 - the engines' one list; parse_engines checks against it
from pipeline.verify.judgement.checks import Check, check, output_checks, rounded_metrics

STAGE = "default-load"
# What the page is asked: page/default_load.js's load() with the manifest's defaults and the sample run, for one visit.
EVALUATE = "([base, visit]) => window.__packDefaultLoad(base, visit)"
APPLE_MOBILE = "apple-mobile"


DRIVEN = ("firefox", "webkit")  # driven from outside Playwright, each by its module beside this one


def parse_engines(text: str) -> tuple[str, ...]:
    """`--engines chromium,firefox` as a tuple, each once; PackError (bad input) for another name."""
    names = tuple(dict.fromkeys(name.strip().lower() for name in str(text).split(",") if name.strip()))
    unknown = [name for name in names if name not in ENGINES]
    if unknown or not names:
        raise PackError(f"--engines {text!r}: use a comma-separated list of {', '.join(ENGINES)}")
    return names


def declared_platforms(manifest: dict) -> list[str]:
    """The platforms whose chains the manifest declares, in its order (desktop when it declares none)."""
    return list((manifest.get("executionProviders") or {}).keys()) or ["desktop"]


def visits(platforms: list[str]) -> list[dict]:
    """Per platform: its first load on an empty Cache Storage, then its reload from what that cached."""
    return [visit for platform in platforms
            for visit in ({"name": f"{platform}/first", "platform": platform, "cold": True}, {"name": f"{platform}/reload", "platform": platform})]


def verify_default_load(package_dir: Path, manifest: dict, reference: dict[str, np.ndarray], *, gpu: bool = False, browser=None,
                        timeout_s: float | None = None, engine: str = "chromium", platforms: list[str] | None = None) -> list[Check]:
    """The default-load checks on `package_dir` with `manifest` served as its manifest.json, in
    `engine`, for each of `platforms` (default: every chain the manifest declares): chromium
    (`browser`: an open Playwright browser, else the local Chromium is launched with the `gpu`
    flags), firefox (firefox.py) or webkit (webkit.py); `not-verifiable` naming the install line
    where the engine is not installed."""
    platforms = platforms or declared_platforms(manifest)
    if engine not in ENGINES:
        raise PackError(f"engine {engine!r}: not one of {', '.join(ENGINES)}")
    if engine in DRIVEN:
        from pipeline.verify.engines.browser import firefox, webkit

        driver = {"firefox": firefox, "webkit": webkit}[engine]
        why = driver.unavailable()
        if why:
            return [check(STAGE, "*", "*", "not-verifiable", detail=why, check=STAGE, engine=engine, platform=platform, install=driver.INSTALL) for platform in platforms]
    answers = _visit(engine, Path(package_dir), manifest, visits(platforms), gpu=gpu, browser=browser, timeout_s=timeout_s)
    found: list[Check] = []
    for platform in platforms:
        first, reload = answers[f"{platform}/first"], answers[f"{platform}/reload"]
        if first.get("notRunnable"):  # the driver's own tools could not be installed: the engine did not run
            found.append(check(STAGE, "*", "*", "not-verifiable", detail=first["message"], check=STAGE, engine=engine, platform=platform))
        else:
            found += judge_default_load(manifest, reference, first, engine=engine, platform=platform, reload=reload)
    return found


def _visit(engine: str, package_dir: Path, manifest: dict, planned: list[dict], *, gpu: bool, browser, timeout_s: float | None) -> dict[str, dict]:
    """Each visit's answer (page/default_load.js's, with `memory`), by name, in one browser of `engine`."""
    from pipeline.package_server import running_server
    from pipeline.verify.engines.browser.pages import PAGE_DIR, PAGE_PREFIX

    watchdog_ms = int((manifest.get("loader") or {}).get("watchdogMs") or 60000)
    limit_ms = int((timeout_s or 0) * 1000) or 6 * watchdog_ms  # creation (3x) + pre-warm + sample + run, and a fallback's
    with running_server(package_dir, {PAGE_PREFIX: PAGE_DIR}, manifest=json.dumps(manifest).encode()) as server:
        url = server.url + PAGE_PREFIX.lstrip("/") + "default_load.html"
        if engine == "firefox":
            from pipeline.verify.engines.browser import firefox

            return firefox.run_visits(url, server.url, planned, limit_ms)
        if engine == "webkit":
            from pipeline.verify.engines.browser import webkit

            return webkit.run_visits(url, server.url, planned, limit_ms)
        return _chromium_visits(url, server.url, planned, limit_ms, gpu=gpu, browser=browser)


def _chromium_visits(url: str, base: str, planned: list[dict], limit_ms: int, *, gpu: bool, browser) -> dict[str, dict]:
    """The visits in one context of Chromium (the local one launched here, unless `browser`), one page each."""
    from contextlib import ExitStack

    from pipeline.verify.engines.browser.chromium import launch_browser
    from pipeline.verify.engines.browser.memory import PeakSampler, chromium_mains, new_chromium

    answers: dict[str, dict] = {}
    with ExitStack() as stack:
        root = None
        if browser is None:
            before = chromium_mains()
            browser = stack.enter_context(launch_browser(gpu=gpu))
            root = new_chromium(before)  # an open browser given (remote or a test's) is not measured
        context = browser.new_context()
        stack.callback(context.close)
        sampler = stack.enter_context(PeakSampler(root, "chromium"))
        for visit in planned:
            page = context.new_page()
            page.set_default_timeout(limit_ms)
            sampler.start_phase(visit["name"])
            try:
                page.goto(url)
                page.wait_for_function("() => typeof window.__packDefaultLoad === 'function'", timeout=30_000)
                result = page.evaluate(EVALUATE, [base, {"platform": visit["platform"], "cold": bool(visit.get("cold"))}])
            except Exception as error:  # the page crashed or did not answer: the load failed
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                result = {"ok": False, "message": f"the page did not answer: {first}", "fallbacks": []}
            sampler.end_phase()
            with contextlib.suppress(Exception):  # a crashed page may not close: the context goes with the block
                page.close()
            answers[visit["name"]] = {**result, "memory": sampler.peaks().get(visit["name"]) if root is not None else None}
    return answers


def judge_default_load(manifest: dict, reference: dict[str, np.ndarray], result: dict, engine: str = "chromium", platform: str = "desktop",
                       reload: dict | None = None) -> list[Check]:
    """The checks of one default load's `result` (page/default_load.js's answer) in `engine` on
    `platform`'s chain; `reload`: the answer of the reload from Cache Storage after it, judged the
    same way (a reload that fails adds its failed checks, `phase: "reload"`)."""
    loader = manifest.get("loader") or {}
    chain = list((manifest.get("executionProviders") or {}).get(platform) or ["webgpu", "wasm"])
    facts = {"check": STAGE, "engine": engine, "platform": platform, "chain": chain, "select": loader.get("select", "chain"), "prewarm": loader.get("prewarm", True)}
    if result.get("browser"):
        facts["browser"] = result["browser"]
    # what the page saw (isolation, SharedArrayBuffer, navigator.gpu) and heard (console warnings):
    # the evidence for its threads and its EP, also where the driver has no console (WebKit)
    for key in ("page", "warnings"):
        if result.get(key):
            facts[key] = result[key]
    memory = {phase: answer.get("memory") for phase, answer in (("first", result), ("reload", reload or {})) if answer.get("memory")}
    if memory:
        facts["memory"] = memory
    # the package files each visit fetched over the network: the reload's evidence that it came from Cache Storage
    listed = {path for name, entry in (manifest.get("files") or {}).items()
              for path in (name, *(coded.get("path") for coded in (entry.get("encodings") or {}).values()))}
    fetched = {phase: [name for name in answer["fetched"] if name in listed] for phase, answer in (("first", result), ("reload", reload or {})) if "fetched" in answer}
    if fetched:
        facts["fetched"] = fetched
    checks = _judged(manifest, reference, result, facts, chain)
    if reload is not None and not any(c["status"] in ("failed", "not-verifiable") for c in checks):
        again = _judged(manifest, reference, reload, {**facts, "phase": "reload"}, chain)
        for entry in again:
            if entry["status"] == "failed":
                entry["detail"] = f"the reload from Cache Storage: {entry.get('detail') or 'failed'}"
                checks.append(entry)
    return checks


def _judged(manifest: dict, reference: dict[str, np.ndarray], result: dict, facts: dict, chain: list[str]) -> list[Check]:
    from pipeline.verify.engines.browser.pages import decode_tensor

    if not result.get("ok"):
        tried = "; ".join(f"{f.get('ep')}/{f.get('variant')} ({f.get('phase')}): {f.get('error')}" for f in result.get("fallbacks") or [])
        detail = f"load() with the manifest's defaults failed: {result.get('message')}" + (f" [{tried}]" if tried and tried not in str(result.get("message")) else "")
        return [check(STAGE, chain[0] if chain else "*", "*", "failed", detail=detail, **{**facts, "fallbacks": result.get("fallbacks") or []})]
    info = result["info"]
    ep, variant, bundle = info["ep"], info["variant"], info["bundle"]
    facts = {**facts, "fallbacks": info.get("fallbacks") or [], "prewarmError": info.get("prewarmError"), "threads": info.get("threads"),
             "threadsWhy": info.get("threadsWhy"), "loadMs": round(result.get("loadMs") or 0, 1)}
    base = {"stage": STAGE, "ep": ep, "variant": variant, "bundle": bundle, **facts}
    if info.get("platform", facts["platform"]) != facts["platform"]:  # the page hook did not take: this is not that platform's load
        return [check(**base, status="not-verifiable", detail=f"the page could not present itself as {facts['platform']}: the loader detected {info['platform']}")]
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


# ----- narrowing a platform chain that fails its default load ------------------------------------


def failing_pairs(rows: list[Check]) -> list[dict]:
    """The (ep, variant) pairs the failed default-load rows name, each once with its engine and
    error: the pair a load landed on when its outputs were wrong, and each provider that failed on
    the way (created, pre-warmed or ran, not one passed over before trying) when load() threw."""
    pairs: list[dict] = []
    for row in rows:
        if row["status"] != "failed":
            continue
        if row["variant"] != "*":
            named = [{"ep": row["ep"], "variant": row["variant"], "error": f"{row['output']}: {row.get('detail')}" if row.get("output") else row.get("detail")}]
        else:
            named = [{"ep": f["ep"], "variant": f["variant"], "error": f"{f.get('phase')}: {f.get('error')}"}
                     for f in row.get("fallbacks") or [] if f.get("variant") and f.get("phase") != "select"]
        for pair in named:
            if not any((p["ep"], p["variant"]) == (pair["ep"], pair["variant"]) for p in pairs):
                pairs.append({"engine": row.get("engine", "chromium"), **pair})
    return pairs


def narrowed_chain(chain: list[str], pairs: list[dict], bundles: list[str]) -> list[str] | None:
    """`chain` without the EPs of the failed `pairs`; None when that drops nothing, leaves nothing,
    or needs a runtime bundle the package does not ship (`bundles`)."""
    from pipeline.manifest import chain_bundle

    dropped = {pair["ep"] for pair in pairs}
    kept = [ep for ep in chain if ep not in dropped]
    if not kept or kept == list(chain) or chain_bundle(kept) not in bundles:
        return None
    return kept


def _with_chain(manifest: dict, platform: str, chain: list[str], narrowing: dict) -> dict:
    verification = manifest["verification"]
    return {**manifest, "executionProviders": {**manifest["executionProviders"], platform: chain},
            "verification": {**verification, "narrowedChains": [*verification.get("narrowedChains", []), narrowing]}}


def _evidence(pairs: list[dict]) -> str:
    return "; ".join(f"default load{_in(pair)} failed on {pair['ep']}/{pair['variant']}: {pair['error']}" for pair in pairs)


def default_load_problems(checks: list[Check]) -> list[str]:
    """The verdict's lines for a default load that failed (the package fails with them); a row
    whose chain was narrowed to one that passes (`narrowedTo`) is evidence, not a failure."""
    failed = [c for c in checks if c["stage"] == STAGE and c["status"] == "failed" and "narrowedTo" not in c]
    return [f"default load{_in(c)}{_on(c)} ({c['ep']}/{c['variant']}{' ' + c['output'] if c.get('output') else ''}): {c.get('detail', 'failed')}" for c in failed]


def _in(check_: Check) -> str:
    """' in firefox' for another engine than Chromium (the build's own), '' for Chromium."""
    engine = check_.get("engine", "chromium")
    return "" if engine == "chromium" else f" in {engine}"


def _on(check_: Check) -> str:
    """' (apple-mobile)' for another platform than desktop, '' for desktop."""
    platform = check_.get("platform", "desktop")
    return "" if platform == "desktop" else f" ({platform})"


def default_load_lines(checks: list[Check]) -> list[str]:
    """One line per (engine, platform) for the summary: where the loader's defaults landed, each
    output's figure and bound, the peak memory; rows of a chain since narrowed are left to
    narrowed_lines."""
    rows: dict[tuple[str, str], list[Check]] = {}
    for c in checks:
        if c["stage"] == STAGE and "narrowedTo" not in c:
            rows.setdefault((c.get("engine", "chromium"), c.get("platform", "desktop")), []).append(c)
    return [_line(mine) for mine in rows.values()]


def narrowed_lines(manifest: dict) -> list[str]:
    """One line per chain the default loads narrowed, with the evidence."""
    return [f"NARROWED CHAIN: {n['platform']} {' > '.join(n['from'])} -> {' > '.join(n['to'])} ({n['evidence']})"
            for n in (manifest.get("verification") or {}).get("narrowedChains") or []]


def memory_text(memory: dict | None) -> str:
    """'peak 212.4 MB first load, 180.2 MB reload' from a row's `memory`; '' without figures."""
    parts = [f"{(memory or {})[phase]['peakMb']} MB {label}" for phase, label in (("first", "first load"), ("reload", "reload"))
             if "peakMb" in ((memory or {}).get(phase) or {})]
    return f"peak {', '.join(parts)}" if parts else ""


def _line(mine: list[Check]) -> str:
    from pipeline.verify.judgement.metrics import format_metrics

    first = mine[0]
    label = "default load" + _in(first) + _on(first) + ":"
    how = f"{first.get('platform', 'desktop')} chain {' > '.join(first.get('chain') or [])}, pre-warm {'on' if first.get('prewarm', True) else 'off'}, select {first.get('select')}"
    worst = "failed" if any(c["status"] == "failed" for c in mine) else "passed" if all(c["status"] == "passed" for c in mine) else mine[0]["status"]
    mark = {"passed": "ok  ", "failed": "FAIL", "not-verifiable": "n/v ", "skipped": "skip"}.get(worst, worst)
    if first["variant"] == "*":
        return f"{label} {mark} {first.get('detail', '')}".rstrip()
    bundle = f" [{first['bundle']} bundle]" if first.get("bundle") and first["bundle"] != first["ep"] else ""
    landed = f"{first['ep']}/{first['variant']}{bundle}"
    figures = "; ".join(
        f"{c['output']}{' (reload)' if c.get('phase') == 'reload' else ''} {format_metrics(c.get('metrics') or {}, c.get('threshold') or {})}"
        + (f" ({c['detail']})" if c["status"] != "passed" and c.get("detail") else "")
        for c in mine if c.get("output")
    ) or (first.get("detail") or "")
    after = [f"{f['ep']}/{f['variant']} ({f['phase']})" if f.get("variant") else f"{f['ep']} ({f.get('error', '')[:80]})" for f in first.get("fallbacks") or []]
    extra = (f"; passed over {', '.join(after)}" if after else "") + ("; a pre-warm error kept the provider: the sample ran" if first.get("prewarmError") else "")
    threads = f"; {first['threads']} thread{'s' if first['threads'] != 1 else ''}" if first.get("threads") else ""
    if first.get("threads") == 1 and first.get("threadsWhy"):  # one thread on a multi-core machine needs its reason beside it
        threads += f": {first['threadsWhy']}"
    peak = memory_text(first.get("memory"))
    return f"{label} {mark} {landed} ({how}{threads}{extra}{'; ' + peak if peak else ''}): {figures}"


def memory_budget_lines(checks: list[Check], budget_mb: float) -> list[str]:
    """A warning per engine whose apple-mobile default load peaked above `budget_mb` ([verify] apple_mobile_memory_mb)."""
    lines = []
    for c in checks:
        if c["stage"] != STAGE or c.get("platform") != APPLE_MOBILE or "narrowedTo" in c or c.get("phase") == "reload":
            continue
        peaks = {phase: figure["peakMb"] for phase, figure in (c.get("memory") or {}).items() if "peakMb" in figure}
        over = {phase: mb for phase, mb in peaks.items() if mb > budget_mb}
        line = (f"the apple-mobile default load{_in(c)} peaked at {max(over.values())} MB ({memory_text(c['memory'])}), over [verify] "
                f"apple_mobile_memory_mb {budget_mb:g}: iOS kills tabs around 1.5 GB; lower the model's memory or raise the budget") if over else None
        if line and line not in lines:
            lines.append(line)
    return lines


def skipped_default_load(why: str) -> list[Check]:
    """--no-browser (or remote browsers only): the default load was not run."""
    return [check(STAGE, "*", "*", "skipped", detail=why, check=STAGE)]


def default_load_stage(package_dir: Path, manifest: dict, checks: list[Check], verdict: dict, reference: dict[str, np.ndarray], *,
                       enabled: bool, gpu: bool, remote_only: bool = False, engines: tuple[str, ...] = ("chromium",),
                       apple_mobile_memory_mb: float = 1024) -> dict:
    """The build's default-load stage: its checks after the others, in each engine (`--engines`;
    Chromium, the build's own, unless remote browsers only) for each platform chain; a chain that
    fails is narrowed where a narrower one passes, else the package fails (the verdict and the
    manifest's verification.passed). Returns {checks, manifest, verdict}."""
    if not enabled:
        found = skipped_default_load("--no-browser")
    else:
        platforms = declared_platforms(manifest)
        first = _rows(package_dir, manifest, reference, platforms, gpu=gpu, remote_only=remote_only, engines=engines)  # one browser per engine
        found = []
        for platform in platforms:
            rows, manifest = _narrowed(package_dir, manifest, reference, platform, [c for c in first if c["platform"] == platform],
                                       gpu=gpu, remote_only=remote_only, engines=engines)
            found += rows
        for line in memory_budget_lines(found, apple_mobile_memory_mb):
            warn(line)
    problems = default_load_problems(found)
    if problems:
        verdict = {**verdict, "passed": False, "verdict": [*verdict["verdict"], *problems]}
        manifest = {**manifest, "verification": {**manifest["verification"], "passed": False}}
    return {"checks": [*checks, *found], "manifest": manifest, "verdict": verdict}


def _rows(package_dir: Path, manifest: dict, reference: dict[str, np.ndarray], platforms: list[str], *, gpu: bool, remote_only: bool,
          engines: tuple[str, ...]) -> list[Check]:
    """The rows of `platforms` in every engine, each engine's in one browser."""
    rows: list[Check] = []
    for engine in engines:
        if engine == "chromium" and remote_only:
            rows += [{**c, "platform": platform} for platform in platforms
                     for c in skipped_default_load("remote browsers only (--browser/--cdp): the default load runs in the local Chromium")]
        else:
            rows += verify_default_load(package_dir, manifest, reference, gpu=gpu, engine=engine, platforms=platforms)
    return rows


def _narrowed(package_dir: Path, manifest: dict, reference: dict[str, np.ndarray], platform: str, rows: list[Check], *, gpu: bool,
              remote_only: bool, engines: tuple[str, ...]) -> tuple[list[Check], dict]:
    """`platform`'s rows and the manifest: while a load fails on pairs whose EPs a narrower chain
    leaves out, that chain is loaded in every engine; where its loads pass, the manifest takes it,
    with the evidence. Where no narrower chain passes, every failed row stays a failure and the
    chain stays as it was."""
    evidence: list[Check] = []
    given = manifest
    while True:
        chain = list(manifest["executionProviders"].get(platform) or [])
        failed = [c for c in rows if c["status"] == "failed"]
        pairs = failing_pairs(failed)
        kept = narrowed_chain(chain, pairs, list((manifest.get("runtime") or {}).get("bundles") or {})) if failed else None
        if kept is None and failed and evidence:  # no narrower chain passed: the package fails on every load that failed
            return [*({k: v for k, v in c.items() if k != "narrowedTo"} for c in evidence), *rows], given
        if kept is None:
            return [*evidence, *rows], manifest
        # the failed rows stay as the evidence; the rows that passed on the wider chain are redone on the narrower one
        evidence += [{**c, "narrowedTo": kept} for c in failed]
        manifest = _with_chain(manifest, platform, kept, {"platform": platform, "from": chain, "to": kept, "evidence": _evidence(pairs)})
        rows = _rows(package_dir, manifest, reference, [platform], gpu=gpu, remote_only=remote_only, engines=engines)
