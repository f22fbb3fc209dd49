"""Which variants a package ships, made from the repaired source model.

fp32 sources are converted to fp16 (cached per source bytes, settings, conversion code and the nodes
kept in fp32, which kept_nodes.py decides); sources
already in fp16 ship as fp16 with an upcast fp32 fallback; quantized sources ship as they are.
A float source also ships fp16w (its fp32 graph, weights stored as fp16) when the recipe lists it,
or, when the recipe lists no variants, where `fp16w_by_default` says it saves a meaningful share.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

import onnx

from pipeline.cache import atomic_write, cache_dir, cached_entry
from pipeline.keys import stage_key
from pipeline.graph.model_io import model_bytes
from pipeline.graph.passes.base import PassSettings
from pipeline.precision.dequantize import dequantized
from pipeline.precision.detect import detect_precision
from pipeline.precision.fp16 import FP16Refused, convert_with_keeps, upcast_to_fp32
from pipeline.precision.fp16w import WIDEN, narrow_initializers
from pipeline.precision.converter_errors import name_unnamed_nodes
from pipeline.precision.kept_nodes import Fp16Context, fp16_with_kept_nodes
from pipeline.recipe import Recipe

# Cached conversions are keyed by the code that makes them too (pipeline/keys.py: every module
# of these packages and the top-level pipeline modules they import) and the onnx libraries'
# versions. Editing any of them invalidates the cache without a version to remember to bump.
CONVERSION_CODE = ("pipeline.graph", "pipeline.precision")
CONVERSION_LIBRARIES = ("onnx", "onnxconverter-common", "onnxruntime", "numpy")
# fp16w by default (recipe without `variants`): the weights it halves are at least half the fp32
# model's bytes, so the wasm EP and GPUs without shader-f16 download at most 3/4 of fp32 (a graph
# of many small ops would gain little), and it saves at least 1 MiB: below that the saving is
# under half the smallest first visit (the wasm runtime, 2.4 MB on the wire) while the variant
# still costs a full verification in every stage.
FP16W_MIN_WEIGHT_SHARE = 0.5
FP16W_MIN_SAVED_BYTES = 1 << 20
SIZE_RULE_MIN_BYTES = 1 << 20  # fp32 models from this size never ship a narrowed variant that is not smaller


@dataclass
class Variant:
    name: str  # manifest key: fp32 | fp16 | quantized
    precision: str
    model: onnx.ModelProto
    origin: str  # how it was made, for the summary
    requires: list[str] = field(default_factory=list)
    kept_fp32: list[dict] = field(default_factory=list)  # [{node, op, why}]: manifest fp16.keptFp32
    widen: str | None = None  # manifest variants[name].widen: how the loader widens it (fp16w.py)
    kept_initializers: list[dict] = field(default_factory=list)  # fp16w: float32 initializers left float32
    self_reference: str | None = None  # a quantized source without a float twin: why it is its own reference


def _work_key(source_bytes_sha: str, recipe: Recipe, settings: PassSettings) -> str:
    """The conversion's input is the *repaired* source: its key holds everything the repairs depend
    on (their settings: the runtime's IR cap) beside the source bytes, the code and the libraries."""
    read = {"repairs_auto": recipe.repairs_auto, "repairs": recipe.repairs, "pass_settings": settings, "fp16_block_ops": sorted(recipe.fp16_block_ops)}
    return stage_key("convert", read, {"source": source_bytes_sha}, CONVERSION_CODE, CONVERSION_LIBRARIES)


def _cached_fp16(model: onnx.ModelProto, key: str, block_ops: list[str], keep: dict[str, str], refusal: Callable[[onnx.ModelProto], str | None] | None = None) -> tuple[onnx.ModelProto | None, list[dict], str | None, dict[str, str]]:
    """fp16 conversion keeping `keep` in fp32 (plus what the converter's errors add), reused from
    the work cache when the source, settings and kept nodes are unchanged. Returns (model, steps,
    refusal, kept {node: why})."""
    keep_key = hashlib.sha256(json.dumps(sorted(keep)).encode()).hexdigest()[:16]
    folder = cache_dir("work", key)
    model_file, steps_file = folder / f"fp16-{keep_key}.onnx", folder / f"fp16-{keep_key}.steps.json"
    if cached_entry(steps_file):
        cached = json.loads(steps_file.read_text())
        kept = {**keep, **cached.get("kept", {})}
        if cached.get("refused"):
            return None, cached["steps"], cached["refused"], kept
        if cached_entry(model_file):
            return onnx.load(str(model_file)), cached["steps"], None, kept
    try:
        result = convert_with_keeps(model, block_ops, keep, refusal)
        converted, steps, refused = result.model, result.steps, None
        found = {k.node: k.why for k in result.kept if k.node not in keep}
        atomic_write(model_file, model_bytes(converted), entry=True)
    except FP16Refused as error:
        converted, steps, refused, found = None, [{"name": "fp16_convert", "changed": False, "records": [], "refused": str(error)}], str(error), {}
    atomic_write(steps_file, json.dumps({"steps": steps, "refused": refused, "kept": found}).encode(), entry=True)
    return converted, steps, refused, {**keep, **found}


def _fp16_variant(model: onnx.ModelProto, recipe: Recipe, source_sha: str, made: "VariantSet", context: Fp16Context | None, settings: PassSettings) -> Variant | None:
    """The fp16 variant with its nodes kept in fp32 (kept_nodes.py); None when fp16 is refused."""
    named = name_unnamed_nodes(model).model
    key = _work_key(source_sha, recipe, settings)
    refusal = context.refusal if context else None

    def convert(keep: dict[str, str]) -> tuple[onnx.ModelProto | None, list[dict], str | None, dict[str, str]]:
        return _cached_fp16(named, key, recipe.fp16_block_ops, keep, refusal)

    decided = fp16_with_kept_nodes(named, recipe, convert, made.steps, made.refused, context)
    if decided is None:
        return None
    converted, kept = decided
    origin = "converted" + (f", {len(kept)} nodes kept in fp32" if kept else "")
    return Variant("fp16", "fp16", converted, origin, ["shader-f16"], kept)


@dataclass
class VariantSet:
    """What the precision stage decided: the variants to ship, the fp32 host reference, and why."""

    variants: list[Variant]
    reference: onnx.ModelProto
    precision: str  # of the source: fp32 | fp16 | quantized
    precision_reason: str
    steps: list[dict] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # variant name -> why it is not shipped


def fp16w_by_default(model_bytes: int, bytes_saved: int) -> str | None:
    """Why a recipe without `variants` ships fp16w, or None when it saves too little: the one rule
    (FP16W_MIN_WEIGHT_SHARE, FP16W_MIN_SAVED_BYTES). `bytes_saved` is what narrowing the fp32
    model of `model_bytes` saves: half its narrowed weights."""
    share = 2 * bytes_saved / model_bytes if model_bytes else 0.0
    if share < FP16W_MIN_WEIGHT_SHARE or bytes_saved < FP16W_MIN_SAVED_BYTES:
        return None
    return f"by default: weights {share:.0%} of the fp32 model, {bytes_saved / (1 << 20):.1f} MiB saved"


def _fp16w_variant(reference: onnx.ModelProto, made: "VariantSet", listed: bool) -> None:
    """fp16w: the fp32 graph, its float32 initializers stored as fp16 (fp16w.py); the loader widens
    them. `listed`: the recipe lists it; else it ships only where fp16w_by_default holds."""
    narrowed = narrow_initializers(reference)
    if isinstance(narrowed, str):
        if listed:
            made.refused["fp16w"] = narrowed
            made.steps.append({"name": "fp16w_narrow", "changed": False, "records": [], "refused": narrowed})
        else:
            made.steps.append({"name": "fp16w_narrow", "changed": False, "records": [{"default": f"not shipped: {narrowed}"}]})
        return
    origin = f"fp32 graph, {narrowed.narrowed} initializers stored as fp16" + (f", {len(narrowed.kept)} kept float32" if narrowed.kept else "")
    record = {"what": origin, "bytes_saved": narrowed.bytes_saved, "kept": narrowed.kept}
    if not listed:
        why = fp16w_by_default(reference.ByteSize(), narrowed.bytes_saved)
        record["default"] = why or (
            f"not shipped: saves {narrowed.bytes_saved:,} B of {reference.ByteSize():,} (by default fp16w ships when the weights are "
            f"at least {FP16W_MIN_WEIGHT_SHARE:.0%} of the model and it saves at least {FP16W_MIN_SAVED_BYTES >> 20} MiB; list it in `variants` to ship it anyway)"
        )
        if why is None:
            made.steps.append({"name": "fp16w_narrow", "changed": False, "records": [record]})
            return
        origin += f" ({why})"
    made.steps.append({"name": "fp16w_narrow", "changed": narrowed.narrowed > 0, "records": [record]})
    made.variants.append(Variant("fp16w", "fp16w", narrowed.model, origin, widen=WIDEN, kept_initializers=narrowed.kept))


def make_variants(model: onnx.ModelProto, recipe: Recipe, source_sha: str, context: Fp16Context | None = None, settings: PassSettings | None = None) -> VariantSet:
    """The variants to ship and the fp32 model that serves as the host reference. `model` is the
    source after the repairs made with `settings` (part of the conversion cache's key)."""
    settings = settings or PassSettings(runtime_version=recipe.runtime_version)
    precision, why = detect_precision(model)
    if precision == "quantized":
        step = {"name": "fp16_convert", "changed": False, "records": [{"what": f"already quantized ({why}); shipped as is"}]}
        twin = dequantized(model)
        if isinstance(twin, str):
            reference = {"name": "fp32_reference", "changed": False, "records": [{"what": f"none: {twin}; the quantized source is its own reference (it runs, finite)"}]}
            return VariantSet([Variant("quantized", "quantized", model, "source (quantized)", self_reference=twin)], model, precision, why, [step, reference])
        reference = {"name": "fp32_reference", "changed": True, "records": [{"what": "the model dequantized: every variant is judged against it (pipeline/precision/dequantize.py)"}]}
        return VariantSet([Variant("quantized", "quantized", model, "source (quantized)")], twin, precision, why, [step, reference])
    if precision == "fp16":
        reference, upcast = upcast_to_fp32(model)
        made = VariantSet([], reference, precision, why, [{"name": "fp16_convert", "changed": False, "records": [{"what": f"already fp16 ({why}); shipped as is"}]}])
        if "fp16" in recipe.variants:
            made.variants.append(Variant("fp16", "fp16", model, "source (already fp16)", ["shader-f16"]))
        if "fp16w" in recipe.variants or not recipe.variants_stated:
            _fp16w_variant(reference, made, "fp16w" in recipe.variants)
        if "fp32" in recipe.variants:
            made.steps.append(upcast)
            made.variants.append(Variant("fp32", "fp32", reference, "upcast from the fp16 source"))
        return made
    made = VariantSet([], model, precision, why)
    if "fp16" in recipe.variants:
        fp16 = _fp16_variant(model, recipe, source_sha, made, context, settings)
        if fp16 is not None:
            made.variants.append(fp16)
    if "fp16w" in recipe.variants or not recipe.variants_stated:
        _fp16w_variant(model, made, "fp16w" in recipe.variants)
    _drop_larger_than_fp32(made, model)
    if "fp32" in recipe.variants or not made.variants:
        made.variants.append(Variant("fp32", "fp32", model, "source"))
    return made


def _drop_larger_than_fp32(made: VariantSet, fp32: onnx.ModelProto) -> None:
    """A narrowed variant that is not smaller than the fp32 model saves nothing and would be
    fetched first on WebGPU: it is not shipped, with the sizes as the reason. Below
    SIZE_RULE_MIN_BYTES of fp32 model the converter's few hundred bytes of casts can outweigh the
    halved weights, and a download that small is not what fp16 is shipped for (its kernels are)."""
    limit = fp32.ByteSize()
    if limit < SIZE_RULE_MIN_BYTES:
        return
    for variant in list(made.variants):
        size = variant.model.ByteSize()
        if size >= limit:
            why = f"{size:,} B, not smaller than the fp32 model's {limit:,} B: it saves nothing"
            made.variants.remove(variant)
            made.refused[variant.name] = why
            made.steps.append({"name": f"{variant.name}_size", "changed": False, "records": [], "refused": why})
