"""The default-load stage: the package as an app loads it. After the verdict, a page imports the
shipped loader and calls `load()` with nothing but its base URL, on the final manifest (refusals,
narrowed chains, `loader.select`), in each engine of `--engines` and the recipe's `[verify] engines`,
and for each platform chain; it runs the sample, judges the outputs and records the engine's peak
memory. A chain whose default load fails is narrowed where a narrower chain passes; else the
package fails. It warns where the apple-mobile load peaks over `[verify] apple_mobile_memory_mb`.
It makes the judgement the package is written with (`loaded`: the checks, the manifest and the
verdict with the default load's part)."""

from __future__ import annotations

from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.browser_verify import build_engines
from pipeline.stages.context import StageContext
from pipeline.verify.engines.browser.default_load import default_load_stage


def run(artefacts: Artefacts, context: StageContext) -> dict:
    options = context.options
    remote_only = bool(options.grid and options.grid.endpoints)
    return {"loaded": default_load_stage(context.staging, artefacts["manifest"], artefacts["checks"], artefacts["verdict"], artefacts["reference"],
                                         enabled=options.browser, gpu=options.gpu, remote_only=remote_only,
                                         engines=build_engines(options.engines, artefacts["recipe"].verify_engines),
                                         apple_mobile_memory_mb=artefacts["recipe"].verify_apple_mobile_memory_mb)}


STAGE = Stage(
    "default_load", run, settings=("browser", "engines", "options.browser", "options.gpu", "options.engines", "recipe.verify_engines", "recipe.verify_apple_mobile_memory_mb"),
    reads=("recipe", "manifest", "checks", "verdict", "reference"), makes=("loaded",),
    code=("pipeline.verify.engines.browser", "pipeline.web_template"),  # the page's code and the loader it loads
    libraries=("playwright", "selenium"),
)
