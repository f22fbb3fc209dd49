"""Which variants a package ships, made from the repaired source model.

fp32 sources are converted to fp16 (cached per source bytes, settings and conversion code); sources
already in fp16 ship as fp16 with an upcast fp32 fallback; quantized sources ship as they are.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from pipeline.cache import cache_dir
from pipeline.graph.model_io import model_bytes
from pipeline.lockfile import LockFile
from pipeline.precision.detect import detect_precision, weight_bytes_by_type
from pipeline.precision.fp16 import SAFE_BLOCK_LIST, FP16Refused, convert_with_keeps, upcast_to_fp32
from pipeline.precision.keep import name_unnamed_nodes
from pipeline.precision.ranking import RunOutputs, rank_nodes
from pipeline.precision.search import search_keep_set
from pipeline.progress import Progress
from pipeline.recipe import Recipe

# Cached conversions are keyed by the code that makes them too: editing any of these files, or
# another onnx / onnxconverter-common, invalidates them without a version to remember to bump.
_CONVERSION_CODE = ("precision/fp16.py", "precision/keep.py", "graph/passes/fp16_ready.py", "graph/passes/topo_sort.py")



@dataclass
class Variant:
    name: str  # manifest key: fp32 | fp16 | quantized
    precision: str
    model: onnx.ModelProto
    origin: str  # how it was made, for the summary
    requires: list[str] = field(default_factory=list)
    kept_fp32: list[dict] = field(default_factory=list)  # [{node, op, why}]: manifest fp16.keptFp32


DID_NOT_RUN = "did not run"  # an evaluator's detail for a model that produced no outputs
# A kept set that spends more than this share of fp16's saving (fp32 bytes - all-fp16 bytes) is no
# fp16 variant worth shipping: the search fails instead (fp16 then fails its host check as before).
MAX_KEPT_COST_SHARE = 0.5


@dataclass
class Evaluator:
    """One check an fp16 candidate must pass: `judge(model file)` -> (passed, one-line detail).
    The verify stage makes them (host CPU; WebGPU kernels when available)."""

    name: str
    judge: Callable[[Path], tuple[bool, str]]


@dataclass
class Fp16Context:
    """What the build lends the fp16 search: sample feeds, a runner for the fp32 ranking run, the
    evaluators, the lock file and progress."""

    feeds: dict[str, np.ndarray]
    run_outputs: RunOutputs
    evaluators: list[Evaluator]
    lock: LockFile
    progress: Progress
    refusal: Callable[[onnx.ModelProto], str | None] | None = None  # onnxruntime's refusal to load, if any


def _work_key(source_bytes_sha: str, recipe: Recipe) -> str:
    package_dir = Path(__file__).resolve().parent.parent
    code = hashlib.sha256(b"".join((package_dir / name).read_bytes() for name in _CONVERSION_CODE)).hexdigest()
    versions = [metadata.version("onnx"), metadata.version("onnxconverter-common")]
    config = json.dumps([code, versions, source_bytes_sha, recipe.repairs_auto, recipe.repairs, sorted(recipe.fp16_block_ops)])
    return hashlib.sha256(config.encode()).hexdigest()


def _cached_fp16(model: onnx.ModelProto, key: str, block_ops: list[str], keep: dict[str, str], refusal: Callable[[onnx.ModelProto], str | None] | None = None) -> tuple[onnx.ModelProto | None, list[dict], str | None, dict[str, str]]:
    """fp16 conversion keeping `keep` in fp32 (plus what the converter's errors add), reused from
    the work cache when the source, settings and kept nodes are unchanged. Returns (model, steps,
    refusal, kept {node: why})."""
    keep_key = hashlib.sha256(json.dumps(sorted(keep)).encode()).hexdigest()[:16]
    folder = cache_dir("work", key)
    model_file, steps_file = folder / f"fp16-{keep_key}.onnx", folder / f"fp16-{keep_key}.steps.json"
    if steps_file.exists():
        cached = json.loads(steps_file.read_text())
        kept = {**keep, **cached.get("kept", {})}
        if cached.get("refused"):
            return None, cached["steps"], cached["refused"], kept
        if model_file.exists():
            return onnx.load(str(model_file)), cached["steps"], None, kept
    try:
        result = convert_with_keeps(model, block_ops, keep, refusal)
        converted, steps, refused = result.model, result.steps, None
        found = {k.node: k.why for k in result.kept if k.node not in keep}
        model_file.write_bytes(model_bytes(converted))
    except FP16Refused as error:
        converted, steps, refused, found = None, [{"name": "fp16_convert", "changed": False, "records": [], "refused": str(error)}], str(error), {}
    steps_file.write_text(json.dumps({"steps": steps, "refused": refused, "kept": found}))
    return converted, steps, refused, {**keep, **found}


def _judge_all(converted: onnx.ModelProto, evaluators: list[Evaluator]) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="pack-fp16-") as tmp:
        path = Path(tmp) / "fp16.onnx"
        path.write_bytes(model_bytes(converted))
        for evaluator in evaluators:
            passed, detail = evaluator.judge(path)
            if not passed:
                return False, f"{evaluator.name}: {detail}"
    return True, "passes " + ", ".join(e.name for e in evaluators)


def _sizes(source: onnx.ModelProto, converted: onnx.ModelProto) -> dict:
    """Weight bytes of fp32, of the all-fp16 ideal (every fp32 weight halved) and of the variant."""
    source_weights = weight_bytes_by_type(source)
    ideal = sum(size // 2 if kind == "fp32" else size for kind, size in source_weights.items())
    actual = sum(weight_bytes_by_type(converted).values())
    return {"fp32_bytes": sum(source_weights.values()), "all_fp16_ideal_bytes": ideal, "fp16_bytes": actual, "kept_cost_bytes": actual - ideal}


def _fp16_variant(model: onnx.ModelProto, recipe: Recipe, source_sha: str, report: dict, context: Fp16Context | None) -> Variant | None:
    """The fp16 variant, with nodes kept in fp32: from the recipe, a lock, the converter's errors
    or a search over the nodes ranked by one fp32 run. None when fp16 is refused (with the reason)."""
    named = name_unnamed_nodes(model).model
    model_sha = hashlib.sha256(model_bytes(named)).hexdigest()
    key = _work_key(source_sha, recipe)
    keep = {name: "recipe key fp16.keep_nodes" for name in recipe.fp16_keep_nodes}
    record: dict = {}
    locked = context.lock.get(recipe.name, "fp16") if context else None
    from_lock = False
    if locked is not None:
        if locked.get("model_sha256") == model_sha:
            keep.update({entry["node"]: entry["why"] for entry in locked.get("kept", [])})
            from_lock = True
            record["lock"] = f"applied {context.lock.path.name}: {len(locked.get('kept', []))} nodes kept in fp32, no search"
        else:
            note = f"lock {context.lock.path.name}: its fp16 entry is for another model (sha256 {str(locked.get('model_sha256'))[:12]}, now {model_sha[:12]}); finding the nodes to keep again"
            context.progress.note(note)
            record["lock"] = note
    refusal = context.refusal if context else None
    converted, steps, refused, kept = _cached_fp16(named, key, recipe.fp16_block_ops, keep, refusal)
    report["steps"].extend(steps)
    if refused:
        report["variants_refused"]["fp16"] = refused
        return None
    search = None
    if context and context.evaluators and recipe.fp16_search and not from_lock:
        passed, detail = _judge_all(converted, context.evaluators)
        if not passed and DID_NOT_RUN not in detail:
            context.progress.note(f"fp16 misses a threshold ({detail}); searching for nodes to keep in fp32")
            blocked = set(SAFE_BLOCK_LIST) | set(recipe.fp16_block_ops)
            ranked = [stat for stat in rank_nodes(named, context.feeds, context.run_outputs, blocked) if stat.node not in kept]
            why = {stat.node: f"search: {stat.why}" for stat in ranked}

            def trial(nodes: list[str]) -> tuple[bool, str]:
                candidate, _, refused_now, _ = _cached_fp16(named, key, recipe.fp16_block_ops, {**kept, **{n: why[n] for n in nodes}}, refusal)
                return (False, refused_now) if refused_now else _judge_all(candidate, context.evaluators)

            result = search_keep_set([stat.node for stat in ranked], trial, recipe.fp16_search_trials, recipe.fp16_search_seconds)
            search = {**result.figures(), "candidates": len(ranked), "first_failure": detail, "evaluators": [e.name for e in context.evaluators]}
            found = {**kept, **{n: why[n] for n in result.kept}}
            candidate = _cached_fp16(named, key, recipe.fp16_block_ops, found, refusal)[0] if result.passed else None
            sizes = _sizes(named, candidate) if candidate is not None else None
            if candidate is None:
                search["failed"] = result.stopped or "no passing set found"
            elif sizes["kept_cost_bytes"] > MAX_KEPT_COST_SHARE * (sizes["fp32_bytes"] - sizes["all_fp16_ideal_bytes"]):
                search["failed"] = f"the {len(result.kept)} nodes that pass keep {sizes['fp16_bytes']} of {sizes['fp32_bytes']} bytes: more than half of fp16's saving lost"
            else:
                converted, kept = candidate, found
            search["ranked"] = [stat.as_dict() for stat in ranked[:10]]
    nodes = {n.name: n.op_type for n in named.graph.node}
    kept_list = [{"node": name, "op": nodes.get(name, "?"), "why": why} for name, why in sorted(kept.items())]
    if kept_list or search:
        record.update(kept=kept_list, sizes=_sizes(named, converted))
        if search:
            record["search"] = search
        summary = f"{len(kept_list)} node{'s' if len(kept_list) != 1 else ''} kept in fp32"
        if search:
            summary += f"; search: {search['trials']} trials in {search['seconds']:.1f} s" + (f" ({search['failed']})" if "failed" in search else "")
        record["what"] = summary
        report["steps"].append({"name": "fp16_keep_fp32", "changed": bool(kept_list), "records": [record]})
        if context and not from_lock and (search is None or "failed" not in search):
            context.lock.put(recipe.name, "fp16", {"model_sha256": model_sha, "kept": kept_list, "search": {k: search[k] for k in ("trials", "seconds", "minimal", "stopped")} if search else None})
    elif "lock" in record:
        report["steps"].append({"name": "fp16_keep_fp32", "changed": False, "records": [{**record, "what": record["lock"]}]})
    return Variant("fp16", "fp16", converted, "converted" + (f", {len(kept_list)} nodes kept in fp32" if kept_list else ""), ["shader-f16"], kept_list)


def make_variants(model: onnx.ModelProto, recipe: Recipe, source_sha: str, report: dict, context: Fp16Context | None = None) -> tuple[list[Variant], onnx.ModelProto]:
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
        fp16 = _fp16_variant(model, recipe, source_sha, report, context)
        if fp16 is not None:
            variants.append(fp16)
    if "fp32" in recipe.variants or not variants:
        variants.append(Variant("fp32", "fp32", model, "source"))
    return variants, model
