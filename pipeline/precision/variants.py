"""Which variants a package ships, made from the repaired source model.

fp32 sources are converted to fp16 (cached per source bytes, settings and conversion code); sources
already in fp16 ship as fp16 with an upcast fp32 fallback; quantized sources ship as they are.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import onnx

import pipeline
from pipeline.cache import cache_dir
from pipeline.graph.model_io import model_bytes
from pipeline.precision.detect import detect_precision
from pipeline.precision.fp16 import FP16Refused, convert_to_fp16, upcast_to_fp32
from pipeline.recipe import Recipe

# Cached conversions are keyed by the code that makes them too: every module of these folders and
# the top-level pipeline modules they import, pack's version, and the onnx libraries' versions.
# Editing any of them invalidates the cache without a version to remember to bump.
_CONVERSION_FOLDERS = ("graph", "precision")
_CONVERSION_LIBRARIES = ("onnx", "onnxconverter-common", "onnxruntime")
# `from pipeline.x import ...` / `import pipeline.x` at any indentation (late imports count too).
_PIPELINE_IMPORT = re.compile(r"^\s*(?:from|import)\s+pipeline\.(\w+)", re.MULTILINE)


@dataclass
class Variant:
    name: str  # manifest key: fp32 | fp16 | quantized
    precision: str
    model: onnx.ModelProto
    origin: str  # how it was made, for the summary
    requires: list[str] = field(default_factory=list)


def conversion_sources(package_dir: Path = Path(pipeline.__file__).resolve().parent) -> list[Path]:
    """The files whose text the conversion runs: every .py under the conversion folders, and each
    top-level pipeline module one of them imports."""
    sources = sorted(p for folder in _CONVERSION_FOLDERS for p in (package_dir / folder).rglob("*.py"))
    imported = {name for source in sources for name in _PIPELINE_IMPORT.findall(source.read_text(encoding="utf-8"))}
    top_level = sorted(package_dir / f"{name}.py" for name in imported if (package_dir / f"{name}.py").is_file())
    return sources + top_level


def conversion_code_key(package_dir: Path = Path(pipeline.__file__).resolve().parent) -> str:
    """A hash of the conversion's code (file names and text) and the versions of pack and the onnx libraries."""
    digest = hashlib.sha256()
    for source in conversion_sources(package_dir):
        digest.update(source.relative_to(package_dir).as_posix().encode() + b"\0" + source.read_bytes() + b"\0")
    versions = [pipeline.__version__, *(metadata.version(name) for name in _CONVERSION_LIBRARIES)]
    return hashlib.sha256(json.dumps([digest.hexdigest(), versions]).encode()).hexdigest()


def _work_key(source_bytes_sha: str, recipe: Recipe) -> str:
    config = json.dumps([conversion_code_key(), source_bytes_sha, recipe.repairs_auto, recipe.repairs, sorted(recipe.fp16_block_ops)])
    return hashlib.sha256(config.encode()).hexdigest()


def _cached_fp16(model: onnx.ModelProto, key: str, block_ops: list[str]) -> tuple[onnx.ModelProto | None, list[dict], str | None]:
    """fp16 conversion, reused from the work cache when the source and settings are unchanged."""
    folder = cache_dir("work", key)
    model_file, steps_file = folder / "fp16.onnx", folder / "fp16.steps.json"
    if steps_file.exists():
        cached = json.loads(steps_file.read_text())
        if cached.get("refused"):
            return None, cached["steps"], cached["refused"]
        if model_file.exists():
            return onnx.load(str(model_file)), cached["steps"], None
    try:
        converted, steps = convert_to_fp16(model, block_ops)
        refused = None
        model_file.write_bytes(model_bytes(converted))
    except FP16Refused as error:
        converted, steps, refused = None, [{"name": "fp16_convert", "changed": False, "records": [], "refused": str(error)}], str(error)
    steps_file.write_text(json.dumps({"steps": steps, "refused": refused}))
    return converted, steps, refused


def make_variants(model: onnx.ModelProto, recipe: Recipe, source_sha: str, report: dict) -> tuple[list[Variant], onnx.ModelProto]:
    """The variants to ship and the fp32 model that serves as the host reference."""
    precision, why = detect_precision(model)
    report["source"]["precision"] = precision
    report["source"]["precision_reason"] = why
    if precision == "quantized":
        report["steps"].append({"name": "fp16_convert", "changed": False, "records": [{"what": f"already quantized ({why}); shipped as is"}]})
        return [Variant("quantized", "quantized", model, "source (quantized)")], model
    if precision == "fp16":
        reference, step = upcast_to_fp32(model)
        report["steps"].append({"name": "fp16_convert", "changed": False, "records": [{"what": f"already fp16 ({why}); shipped as is"}]})
        variants = []
        if "fp16" in recipe.variants:
            variants.append(Variant("fp16", "fp16", model, "source (already fp16)", ["shader-f16"]))
        if "fp32" in recipe.variants:
            report["steps"].append(step)
            variants.append(Variant("fp32", "fp32", reference, "upcast from the fp16 source"))
        return variants, reference
    variants = []
    if "fp16" in recipe.variants:
        converted, steps, refused = _cached_fp16(model, _work_key(source_sha, recipe), recipe.fp16_block_ops)
        report["steps"].extend(steps)
        if refused:
            report["variants_refused"]["fp16"] = refused
        else:
            variants.append(Variant("fp16", "fp16", converted, "converted", ["shader-f16"]))
    if "fp32" in recipe.variants or not variants:
        variants.append(Variant("fp32", "fp32", model, "source"))
    return variants, model
