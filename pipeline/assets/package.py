"""Assemble a package folder: model variants, sample, runtime files, and what the manifest says of them.

The build writes the files stage by stage into its staging folder (models before the host checks,
which run on the shipped bytes; the sample once the fp32 reference outputs exist) and collects
them in one `PackageContents`; the manifest is made from it once, at the end (pipeline/build.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.assets.chunks import chunk_bytes, write_chunked
from pipeline.assets.files import PackageFile, add_hashed_file, describe_file
from pipeline.manifest import LoaderSettings, Manifest, Measurement, Sample, Thresholds, Verification, VariantEntry, chain_bundle, make_manifest
from pipeline.assets.samples import declared_shape, sample_bytes, tensor_dtype
from pipeline.graph.hazards import preferred_layout
from pipeline.graph.model_io import model_bytes
from pipeline.precision.fp16w import widened_model_file
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


def variant_for(variants: list[Variant], recipe: Recipe) -> dict[str, list[str]]:
    """Per browser EP of the recipe's chains, the variants in preference order."""
    names = [v.name for v in variants]
    eps = sorted({ep for chain in recipe.chains.values() for ep in chain}, key=["webgpu", "wasm"].index)
    table = {}
    for ep in eps:
        if ep == "webgpu":
            # fp16w (fp32 kernels, half the bytes) before fp32: the default wherever fp16 is
            # refused or not run (no shader-f16), and the priors order it by speed (docs/loader.md)
            order = [n for n in ("fp16", "fp16w", "fp32", "quantized") if n in names]
        else:
            # wasm gets the variant the recipe marks for it; others only when that one is absent.
            marked = [recipe.wasm_variant] if recipe.wasm_variant in names else []
            order = marked or [n for n in ("fp32", "fp16w", "quantized", "fp16") if n in names][:1]
            if "fp16w" in names and order == ["fp32"]:
                order = ["fp16w", "fp32"]  # the same fp32 kernels, half the download; fp32 the fallback
        table[ep] = order
    return table


@dataclass
class PackageContents:
    """Every file written into the package so far and the manifest sections describing them."""

    name: str
    description: str | None
    chains: dict[str, list[str]]
    loader: LoaderSettings
    files: dict[str, PackageFile] = field(default_factory=dict)
    variants: dict[str, VariantEntry] = field(default_factory=dict)
    variant_for: dict[str, list[str]] = field(default_factory=dict)
    model_paths: dict[str, Path] = field(default_factory=dict)  # variant name -> shipped model file
    check_paths: dict[str, Path] = field(default_factory=dict)  # variant name -> what a session loads (fp16w: widened)
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    sample: Sample | None = None
    runtime: dict[str, Any] = field(default_factory=dict)
    ep_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, *files: PackageFile) -> None:
        for file in files:
            self.files[file.path] = file

    def manifest(
        self,
        *,
        thresholds: Thresholds | None = None,
        verification: Verification | None = None,
        measurements: list[Measurement] | None = None,
        license: str | None = None,
        fp16: dict[str, Any] | None = None,
    ) -> Manifest:
        return make_manifest(
            name=self.name,
            description=self.description,
            files={path: file.manifest_entry() for path, file in self.files.items()},
            variants=self.variants,
            variant_for=self.variant_for,
            inputs=self.inputs,
            outputs=self.outputs,
            sample=self.sample,  # type: ignore[arg-type]
            runtime=self.runtime,
            execution_providers=self.chains,
            ep_options=self.ep_options,
            loader=self.loader,
            thresholds=thresholds,
            verification=verification,
            measurements=measurements,
            license=license,
            fp16=fp16,
        )


def start_package(recipe: Recipe) -> PackageContents:
    return PackageContents(
        name=recipe.name,
        description=recipe.description,
        chains=recipe.chains,
        # "chain": the recipe's EP order; the loader helper's measured choice can switch it to "measured".
        loader={"watchdogMs": recipe.watchdog_ms, "prewarm": recipe.prewarm, "select": "chain"},
    )


def write_models(staging: Path, contents: PackageContents, recipe: Recipe, variants: list[Variant], reference_model: onnx.ModelProto, feeds: dict[str, np.ndarray], progress: Progress) -> None:
    """One content-hashed model file per variant (the repair passes capped its IR version for the
    runtime); a model over `[assets] chunk_mib` as its graph plus chunked weights (assets/chunks.py)."""
    limit = chunk_bytes(recipe.chunk_mib)
    for variant in variants:
        # fp16w too: its fp16 weights in chunks, widened by the loader chunk by chunk
        chunked = write_chunked(staging, f"model.{variant.name}", variant.model, limit, progress, widen=bool(variant.widen)) if variant.model.ByteSize() > limit else None
        if chunked is not None:
            contents.add(chunked.graph, *chunked.chunks)
            contents.model_paths[variant.name] = contents.check_paths[variant.name] = chunked.verify_path
            contents.variants[variant.name] = {"precision": variant.precision, "model": chunked.graph.path, "requires": variant.requires, "externalData": chunked.external}
            if variant.widen:
                contents.variants[variant.name]["widen"] = variant.widen
            continue
        entry = add_hashed_file(staging, f"model.{variant.name}", ".onnx", model_bytes(variant.model), progress)
        contents.add(entry)
        contents.model_paths[variant.name] = staging / entry.path
        contents.check_paths[variant.name] = widened_model_file(contents.model_paths[variant.name]) if variant.widen else contents.model_paths[variant.name]
        contents.variants[variant.name] = {"precision": variant.precision, "model": entry.path, "requires": variant.requires}
        if variant.widen:
            contents.variants[variant.name]["widen"] = variant.widen
    contents.variant_for = variant_for(variants, recipe)
    contents.inputs = io_entries(reference_model, feeds, recipe, outputs=False)
    contents.outputs = io_entries(reference_model, None, recipe, outputs=True)
    layout = preferred_layout(reference_model)
    contents.ep_options = {"webgpu": {"preferredLayout": layout}} if layout else {}


def write_sample(staging: Path, contents: PackageContents, recipe: Recipe, reference_model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: dict[str, np.ndarray], progress: Progress) -> None:
    """The sample file: inputs, then their fp32 reference outputs; and the outputs' sample shapes."""
    data, tensors, outputs = sample_bytes(feeds, reference)
    sample = add_hashed_file(staging, "sample", ".bin", data, progress)
    contents.add(sample)
    contents.sample = {"file": sample.path, "tensors": tensors, "outputs": outputs}
    contents.outputs = io_entries(reference_model, reference, recipe, outputs=True)


def write_runtime(staging: Path, contents: PackageContents, recipe: Recipe, progress: Progress) -> None:
    """The onnxruntime-web bundles the platform chains need (one per distinct chain bundle)."""
    runtime = recipe_runtime(recipe.runtime_version, recipe.runtime_path, progress)
    bundles = {}
    for key in sorted({chain_bundle(chain) for chain in recipe.chains.values()}):
        bundle = runtime.bundles[key]
        module = add_hashed_file(staging, f"ort/{bundle.module.name.removesuffix('.mjs')}", ".mjs", bundle.module.read_bytes(), progress)
        wasm = add_hashed_file(staging, f"ort/{bundle.wasm.name.removesuffix('.wasm')}", ".wasm", bundle.wasm.read_bytes(), progress)
        contents.add(module, wasm)
        bundles[key] = {"entry": bundle.entry, "module": module.path, "wasm": wasm.path}
        if bundle.glue is not None:  # releases up to 1.22: emscripten's glue module, imported apart
            glue = add_hashed_file(staging, f"ort/{bundle.glue.name.removesuffix('.mjs')}", ".mjs", bundle.glue.read_bytes(), progress)
            contents.add(glue)
            bundles[key]["glue"] = glue.path
    contents.runtime = {"package": "onnxruntime-web", "version": runtime.version, "bundles": bundles}


def add_plain_files(staging: Path, contents: PackageContents, paths: list[str]) -> None:
    """Files written without a hash in their name (loader files, demo page, report.json)."""
    contents.add(*(describe_file(staging, path) for path in paths))
