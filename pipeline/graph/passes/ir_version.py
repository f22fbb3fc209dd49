"""Lower a model's IR version to what onnxruntime-web reads.

onnx 1.23 writes IR version 14 by default; onnxruntime-web 1.30 refuses it ("Unsupported model IR
version: 14") although nothing in a model with older opsets needs it. The IR version is lowered to
the newest one the runtime reads, unless the model's opsets need a newer one: such a model is left
alone, and the browser check then reports it.
"""

from __future__ import annotations

import onnx
from onnx import helper

from pipeline.graph.passes.base import PassResult
from pipeline.graph.passes.util import copy_model

# The newest IR version onnxruntime-web 1.30 loads (its onnxruntime core is built against onnx 1.21).
MAX_RUNTIME_IR_VERSION = 13


class IrVersionCap:
    name = "ir_version_cap"

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        if model.ir_version <= MAX_RUNTIME_IR_VERSION:
            return PassResult(model, False)
        needed = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
        target = max(needed, min(model.ir_version, MAX_RUNTIME_IR_VERSION))
        if target >= model.ir_version:
            return PassResult(model, False)
        capped = copy_model(model)
        capped.ir_version = target
        return PassResult(capped, True, [{"what": f"IR version {model.ir_version} -> {target} (onnxruntime-web reads up to {MAX_RUNTIME_IR_VERSION})"}])


ir_version_cap = IrVersionCap()
