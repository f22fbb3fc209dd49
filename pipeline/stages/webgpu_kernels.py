"""The WebGPU-kernel stage: each variant on onnxruntime's WebGPU kernels on lavapipe (fp16
accumulation as browsers run it), node by node where a whole run is too heavy; the webgpu EP
options it settled on (the NCHW layout where NHWC fails)."""

from __future__ import annotations

from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import recipe_with_kinds
from pipeline.stages.context import StageContext
from pipeline.verify.stages import webgpu_kernel_stage


def run(artefacts: Artefacts, context: StageContext) -> dict:
    models = artefacts["models"]
    webgpu = artefacts["contents"].ep_options.get("webgpu", {})
    return {"kernels": webgpu_kernel_stage(artefacts["made"].variants, artefacts["reference"], artefacts["feeds"], recipe_with_kinds(artefacts), context.progress, models.check_paths, webgpu)}


STAGE = Stage(
    "webgpu_kernels", run,
    settings=("recipe.outputs", "mesa", "environment.PACK_WEBGPU_KERNELS", "environment.PACK_WEBGPU_KERNELS_MAX_GMAC",
              "environment.PACK_WEBGPU_KERNELS_TIMEOUT_S", "environment.PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S"),
    reads=("recipe", "outputs", "contents", "models", "made", "reference", "feeds"), makes=("kernels",),
    libraries=("onnxruntime", "onnxruntime-ep-webgpu", "numpy"),
)
