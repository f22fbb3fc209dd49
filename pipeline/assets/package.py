"""Assemble a package folder: model variants, sample, runtime files, and what the manifest says of them.

The build writes the files stage by stage into its staging folder (models before the host checks,
which run on the shipped bytes; the sample once the fp32 reference outputs exist). Each writer
returns what it wrote and what the manifest says of it (`ModelFiles`, `SampleFile`,
`RuntimeFiles`, the plain files' entries); the build gathers them in a `PackageContents` (never
changed in place: `dataclasses.replace` makes the next one), whose `manifest()` is the manifest's
one builder for a package (pipeline/build.py writes it once, at the end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from pipeline.assets.chunks import MIB, chunk_bytes, write_chunked, write_split
from pipeline.assets.decoder import PACKAGE as DECODER_PACKAGE, VERSION as DECODER_VERSION, decoder_files
from pipeline.assets.files import PackageFile, add_hashed_file, add_hashed_files, describe_file
from pipeline.errors import PackError, warn
from pipeline.manifest import LoaderSettings, Manifest, Measurement, Sample, SplitFile, Thresholds, Verification, VariantEntry, chain_bundle, make_manifest
from pipeline.assets.samples import declared_shape, tensor_dtype
from pipeline.graph.hazards import preferred_layout
from pipeline.graph.model_io import model_bytes
from pipeline.graph.passes.stale_shapes import shapes_disagree
from pipeline.precision.fp16w import widened_model_file
from pipeline.precision.variants import Variant
from pipeline.progress import Progress
from pipeline.recipe import DEFAULT_MAX_FILE_MIB, Recipe
from pipeline.runtime import recipe_runtime
from pipeline.sample_file import sample_bytes


def io_entries(model: onnx.ModelProto, values: dict[str, np.ndarray] | None, recipe: Recipe, outputs: bool) -> list[dict]:
    initializers = {t.name for t in model.graph.initializer}
    infos = model.graph.output if outputs else [i for i in model.graph.input if i.name not in initializers]
    entries = []
    for info in infos:
        entry = {"name": info.name, "shape": declared_shape(info), "dtype": tensor_dtype(info)}
        if values is not None and info.name in values:
            entry["sampleShape"] = list(values[info.name].shape)
            if shapes_disagree(entry["shape"], entry["sampleShape"]):
                entry["shape"] = entry["sampleShape"]  # as every variant gives it: stale_declarations says why
        if outputs:
            # kind: how its numbers are compared; decision and parts: how else it is judged
            # (pipeline/verify/judgement/decisions.py, metrics.py), with where its kind came from
            spec = recipe.outputs.get(info.name)
            entry["kind"] = spec.numeric_kind if spec else "tensor"
            if spec is not None and spec.decision():
                entry["decision"] = spec.decision()
            if spec is not None and spec.part_slices():
                entry["parts"] = spec.part_slices()
        entries.append(entry)
    return entries


def stale_declarations(model: onnx.ModelProto, outputs: dict[str, np.ndarray]) -> list[str]:
    """A line per output whose declared shape the reference run contradicts. The stale_shapes
    repair fixes what shape inference can see; behind an op it cannot type (com.microsoft's
    quantized ops) a stale declaration stays, and onnxruntime only warns. Every variant is then
    judged, and the manifest declares the output, as the run gives it."""
    lines = []
    for info in model.graph.output:
        declared = declared_shape(info)
        if info.name in outputs and shapes_disagree(declared, list(outputs[info.name].shape)):
            lines.append(f"output '{info.name}' declares shape {declared}, the model gives {list(outputs[info.name].shape)} on the sample; "
                         "the package declares what it gives (fix the export's declaration to silence this)")
    return lines


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


@dataclass(frozen=True)
class ModelFiles:
    """The model files of every variant (write_models) and the manifest sections they decide."""

    files: tuple[PackageFile, ...]
    variants: dict[str, VariantEntry]
    variant_for: dict[str, list[str]]
    model_paths: dict[str, Path]  # variant name -> shipped model file
    check_paths: dict[str, Path]  # variant name -> what a session loads (fp16w: widened)
    inputs: list[dict]
    outputs: list[dict]  # without sample shapes (the sample's outputs have them)
    ep_options: dict[str, dict[str, Any]]  # from the layout hazard of the reference model; {} when none


@dataclass(frozen=True)
class SampleFile:
    """The sample file (write_sample): inputs then their fp32 reference outputs; in parts when over
    `[assets] max_file_mib` (`split`: the manifest's entry for the whole)."""

    files: tuple[PackageFile, ...]
    sample: Sample
    outputs: list[dict]  # the manifest's outputs, with their sample shapes
    split: dict[str, SplitFile] = field(default_factory=dict)


@dataclass(frozen=True)
class RuntimeFiles:
    """The onnxruntime-web bundle files (write_runtime) and the manifest's `runtime`; a file over
    `[assets] max_file_mib` in parts (`split`)."""

    files: tuple[PackageFile, ...]
    runtime: dict[str, Any]
    split: dict[str, SplitFile] = field(default_factory=dict)


def max_file_bytes(recipe: Recipe) -> int:
    """`[assets] max_file_mib` in bytes, a multiple of the chunk alignment (chunk_bytes)."""
    return chunk_bytes(recipe.max_file_mib)


def check_file_sizes(files: dict[str, PackageFile], limit: int, max_file_mib: float) -> None:
    """PackError naming the first listed file over `limit` bytes and why it cannot be larger."""
    for path, file in files.items():
        if file.size > limit:
            how = (
                "a model's graph without its weights cannot be split; raise [assets] max_file_mib if every host you publish to takes it"
                if path.startswith("model.") and path.endswith(".onnx")
                else "raise [assets] max_file_mib if every host you publish to takes it"
            )
            raise PackError(
                f"{path}: {file.size / MIB:.2f} MiB, over [assets] max_file_mib {max_file_mib:g} "
                f"(the largest file a host serves: jsDelivr 20 MB, Cloudflare Pages 25 MiB); {how}"
            )


@dataclass(frozen=True)
class PackageContents:
    """Every file written into the package so far and the manifest sections describing them.
    Frozen: a stage's result makes a new one (`dataclasses.replace`)."""

    name: str
    description: str | None
    chains: dict[str, list[str]]
    loader: LoaderSettings
    models: ModelFiles | None = None
    sample: SampleFile | None = None
    runtime: RuntimeFiles | None = None
    plain: tuple[PackageFile, ...] = ()  # loader files and demo page (no hash in their names)
    ep_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_file_mib: float = DEFAULT_MAX_FILE_MIB  # [assets] max_file_mib: no listed file is larger

    @property
    def files(self) -> dict[str, PackageFile]:
        listed = [*(self.models.files if self.models else ()), *(self.sample.files if self.sample else ()), *(self.runtime.files if self.runtime else ()), *self.plain]
        return {file.path: file for file in listed}

    def manifest(
        self,
        *,
        thresholds: Thresholds | None = None,
        verification: Verification | None = None,
        measurements: list[Measurement] | None = None,
        license: str | None = None,
        fp16: dict[str, Any] | None = None,
    ) -> Manifest:
        if self.models is None or self.sample is None or self.runtime is None:
            raise ValueError("a manifest needs the models, the sample and the runtime written first")
        check_file_sizes(self.files, chunk_bytes(self.max_file_mib), self.max_file_mib)
        return make_manifest(
            name=self.name,
            description=self.description,
            files={path: file.manifest_entry() for path, file in self.files.items()},
            variants=self.models.variants,
            variant_for=self.models.variant_for,
            inputs=self.models.inputs,
            outputs=self.sample.outputs,
            sample=self.sample.sample,
            runtime=self.runtime.runtime,
            execution_providers=self.chains,
            ep_options=self.ep_options,
            loader=self.loader,
            thresholds=thresholds,
            verification=verification,
            measurements=measurements,
            license=license,
            fp16=fp16,
            split={**self.sample.split, **self.runtime.split},
        )


def start_package(recipe: Recipe) -> PackageContents:
    return PackageContents(
        name=recipe.name,
        description=recipe.description,
        chains=recipe.chains,
        # "chain": the recipe's EP order; the loader helper's measured choice can switch it to "measured".
        loader={"watchdogMs": recipe.watchdog_ms, "prewarm": recipe.prewarm, "select": "chain"},
        max_file_mib=recipe.max_file_mib,
    )


def write_models(staging: Path, recipe: Recipe, variants: list[Variant], reference_model: onnx.ModelProto, feeds: dict[str, np.ndarray], progress: Progress) -> ModelFiles:
    """One content-hashed model file per variant (the repair passes capped its IR version for the
    runtime); a model over `[assets] chunk_mib` (or max_file_mib, when smaller) as its graph plus
    chunked weights (assets/chunks.py)."""
    limit = chunk_bytes(min(recipe.chunk_mib, recipe.max_file_mib))
    files: list[PackageFile] = []
    entries: dict[str, VariantEntry] = {}
    model_paths: dict[str, Path] = {}
    check_paths: dict[str, Path] = {}
    for variant in variants:
        # fp16w too: its fp16 weights in chunks, widened by the loader chunk by chunk
        chunked = write_chunked(staging, f"model.{variant.name}", variant.model, limit, progress, widen=bool(variant.widen)) if variant.model.ByteSize() > limit else None
        if chunked is not None:
            files += [chunked.graph, *chunked.chunks]
            model_paths[variant.name] = check_paths[variant.name] = chunked.verify_path
            entries[variant.name] = {"precision": variant.precision, "model": chunked.graph.path, "requires": variant.requires, "externalData": chunked.external}
            if variant.widen:
                entries[variant.name]["widen"] = variant.widen
            continue
        entry = add_hashed_file(staging, f"model.{variant.name}", ".onnx", model_bytes(variant.model), progress)
        files.append(entry)
        model_paths[variant.name] = staging / entry.path
        check_paths[variant.name] = widened_model_file(model_paths[variant.name]) if variant.widen else model_paths[variant.name]
        entries[variant.name] = {"precision": variant.precision, "model": entry.path, "requires": variant.requires}
        if variant.widen:
            entries[variant.name]["widen"] = variant.widen
    check_file_sizes({file.path: file for file in files}, chunk_bytes(recipe.max_file_mib), recipe.max_file_mib)  # before any later stage runs
    layout = preferred_layout(reference_model)
    return ModelFiles(
        files=tuple(files),
        variants=entries,
        variant_for=variant_for(variants, recipe),
        model_paths=model_paths,
        check_paths=check_paths,
        inputs=io_entries(reference_model, feeds, recipe, outputs=False),
        outputs=io_entries(reference_model, None, recipe, outputs=True),
        ep_options={"webgpu": {"preferredLayout": layout}} if layout else {},
    )


def write_sample(staging: Path, recipe: Recipe, reference_model: onnx.ModelProto, feeds: dict[str, np.ndarray], reference: dict[str, np.ndarray], progress: Progress) -> SampleFile:
    """The sample file: inputs, then their fp32 reference outputs; and the outputs' sample shapes."""
    data, tensors, outputs = sample_bytes(feeds, reference)
    shapes = io_entries(reference_model, reference, recipe, outputs=True)
    for line in stale_declarations(reference_model, reference):
        warn(line)
    if len(data) > max_file_bytes(recipe):
        path, parts, split = write_split(staging, "sample", ".bin", data, max_file_bytes(recipe), progress)
        return SampleFile(tuple(parts), {"file": path, "tensors": tensors, "outputs": outputs}, shapes, {path: split})
    sample = add_hashed_file(staging, "sample", ".bin", data, progress)
    return SampleFile((sample,), {"file": sample.path, "tensors": tensors, "outputs": outputs}, shapes)


def write_runtime(staging: Path, recipe: Recipe, progress: Progress) -> RuntimeFiles:
    """The onnxruntime-web bundles the platform chains need (one per distinct chain bundle)."""
    runtime = recipe_runtime(recipe.runtime_version, recipe.runtime_path, progress)
    keys = sorted({chain_bundle(chain) for chain in recipe.chains.values()})
    # (bundle key, role, file): glue is emscripten's module imported apart, in releases up to 1.22
    parts = []
    for key in keys:
        bundle = runtime.bundles[key]
        parts += [(key, role, path) for role, path in (("module", bundle.module), ("wasm", bundle.wasm), ("glue", bundle.glue)) if path is not None]
    # compressed together, across cores: each .wasm takes up to a minute at q11 on a cold cache
    items = [(f"ort/{path.name.removesuffix(path.suffix)}", path.suffix, path.read_bytes()) for _, _, path in parts]
    limit = max_file_bytes(recipe)
    whole = [item for item in items if len(item[2]) <= limit]
    files = add_hashed_files(staging, whole, None, "brotli onnxruntime-web", progress)
    paths = iter(file.path for file in files)
    split: dict[str, SplitFile] = {}
    bundles: dict[str, dict[str, str]] = {key: {"entry": runtime.bundles[key].entry} for key in keys}
    for (key, role, _), (stem, suffix, data) in zip(parts, items):
        if len(data) <= limit:
            bundles[key][role] = next(paths)
            continue
        # over a host's cap (the webgpu bundle's .wasm: 25.5 MiB in 1.30): in parts the loader joins
        path, pieces, split[path] = write_split(staging, stem, suffix, data, limit, progress, "code")
        files += pieces
        bundles[key][role] = path
    # the brotli decoder for hosts that serve .br bodies as they are (assets/decoder.py): no .br copy of its own
    decoder: dict[str, str] = {"package": DECODER_PACKAGE, "version": DECODER_VERSION}
    for role, (member, data) in decoder_files(progress).items():
        file = add_hashed_file(staging, f"decoder/{member.name.removesuffix(member.suffix)}", member.suffix, data, progress, with_br=False)
        files.append(file)
        decoder[role] = file.path
    return RuntimeFiles(tuple(files), {"package": "onnxruntime-web", "version": runtime.version, "bundles": bundles, "decoder": decoder}, split)


def plain_files(staging: Path, paths: list[str]) -> tuple[PackageFile, ...]:
    """The entries of files written without a hash in their name (loader files, demo page)."""
    return tuple(describe_file(staging, path) for path in paths)
