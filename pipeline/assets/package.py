"""Assemble a package folder: model variants, sample, runtime files, and the manifest describing them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from pipeline.assets.files import PackageFile, add_hashed_file
from pipeline.assets.samples import declared_shape, sample_bytes, tensor_dtype
from pipeline.graph.hazards import preferred_layout
from pipeline.graph.model_io import model_bytes
from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.runtime import recipe_runtime


def io_entries(model: onnx.ModelProto, values: dict[str, np.ndarray] | None, recipe: Recipe, outputs: bool) -> list[dict]:
    initializers = {t.name for t in model.graph.initializer}
    infos = model.graph.output if outputs else [i for i in model.graph.input if i.name not in initializers]
    entries = []
    for info in infos:
        entry = {"name": info.name, "shape": declared_shape(info), "dtype": tensor_dtype(info)}
        if values is not None and info.name in values:
            entry["sampleShape"] = list(values[info.name].shape)
        if outputs:
            spec = recipe.outputs.get(info.name)
            entry["kind"] = spec.kind if spec else "tensor"
        entries.append(entry)
    return entries


def _variant_for(variants: list[Variant], recipe: Recipe) -> dict[str, list[str]]:
    names = [v.name for v in variants]
    eps = sorted({ep for chain in recipe.chains.values() for ep in chain}, key=["webgpu", "wasm"].index)
    table = {}
    for ep in eps:
        if ep == "webgpu":
            order = [n for n in ("fp16", "fp32", "quantized") if n in names]
        else:
            # wasm gets the variant the recipe marks for it; others only when that one is absent.
            marked = [recipe.wasm_variant] if recipe.wasm_variant in names else []
            order = marked or [n for n in ("fp32", "quantized", "fp16") if n in names][:1]
        table[ep] = order
    return table


def write_package(staging: Path, recipe: Recipe, variants: list[Variant], feeds: dict[str, np.ndarray], reference_model: onnx.ModelProto, progress: Progress) -> tuple[dict, dict[str, Path]]:
    """Model files, sample and runtime files into `staging`, and the manifest that describes them.
    Returns (manifest, model path per variant); the build adds the outputs' sample shapes once the
    reference has run on the shipped fp32 file."""
    files: list[PackageFile] = []
    model_paths: dict[str, Path] = {}
    variant_entries = {}
    for variant in variants:
        entry = add_hashed_file(staging, f"model.{variant.name}", ".onnx", model_bytes(variant.model), progress)
        files.append(entry)
        model_paths[variant.name] = staging / entry.path
        variant_entries[variant.name] = {"precision": variant.precision, "model": entry.path, "requires": variant.requires}
    data, tensors = sample_bytes(feeds)
    sample = add_hashed_file(staging, "sample", ".bin", data, progress)
    files.append(sample)

    runtime = recipe_runtime(recipe.runtime_version, recipe.runtime_path, progress)
    needed = {"webgpu" if "webgpu" in chain else "wasm" for chain in recipe.chains.values()}
    bundles = {}
    for key in sorted(needed):
        bundle = runtime.bundles[key]
        module = add_hashed_file(staging, f"ort/{bundle.module.name.removesuffix('.mjs')}", ".mjs", bundle.module.read_bytes(), progress)
        wasm = add_hashed_file(staging, f"ort/{bundle.wasm.name.removesuffix('.wasm')}", ".wasm", bundle.wasm.read_bytes(), progress)
        files += [module, wasm]
        bundles[key] = {"entry": bundle.entry, "module": module.path, "wasm": wasm.path}

    layout = preferred_layout(reference_model)
    manifest = {
        "schema": 1,
        "name": recipe.name,
        "description": recipe.description,
        "files": {f.path: f.manifest_entry() for f in sorted(files, key=lambda f: f.path)},
        "variants": variant_entries,
        "variantFor": _variant_for(variants, recipe),
        "inputs": io_entries(reference_model, feeds, recipe, outputs=False),
        "outputs": io_entries(reference_model, None, recipe, outputs=True),
        "sample": {"file": sample.path, "tensors": tensors},
        "runtime": {"package": "onnxruntime-web", "version": runtime.version, "bundles": bundles},
        "executionProviders": recipe.chains,
        "epOptions": {"webgpu": {"preferredLayout": layout}} if layout else {},
        "loader": {"watchdogMs": recipe.watchdog_ms, "prewarm": recipe.prewarm},
        "verification": {"browser": False, "passed": False},
    }
    return manifest, model_paths
