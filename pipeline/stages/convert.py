"""The convert stage: the variants a package ships (fp16 with the nodes it keeps in fp32, fp16w,
fp32, or a quantized/fp16 source as it is). The fp16 entry it finds for the lock is one of its
artefacts (`fp16_lock`); the build writes it, so a stored package answers the rebuild after it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from pipeline.errors import PackError
from pipeline.precision.detect import detect_precision
from pipeline.precision.kept_nodes import Fp16Context
from pipeline.precision.variants import make_variants
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.engines.host import run_model
from pipeline.verify.stages import fp16_evaluators, onnxruntime_refusal, reference_outputs


def fp16_context(model: onnx.ModelProto, feeds: dict[str, np.ndarray], recipe: Recipe, context: StageContext, source_path: Path) -> Fp16Context:
    """What the fp16 keep-in-fp32 search needs from the verify stage. The fp32 reference runs first
    when an fp16 variant will be made (it is cached, and bad input should stop the build before
    any fp16 work)."""
    reference: dict[str, dict[str, np.ndarray]] = {}
    if "fp16" in recipe.variants and detect_precision(model)[0] == "fp32":
        reference["outputs"] = reference_outputs(model, [], {}, feeds, source_path)

    def reference_now() -> dict[str, np.ndarray]:
        if not reference:
            reference["outputs"] = reference_outputs(model, [], {}, feeds, source_path)
        return reference["outputs"]

    def run_outputs(path: Path, run_feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        return run_model(path, run_feeds).outputs

    progress: Progress = context.progress
    return Fp16Context(feeds, run_outputs, fp16_evaluators(reference_now, feeds, recipe, model), context.locks.fp16, progress, onnxruntime_refusal(feeds))


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, model, source_path = recipe_with_kinds(artefacts), artefacts["model"], artefacts["fetched"].path
    context.progress.note(f"precision: {recipe.ships()} variants of {recipe.name}")
    fp16 = fp16_context(model, artefacts["feeds"], recipe, context, source_path)
    made = make_variants(model, recipe, artefacts["source_sha"], fp16, artefacts["pass_settings"])
    if recipe.source_precision and not context.options.source and made.precision != recipe.source_precision:
        raise PackError(f"{recipe.path}: key 'source.precision' says {recipe.source_precision}, but {source_path.name} is {made.precision} ({made.precision_reason}); fix the key")
    return {"made": made, "fp16_lock": fp16.found_lock_entry}


STAGE = Stage(
    "convert", run,
    settings=("recipe.variants", "recipe.variants_stated", "recipe.fp16_block_ops", "recipe.fp16_keep_nodes", "recipe.fp16_search",
              "recipe.fp16_search_trials", "recipe.fp16_search_seconds", "recipe.outputs", "fp16_lock", "mesa",
              "environment.PACK_WEBGPU_KERNELS", "environment.PACK_WEBGPU_KERNELS_MAX_GMAC", "environment.PACK_WEBGPU_KERNELS_TIMEOUT_S",
              "environment.PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S"),
    reads=("recipe", "outputs", "model", "feeds", "source_sha", "pass_settings", "fetched"), makes=("made", "fp16_lock"),
    code=("pipeline.graph",),  # the fp16 conversion's repairs are found by discovery
    libraries=("onnx", "onnxconverter-common", "onnxruntime", "onnxruntime-ep-webgpu", "numpy"),
)
