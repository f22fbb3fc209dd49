"""The build's stages, one module each, in run order: fetch, repair, samples, convert, models,
host_verify, webgpu_kernels, files, browser_verify, judge, default_load, write.

Each module exports its `STAGE` (pipeline/stage_table.py): its run function, the settings it reads
as data, the artefacts it reads and makes, the code and libraries beyond its own module that compute
it, and how it is kept when it is. pipeline/build.py runs `STAGES` and keeps the options, the
runner and reuse. `ARTEFACTS` types the ledger: what each artefact is (the runner checks every
artefact a stage makes against it) and which ones the runner puts there itself.
"""

from __future__ import annotations

from pipeline.stages import browser_verify, convert, default_load, fetch, files, host_verify, judge, models, repair, samples, webgpu_kernels, write

STAGES = tuple(module.STAGE for module in (fetch, repair, samples, convert, models, host_verify, webgpu_kernels, files, browser_verify, judge, default_load, write))

# artefact -> "module:type" it is (what the runner checks each made artefact against)
ARTEFACTS: dict[str, str] = {
    "recipe": "pipeline.recipe:Recipe",  # the runner's: the recipe as loaded
    "timings": "builtins:dict",  # the runner's: each stage's wall time so far
    "fetched": "pipeline.source:ResolvedSource",
    "model": "onnx:ModelProto",
    "source_sha": "builtins:str",
    "pass_settings": "pipeline.graph.passes.base:PassSettings",
    "repair_steps": "builtins:list",
    "feeds": "builtins:dict",
    "sample_step": "builtins:dict",
    "outputs": "builtins:dict",
    "made": "pipeline.precision.variants:VariantSet",
    "fp16_lock": "builtins:dict",
    "models": "pipeline.assets.package:ModelFiles",
    "contents": "pipeline.assets.package:PackageContents",
    "reference": "builtins:dict",
    "host_checks": "builtins:list",
    "kernels": "pipeline.verify.stages:KernelOutcome",
    "files": "pipeline.stages.contents:PackageFiles",
    "thresholds": "builtins:dict",
    "browser": "pipeline.stages.browser_verify:BrowserOutcome",
    "checks": "builtins:list",
    "manifest": "builtins:dict",
    "verdict": "builtins:dict",
    "loaded": "builtins:dict",
    "report": "builtins:dict",
}
RUNNER_ARTEFACTS = ("recipe", "timings")
