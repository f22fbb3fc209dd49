"""The browser stage: the package checked through its own loader in Chromium, on the staging folder
with the manifest served from memory (no provisional manifest is written). When WebGPU fails under
the EP's default NHWC layout, the same package is tried with `preferredLayout: 'NCHW'`
(onnxruntime-web 1.30's NHWC transform breaks some real graphs, GTCRN's Conv among them); the
package keeps it when it fails fewer WebGPU runs (checks.layout_verdict), and a step records both.

Then the same runs in each other engine of `--engines` and the recipe's `[verify] engines`
(Firefox, WebKit: harness.py through driven.py), on the package as Chromium settled it: their checks
carry `engine`, the manifest records their runs per engine, and the loader reads them per engine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pipeline.assets.package import PackageContents
from pipeline.manifest import Manifest, Thresholds
from pipeline.progress import Progress
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import package_contents, recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.engines.browser.run_plan import plan_runs
from pipeline.verify.judgement.checks import layout_verdict, skipped_runs, webgpu_failures


@dataclass
class BrowserOutcome:
    checks: list[dict]
    report: dict | None = None  # report.json "browser" (None under --no-browser)
    ep_options: dict | None = None  # the EP options the checks settled on (None: as the package had them)
    steps: list[dict] = field(default_factory=list)
    policy_failed: bool = False  # --browser endpoints ended in error beyond what the policy allows
    outputs: dict = field(default_factory=dict)  # run label -> output -> what the browser produced (report.html)


def build_engines(options_engines: tuple[str, ...], required: list[str]) -> tuple[str, ...]:
    """The engines a build verifies in: `--engines`, then the recipe's `[verify] engines`, each once."""
    return tuple(dict.fromkeys([*options_engines, *required]))


def browser_verify(staging: Path, contents: PackageContents, thresholds: Thresholds, license: str | None, reference: dict[str, np.ndarray], gpu: bool, progress: Progress,
                   grid=None, engines: tuple[str, ...] = ("chromium",)) -> BrowserOutcome:
    from pipeline.verify.engines.browser.grid import browsers_for, exit_policy, verify_on_grid
    from pipeline.verify.engines.browser.harness import verify_in_browser

    ep_options = contents.ep_options
    steps = []
    with browsers_for(grid, gpu) as browser:
        served = contents.manifest(thresholds=thresholds, license=license)
        result = verify_on_grid(grid, staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser, manifest=served)
        if webgpu_failures(result.checks) and "preferredLayout" not in ep_options.get("webgpu", {}):
            progress.note("webgpu failed with the NHWC layout; trying preferredLayout NCHW")
            nchw = {**ep_options, "webgpu": {**ep_options.get("webgpu", {}), "preferredLayout": "NCHW"}}
            served = replace(contents, ep_options=nchw).manifest(thresholds=thresholds, license=license)
            retry = verify_on_grid(grid, staging, reference, thresholds, gpu=gpu, progress=progress, browser=browser, manifest=served)
            adopted = layout_verdict(result.checks, retry.checks)
            failed_before = [f"{c['variant']}/{c.get('output', '-')}: {c.get('detail', '')}" for c in result.checks if c["ep"] == "webgpu" and c["status"] == "failed"]
            steps.append({
                "name": "layout",
                "changed": adopted is not None,
                "records": [{"what": adopted or "webgpu preferredLayout NCHW: fails as much; kept NHWC", "nhwc_failures": failed_before}],
            })
            if adopted:
                result, ep_options = retry, nchw
    policy_failed, why = exit_policy(result, grid)
    if why:
        progress.note(why)
    checks, report, outputs = list(result.checks), result.report, dict(result.outputs)
    settled = replace(contents, ep_options=ep_options).manifest(thresholds=thresholds, license=license)
    for engine in engines:
        if engine == "chromium":
            continue
        progress.note(f"browser checks in {engine}")
        # placement and kernel times are Chromium's profile pass; another engine's runs are checked and timed
        started = time.monotonic()
        found = verify_in_browser(staging, reference, thresholds, gpu=gpu, progress=progress, manifest=settled, engine=engine, profile=False)
        checks += found.checks
        found.report["seconds"] = round(time.monotonic() - started, 1)  # what the engine adds to the build
        report = {**(report or {}), "engines": {**(report or {}).get("engines", {}), engine: found.report}}
        outputs.update({f"{label} @{engine}": kept for label, kept in found.outputs.items()})
    return BrowserOutcome(checks, report, ep_options, steps, policy_failed=policy_failed, outputs=outputs)


def browser_skipped(manifest: Manifest) -> BrowserOutcome:
    """--no-browser: every run the browser checks would make, recorded as skipped."""
    return BrowserOutcome(skipped_runs(plan_runs(manifest), "--no-browser"))


def run(artefacts: Artefacts, context: StageContext) -> dict:
    contents, recipe, options = package_contents(artefacts), recipe_with_kinds(artefacts), context.options
    if not options.browser:
        return {"browser": browser_skipped(contents.manifest())}
    return {"browser": browser_verify(context.staging, contents, artefacts["thresholds"], recipe.license, artefacts["reference"], options.gpu, context.progress,
                                      options.grid, build_engines(options.engines, recipe.verify_engines))}


STAGE = Stage(
    "browser_verify", run, settings=("browser", "engines", "options.browser", "options.gpu", "options.engines", "recipe.verify_engines"),
    reads=("recipe", "outputs", "contents", "kernels", "files", "thresholds", "reference"), makes=("browser",),
    code=("pipeline.verify.engines.browser", "pipeline.web_template"),  # the page's code and the loader it serves
    libraries=("playwright", "selenium"),
)
