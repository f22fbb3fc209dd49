"""The package's contents as far as the stages a stage reads have made them, and the recipe as the
checks read it.

Each stage makes its own part (models: the model files and the manifest's first sections; the
WebGPU-kernel stage: the webgpu EP options it settled on; files: the sample, the runtime, the
loader; the browser: the EP options its checks settled on) and no stage changes another's: a stage
that needs the whole so far assembles it here from the parts it declares.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.assets.package import PackageContents, PackageFile, RuntimeFiles, SampleFile
from pipeline.recipe import Recipe
from pipeline.stage_table import Artefacts


@dataclass(frozen=True)
class PackageFiles:
    """What the files stage wrote besides the models."""

    sample: SampleFile
    runtime: RuntimeFiles
    plain: tuple[PackageFile, ...]  # the loader's files and the demo page


def package_contents(artefacts: Artefacts) -> PackageContents:
    contents: PackageContents = artefacts["contents"]
    if "kernels" in artefacts and artefacts["kernels"].ep_options:
        contents = replace(contents, ep_options={**contents.ep_options, "webgpu": artefacts["kernels"].ep_options})
    if "files" in artefacts:
        files: PackageFiles = artefacts["files"]
        contents = replace(contents, sample=files.sample, runtime=files.runtime, plain=files.plain)
    if "browser" in artefacts and artefacts["browser"].ep_options is not None:
        contents = replace(contents, ep_options=artefacts["browser"].ep_options)
    return contents


def recipe_with_kinds(artefacts: Artefacts) -> Recipe:
    """The recipe as the checks read it: its outputs with the kinds the graph shows where it
    declares none (the samples stage's `outputs`; the runner's recipe itself stays as loaded)."""
    return replace(artefacts["recipe"], outputs=artefacts["outputs"])
