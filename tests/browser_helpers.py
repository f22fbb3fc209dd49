"""Test models and packages for the browser checks.

`write_package` lays a package out as docs/ARCHITECTURE.md describes (content-hashed files, brotli
copies where they pay, manifest.json, the runtime bundles the chains need) so the harness can be
tested on its own; `reference_of` computes the fp32 host reference the build would pass in.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import brotli
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.assets.files import describe_file
from pipeline.manifest import make_manifest, write_manifest
from pipeline.web.render import render_loader
from pipeline.runtime import resolve_runtime
from pipeline.verify.engines.host import reference_outputs
from pipeline.verify.judgement.thresholds import BROWSER_EPS, check_bounds

RUNTIME_VERSION = "1.30.0"
# onnx 1.23 writes IR version 14 by default; onnxruntime-web 1.30 reads up to 13.
IR_VERSION = 8
DESKTOP_ONLY = {"desktop": ["webgpu", "wasm"]}
ALL_PLATFORMS = {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"], "android": ["webgpu", "wasm"]}


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17, name: str = "g") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def negative_step_slice_model() -> onnx.ModelProto:
    """One Slice, x [1,1,1,31], steps -1 from -1 to INT64_MIN+1: 31 elements, reversed (JSEP gives 30)."""
    constants = [
        helper.make_tensor("starts", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("ends", TensorProto.INT64, [1], [-9223372036854775807]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [3]),
        helper.make_tensor("steps", TensorProto.INT64, [1], [-1]),
    ]
    return _model(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="reverse_slice")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 31])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, 31])],
        constants,
    )


def matmul_models(inner: int = 64, outer: int = 8, seed: int = 0) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(fp32, fp16) of y = tanh(x @ W) with fp32 I/O; the fp16 model computes in fp16 behind Casts."""
    weights = (np.random.default_rng(seed).standard_normal((inner, outer)) / np.sqrt(inner)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inner])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, outer])
    fp32 = _model(
        [helper.make_node("MatMul", ["x", "W"], ["m"], name="matmul"), helper.make_node("Tanh", ["m"], ["y"], name="tanh")],
        [x], [y], [numpy_helper.from_array(weights, "W")],
    )
    fp16 = _model(
        [
            helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16, name="cast_in"),
            helper.make_node("MatMul", ["x16", "W16"], ["m16"], name="matmul"),
            helper.make_node("Tanh", ["m16"], ["y16"], name="tanh"),
            helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT, name="cast_out"),
        ],
        [x], [y], [numpy_helper.from_array(weights.astype(np.float16), "W16")],
    )
    return fp32, fp16


def conv_model(in_channels: int = 9, seed: int = 0) -> onnx.ModelProto:
    """One 3x3 Conv, x [1, C, 8, 8] -> 16 channels. With C = 9, onnxruntime-web 1.30's native WebGPU
    EP computes it wrongly in its default NHWC layout (about 50 % of the range off on SwiftShader);
    with the EP option preferredLayout 'NCHW', and with C = 8, it is right."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((16, in_channels, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    return _model(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, in_channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )


def cpu_fallback_model() -> onnx.ModelProto:
    """Relu -> Det -> Neg: onnxruntime-web 1.30's WebGPU EP has no Det kernel, so Det runs on the CPU."""
    return _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Det", ["r"], ["d"], name="determinant"),
            helper.make_node("Neg", ["d"], ["y"], name="negate"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )


@dataclass
class Variant:
    model: onnx.ModelProto
    precision: str = "fp32"
    requires: list[str] = field(default_factory=list)
    widen: str | None = None  # manifest variants[name].widen (fp16w)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _add_file(root: Path, files: dict, stem: str, suffix: str, data: bytes, media_type: str, compress: bool) -> str:
    digest = _sha256(data)
    path = f"{stem}.{digest[:16]}{suffix}"
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_bytes(data)
    encodings = {}
    if compress:
        encoded = brotli.compress(data, quality=5)
        if len(encoded) < len(data):
            (root / f"{path}.br").write_bytes(encoded)
            encodings = {"br": {"path": f"{path}.br", "size": len(encoded)}}
    files[path] = {
        "sha256": digest, "integrity": "sha256-" + base64.b64encode(bytes.fromhex(digest)).decode(),
        "size": len(data), "mediaType": media_type, "encodings": encodings, "cache": "immutable",
    }
    return path


def _dtype_name(elem_type: int) -> str:
    return helper.tensor_dtype_to_np_dtype(elem_type).name


def write_package(
    root: Path,
    variants: dict[str, Variant],
    feeds: dict[str, np.ndarray],
    *,
    name: str = "test",
    chains: dict[str, list[str]] | None = None,
    variant_for: dict[str, list[str]] | None = None,
    kinds: dict[str, str] | None = None,
    ep_options: dict[str, dict] | None = None,
) -> Path:
    """A package folder in the ARCHITECTURE.md layout, with the loader rendered. Runtime files are copied from the npm cache
    (their 14-27 MB wasm is left unencoded to keep tests fast; small files get brotli copies)."""
    root.mkdir(parents=True, exist_ok=True)
    chains = chains or DESKTOP_ONLY
    variant_for = variant_for or {"webgpu": list(variants), "wasm": [v for v in variants if variants[v].precision == "fp32"]}
    files: dict[str, dict] = {}
    manifest_variants = {}
    for variant_name, variant in variants.items():
        path = _add_file(root, files, f"model.{variant_name}", ".onnx", variant.model.SerializeToString(), "application/octet-stream", True)
        manifest_variants[variant_name] = {"precision": variant.precision, "model": path, "requires": list(variant.requires)}
        if variant.widen:
            manifest_variants[variant_name]["widen"] = variant.widen

    sample_bytes = b""
    tensors = {}
    for input_name, array in feeds.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        tensors[input_name] = {"dtype": array.dtype.name, "dims": list(array.shape), "offset": len(sample_bytes), "length": len(data)}
        sample_bytes += data
    sample_path = _add_file(root, files, "sample", ".bin", sample_bytes, "application/octet-stream", True)

    runtime = resolve_runtime(RUNTIME_VERSION)
    bundles = {}
    for key in sorted({"webgpu" if "webgpu" in chain else "wasm" for chain in chains.values()}):
        bundle = runtime.bundles[key]
        module = _add_file(root, files, f"ort/{bundle.module.name.removesuffix('.mjs')}", ".mjs", bundle.module.read_bytes(), "text/javascript", True)
        wasm = _add_file(root, files, f"ort/{bundle.wasm.name.removesuffix('.wasm')}", ".wasm", bundle.wasm.read_bytes(), "application/wasm", False)
        bundles[key] = {"entry": bundle.entry, "module": module, "wasm": wasm}

    first = next(iter(variants.values())).model
    parts = dict(
        name=name,
        variants=manifest_variants,
        variant_for=variant_for,
        inputs=[{"name": i.name, "shape": [d.dim_value for d in i.type.tensor_type.shape.dim], "dtype": _dtype_name(i.type.tensor_type.elem_type)}
                for i in first.graph.input],
        outputs=[{"name": o.name, "shape": [d.dim_value for d in o.type.tensor_type.shape.dim], "dtype": _dtype_name(o.type.tensor_type.elem_type),
                  "kind": (kinds or {}).get(o.name, "tensor")} for o in first.graph.output],
        sample={"file": sample_path, "tensors": tensors, "outputs": {}},
        runtime={"package": "onnxruntime-web", "version": runtime.version, "bundles": bundles},
        execution_providers=chains,
        ep_options=ep_options or {},
        loader={"watchdogMs": 60000, "prewarm": False, "select": "chain"},
    )
    # the package's own loader.js: the harness verifies through it
    for plain in render_loader(root, make_manifest(files=files, **parts)):
        files[plain] = describe_file(root, plain).manifest_entry()
    write_manifest(root, make_manifest(files=files, **parts))
    return root


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


def reference_of(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp: Path) -> dict[str, np.ndarray]:
    """fp32 outputs on onnxruntime CPU (the lead's host reference, in a child process)."""
    return reference_outputs(save_model(model, tmp / "reference.onnx"), feeds)


def thresholds_for(package: Path, kinds: dict[str, str] | None = None) -> dict[str, dict[str, dict[str, dict]]]:
    """thresholds[ep][variant][output] as the build passes them: the default browser bounds per
    precision (fp16 widened on webgpu), no recipe overrides."""
    manifest = json.loads((package / "manifest.json").read_text())
    return {
        ep: {
            variant: {o["name"]: check_bounds((kinds or {}).get(o["name"], o.get("kind", "tensor")), spec["precision"], ep) for o in manifest["outputs"]}
            for variant, spec in manifest["variants"].items()
        }
        for ep in BROWSER_EPS
    }


def copy_package(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination
