"""The host stage: the fp32 reference outputs on onnxruntime CPU, and every variant checked
against them (a quantized source with no float twin against itself: NaN and shape)."""

from __future__ import annotations

from pipeline.assets.package import io_entries
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.judgement.checks import self_reference_checks
from pipeline.verify.stages import host_checks, reference_outputs


def run(artefacts: Artefacts, context: StageContext) -> dict:
    models, made, feeds, recipe = artefacts["models"], artefacts["made"], artefacts["feeds"], recipe_with_kinds(artefacts)
    reference = reference_outputs(made.reference, made.variants, models.model_paths, feeds, artefacts["fetched"].path)
    checks = host_checks([v for v in made.variants if not v.self_reference], reference, feeds, recipe, context.progress, models.check_paths)
    declared = io_entries(made.reference, reference, recipe, outputs=True)
    for variant in made.variants:
        if variant.self_reference:
            checks.extend(self_reference_checks(variant, reference, declared))
    return {"reference": reference, "host_checks": checks}


STAGE = Stage("host_verify", run, settings=("recipe.outputs",), reads=("recipe", "outputs", "fetched", "models", "made", "feeds"), makes=("reference", "host_checks"),
              libraries=("onnxruntime", "numpy"))
