"""Lower a model's IR version to what the package's onnxruntime-web reads.

onnx 1.23 writes IR version 14 by default; onnxruntime-web 1.30 refuses it ("Unsupported model IR
version: 14") although nothing in a model with older opsets needs it. The IR version is lowered to
the newest one the recipe's runtime reads (`PassSettings.max_ir_version`, measured from the
release by pipeline.runtime.max_ir_version), unless the model's
opsets need a newer one: such a model is left alone, and the browser check then reports it.
Runs last in every build, so whatever ran before it, the shipped model is one the runtime reads.
"""

from __future__ import annotations

import onnx
from onnx import helper

from pipeline.graph.passes.base import PassResult, PassSettings, Repair
from pipeline.graph.passes.util import copy_model


def rewrite(model: onnx.ModelProto, settings: PassSettings) -> PassResult:
    ceiling = settings.max_ir_version
    notes: list[dict] = []
    if ceiling is None or model.ir_version <= ceiling:
        return PassResult(model, False, notes)
    needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    target = max(needed, min(model.ir_version, ceiling))
    if target >= model.ir_version:
        return PassResult(model, False, notes)
    capped = copy_model(model)
    capped.ir_version = target
    what = f"IR version {model.ir_version} -> {target} (onnxruntime-web {settings.runtime_version} reads up to {ceiling})"
    return PassResult(capped, True, [{"what": what}, *notes])


ir_version_cap = Repair(name="ir_version_cap", order=100, stage="last", rewrite=rewrite)
