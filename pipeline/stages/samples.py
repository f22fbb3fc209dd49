"""The samples stage: the inputs every check runs on (the recipe's files or patterns, --inputs,
--input shapes)."""

from __future__ import annotations

from pipeline.assets.samples import make_feeds
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.context import StageContext


def run(artefacts: Artefacts, context: StageContext) -> dict:
    sample = make_feeds(artefacts["model"], artefacts["recipe"], context.options.inputs_npz)
    return {"feeds": sample.feeds, "sample_step": sample.step}


STAGE = Stage("samples", run, settings=("recipe.inputs", "recipe.seed", "options.inputs_npz", "options.input_shapes"),
              reads=("recipe", "model"), makes=("feeds", "sample_step"), libraries=("numpy",))
