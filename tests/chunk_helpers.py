"""A model big enough to be chunked at a tiny `[assets] chunk_mib`, cheap enough for SwiftShader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx

# 0.25 MiB chunks: the fp32 weights (about 0.66 MB) make 3 chunks, the fp16 and fp16w ones 2.
CHUNK_MIB = 0.25
VARIANTS = ["fp16", "fp16w", "fp32"]  # the packages tests/conftest.py builds


def chunk_test_model() -> onnx.ModelProto:
    """x[1,256] -> MatMul 256x512 -> Relu -> MatMul 512x64 (+ biases) -> y[1,64], random weights."""
    rng = np.random.default_rng(7)
    w0 = rng.normal(0, 1 / 16, (256, 512)).astype(np.float32)
    b0 = rng.normal(0, 0.1, (512,)).astype(np.float32)
    w1 = rng.normal(0, 1 / 22, (512, 64)).astype(np.float32)
    b1 = rng.normal(0, 0.1, (64,)).astype(np.float32)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w0"], ["m0"], name="mm0"),
            onnx.helper.make_node("Add", ["m0", "b0"], ["a0"], name="add0"),
            onnx.helper.make_node("Relu", ["a0"], ["r0"], name="relu0"),
            onnx.helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="mm1"),
            onnx.helper.make_node("Add", ["m1", "b1"], ["y"], name="add1"),
        ],
        "chunky",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 256])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
        [onnx.numpy_helper.from_array(a, n) for a, n in ((w0, "w0"), (b0, "b0"), (w1, "w1"), (b1, "b1"))],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_recipe(folder: Path, name: str, chunk_mib: float | None, variants: list[str] | None = None) -> Path:
    """The model and a recipe for it in `folder`; `chunk_mib` and `variants` None leave the defaults."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(chunk_test_model(), str(folder / "chunky.onnx"))
    assets = f"\n[assets]\nchunk_mib = {chunk_mib}\n" if chunk_mib is not None else ""
    listed = f"variants = {json.dumps(variants)}\n" if variants else ""  # a JSON list of strings is TOML
    recipe = folder / f"{name}.toml"
    recipe.write_text(f'name = "{name}"\n{listed}\n[source]\nuri = "chunky.onnx"\n{assets}')
    return recipe
