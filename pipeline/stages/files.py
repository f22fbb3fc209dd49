"""The files stage: the sample, the runtime, the thresholds and the loader: the rest of what the
package lists."""

from __future__ import annotations

from dataclasses import replace

from pipeline.assets.package import plain_files, write_runtime, write_sample
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import PackageFiles, package_contents, recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.judgement.thresholds import threshold_table
from pipeline.web.render import render_loader


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, made, staging, progress = recipe_with_kinds(artefacts), artefacts["made"], context.staging, context.progress
    sample = write_sample(staging, recipe, made.reference, artefacts["feeds"], artefacts["reference"], progress)
    runtime = write_runtime(staging, recipe, progress)
    contents = replace(package_contents(artefacts), sample=sample, runtime=runtime)
    thresholds = threshold_table(made.variants, artefacts["reference"], recipe, artefacts["models"].variant_for)
    rendered = render_loader(staging, contents.manifest(license=recipe.license), sample_rate=recipe.sample_rate)
    return {"files": PackageFiles(sample, runtime, plain_files(staging, rendered)), "thresholds": thresholds}


STAGE = Stage(
    "files", run,
    settings=("recipe.license", "recipe.max_file_mib", "recipe.runtime_version", "recipe.runtime_path", "runtime"),
    reads=("recipe", "outputs", "contents", "kernels", "made", "feeds", "reference", "models"), makes=("files", "thresholds"),
    code=("pipeline.web_template",),  # the loader's files, rendered from package data
    libraries=("brotli", "jinja2"),
)
