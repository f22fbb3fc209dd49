"""The models stage: each variant's model written into the staging folder (chunked where large),
and the package's first sections (name, chains, loader settings, the model files)."""

from __future__ import annotations

from dataclasses import replace

from pipeline.assets.package import start_package, write_models
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import recipe_with_kinds
from pipeline.stages.context import StageContext


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, made = recipe_with_kinds(artefacts), artefacts["made"]
    models = write_models(context.staging, recipe, made.variants, made.reference, artefacts["feeds"], context.progress)
    return {"models": models, "contents": replace(start_package(recipe), models=models, ep_options=models.ep_options)}


STAGE = Stage("models", run, settings=("recipe.chunk_mib", "recipe.max_file_mib", "recipe.description", "recipe.chains", "recipe.watchdog_ms", "recipe.prewarm", "recipe.wasm_variant"),
              reads=("recipe", "outputs", "made", "feeds"), makes=("models", "contents"), libraries=("onnx", "brotli"))
