"""The judge stage: the verdict from every check, the loader's choice, refused EPs out of the
chains: the final manifest."""

from __future__ import annotations

from dataclasses import replace

from pipeline.manifest import Manifest, Verification, adapter_runs, chains_without_refused_eps, describe_run, in_engine, measurements_from, package_verdict, refused, refused_eps, run_sort_key, runs_from_checks
from pipeline.report.record import Refusal
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import package_contents, recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.engines.browser.run_plan import plan_runs
from pipeline.verify.judgement.checks import contradicted_kernel_errors
from pipeline.web.select import default_select


def verification(checks: list[dict]) -> Verification:
    """manifest `verification`: the verdict and one run per (stage, bundle, EP, variant)."""
    ran = [c for c in checks if c["status"] in ("passed", "failed")]
    passed = bool(ran) and all(c["status"] == "passed" for c in ran)
    browser_ran = any(c["stage"] == "browser" and c["status"] in ("passed", "failed") for c in checks)
    runs = sorted((run for stage in ("browser", "host", "webgpu-kernels") for run in runs_from_checks(checks, stage)), key=run_sort_key)
    adapters = adapter_runs(checks)
    return {"browser": browser_ran, "passed": passed, "runs": runs, **({"adapters": adapters} if adapters else {})}


def refused_pairs(manifest: Manifest, engines: tuple[str, ...] = ()) -> list[Refusal] | None:
    """Each (bundle, EP, variant) the package lists that the refusal rule turns away, and why; and
    each one another of `engines` refuses where Chromium does not (with its `engine`)."""
    refusals: list[Refusal] = []
    for platform_run in plan_runs(manifest):
        triple = (platform_run.bundle, platform_run.ep, platform_run.variant)
        run = refused(manifest, *triple)
        if run is not None:
            refusals.append({"bundle": triple[0], "ep": triple[1], "variant": triple[2], "by": describe_run(run)})
            continue
        for engine in engines:
            run = refused(in_engine(manifest, engine), *triple) if engine != "chromium" else None
            if run is not None:
                refusals.append({"bundle": triple[0], "ep": triple[1], "variant": triple[2], "engine": engine, "by": describe_run(run)})
    return refusals or None


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, made, browser, kernels = recipe_with_kinds(artefacts), artefacts["made"], artefacts["browser"], artefacts["kernels"]
    contents = package_contents(artefacts)
    checks = artefacts["host_checks"] + contradicted_kernel_errors(kernels.checks, browser.checks) + browser.checks
    found = verification(checks)
    if recipe.verify_require:
        found["require"] = list(recipe.verify_require)
    if recipe.verify_engines:
        found["requireEngines"] = list(recipe.verify_engines)
    measurements = measurements_from(browser.report)
    select, why = default_select(recipe.loader_select, [m["steadyMs"] for m in measurements])
    contents = replace(contents, loader={**contents.loader, "select": select})
    kept = next((v.kept_fp32 for v in made.variants if v.name == "fp16" and v.kept_fp32), None)
    final = dict(thresholds=artefacts["thresholds"], measurements=measurements, license=recipe.license, fp16={"keptFp32": kept} if kept else None)
    judged = contents.manifest(verification=found, **final)  # the runs decide; `passed` follows
    refusals = refused_pairs(judged, tuple(sorted({c["engine"] for c in browser.checks if c.get("engine")})))
    eps_refused = refused_eps(judged)
    if eps_refused:  # an EP refused leaves the chains that keep another (the loader loads a smaller bundle)
        found["refusedEps"] = eps_refused
        contents = replace(contents, chains=chains_without_refused_eps(judged))
        judged = contents.manifest(verification=found, **final)
    passed, verdict = package_verdict(judged)  # [verify] engines too: verification.requireEngines
    if browser.policy_failed:  # --browser endpoints ended in error beyond what the policy allows
        passed = False
        verdict.append("remote browsers: endpoints ended in error beyond the exit policy (docs/remote.md)")
    manifest = contents.manifest(verification={**found, "passed": passed}, **final)
    return {"checks": checks, "manifest": manifest, "verdict": {"passed": passed, "verdict": verdict, "refused": refusals, "loader": {"select": select, "why": why}}}


STAGE = Stage(
    "judge", run, settings=("recipe.verify_require", "recipe.verify_engines", "recipe.loader_select", "recipe.license"),
    reads=("recipe", "outputs", "contents", "kernels", "files", "made", "browser", "host_checks", "thresholds"), makes=("checks", "manifest", "verdict"),
    code=("pipeline/manifest.schema.json",),  # the manifest is validated against it
)
