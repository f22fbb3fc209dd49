"""The samples stage: the inputs every check runs on (the recipe's files or patterns, --inputs,
--input shapes; a generated sample on which fp32 decides something where an output decides), and
the outputs as the checks read them (the kinds the graph shows where the recipe declares none)."""

from __future__ import annotations

import copy
from dataclasses import replace

from pipeline.assets.samples import decisive_feeds
from pipeline.graph.output_kinds import with_graph_kinds
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.context import StageContext


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe = artefacts["recipe"]
    judged = replace(recipe, outputs=copy.deepcopy(recipe.outputs))  # the runner's recipe stays as loaded
    with_graph_kinds(artefacts["model"], judged)  # outputs the recipe leaves undeclared: what the graph shows of them
    sample = decisive_feeds(artefacts["model"], judged, context.options.inputs_npz)
    return {"feeds": sample.feeds, "sample_step": sample.step, "outputs": judged.outputs}


STAGE = Stage("samples", run, settings=("recipe.inputs", "recipe.seed", "recipe.outputs", "options.inputs_npz", "options.input_shapes"),
              reads=("recipe", "model"), makes=("feeds", "sample_step", "outputs"), libraries=("numpy", "onnxruntime"))
