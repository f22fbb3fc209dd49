"""The fetch stage: the model file this build uses (--source or the recipe's), checked against
every published fact and pinned in the lock. Keyed by the bytes it yields alone: how they were
found (path, URL, registry) changes nothing below it."""

from __future__ import annotations

from pathlib import Path

from pipeline.recipe import Recipe
from pipeline.reuse import source_hashes
from pipeline.source import SourceRequest, fetch_source
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.context import BuildOptions, StageContext
from pipeline.urls import mask_url


def source_request(recipe: Recipe, options: BuildOptions) -> SourceRequest:
    """The file this build uses (--source or the recipe's) and the published facts to check it by."""
    return SourceRequest(
        recipe_name=recipe.name,
        rebuild=f"pack build {mask_url(options.target)}",
        uri=options.source or recipe.source,
        published_uri=recipe.source,
        published_sha256=recipe.source_sha256,
        published_size=recipe.source_size,
        published_opset=recipe.source_opset,
        published_inputs=tuple(recipe.inputs),
        given_sha256=options.source_sha256,
        given_data_sha256=options.source_data_sha256,
        published_data_sha256=recipe.source_data_sha256,
        base_dir=Path.cwd() if options.source else recipe.base_dir,
    )


def run(artefacts: Artefacts, context: StageContext) -> dict:
    return {"fetched": fetch_source(source_request(artefacts["recipe"], context.options), context.locks.source, context.progress)}


def source_files(artefacts: Artefacts) -> dict[str, str]:
    fetched = artefacts["fetched"]
    return source_hashes(fetched.path, fetched.sha256)


STAGE = Stage("fetch", run, reads=("recipe",), makes=("fetched",), content=source_files)
