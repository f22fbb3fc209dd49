"""The repair stage: the source model loaded and repaired (the repairs detection asks for and those
the recipe names, then the IR cap of the recipe's runtime). Kept whole under its key: a rebuild
reads the repaired model back instead of repairing again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Mapping

import onnx

from pipeline.errors import PackError
from pipeline.graph import repairs
from pipeline.graph.model_io import load_model, model_bytes
from pipeline.graph.passes.base import PassSettings
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.runtime import max_ir_version, recipe_runtime
from pipeline.stage_table import Artefacts, Stage, StageCache
from pipeline.stages.context import StageContext

# protobuf cannot hold a model over 2 GB in one message: such a model is repaired on every build
_KEPT_MODEL_LIMIT = 1_900_000_000


def repair_settings(recipe: Recipe, progress: Progress | None = None) -> PassSettings:
    """What the repairs depend on: the recipe's runtime and the IR versions that release loads."""
    try:
        runtime = recipe_runtime(recipe.runtime_version, recipe.runtime_path, progress)
        return PassSettings(runtime_version=runtime.version, max_ir_version=max_ir_version(runtime, progress))
    except PackError as error:
        raise PackError(f"{recipe.path or 'recipe'}: key 'runtime.version': {error}") from None


def repair(model: onnx.ModelProto, recipe: Recipe, settings: PassSettings | None = None) -> tuple[onnx.ModelProto, list[dict]]:
    """The repairs detection asks for (unless `repairs.auto = false`) and those the recipe names,
    in run order, then the IR version cap for the recipe's runtime."""
    where = recipe.path or "recipe"
    known = repairs.names()
    for name in recipe.repairs:
        if name not in known:
            raise PackError(f"{where}: key 'repairs.passes': unknown repair '{name}'; known: {', '.join(sorted(known))}")
    names = repairs.auto_repairs(model) if recipe.repairs_auto else []
    return repairs.run_passes(model, [*names, *recipe.repairs], settings or repair_settings(recipe))


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, fetched = artefacts["recipe"], artefacts["fetched"]
    context.progress.note(f"loading and repairing {fetched.path.name}")
    model = load_model(fetched.path)
    source_sha = hashlib.sha256(model_bytes(model)).hexdigest()
    settings = repair_settings(recipe, context.progress)
    model, steps = repair(model, recipe, settings)
    return {"model": model, "source_sha": source_sha, "pass_settings": settings, "repair_steps": steps}


def keep(made: Mapping[str, Any], folder: Path) -> bool:
    """The repaired model and what the repairs recorded (a model over protobuf's 2 GB is not kept)."""
    model = made["model"]
    if model.ByteSize() > _KEPT_MODEL_LIMIT:
        return False
    (folder / "model.onnx").write_bytes(model_bytes(model))
    facts = {"source_sha": made["source_sha"], "pass_settings": asdict(made["pass_settings"]), "repair_steps": made["repair_steps"]}
    (folder / "repair.json").write_text(json.dumps(facts, sort_keys=True))
    return True


def read(folder: Path) -> dict:
    facts = json.loads((folder / "repair.json").read_text())
    model = onnx.load_from_string((folder / "model.onnx").read_bytes())
    return {"model": model, "source_sha": facts["source_sha"], "pass_settings": PassSettings(**facts["pass_settings"]), "repair_steps": facts["repair_steps"]}


STAGE = Stage(
    "repair", run,
    settings=("recipe.repairs_auto", "recipe.repairs", "recipe.runtime_version", "runtime"),
    reads=("recipe", "fetched"), makes=("model", "source_sha", "pass_settings", "repair_steps"),
    code=("pipeline.graph",),  # the repairs are found by discovery, not imported by name
    libraries=("onnx",), cache=StageCache(keep, read),
)
