"""The bounds every check is judged against, per (stage, EP, variant, output kind): the defaults
per output kind, precision and execution provider, the recipe's overrides, the widening of fp16 on
WebGPU, the manifest's `thresholds` table and how `pack verify` reads it back. The check record
and the comparison are pipeline/verify/judgement/checks.py; the figures pipeline/verify/judgement/metrics.py.

Which bounds a check uses (`check_bounds`): the host stage (onnxruntime CPU) the cpu defaults; the
browser on wasm the wasm defaults; the browser on webgpu and the `webgpu-kernels` stage the wasm
bounds widened, for fp16, to at least the WebGPU defaults (`webgpu_aware_threshold`). A recipe's
override (`outputs.<name>.thresholds.<variant>`) replaces the default key by key before widening.

fp32 anywhere should match the CPU reference to float rounding. fp16 on the CPU/wasm accumulates in
fp32 and lands ~0.03–0.1 % of the output range away; onnxruntime-web's WebGPU kernels accumulate in
fp16 and land ~1–2 % away on 1024-long reductions (docs/precision.md), so webgpu fp16 gets 3 % of the
range: loose enough for real accumulation error, tight enough that zeros, wrong slices or overflow
(errors of order 100 % of the range) still fail.

fp16w (fp32 kernels, weights stored as fp16, pipeline/precision/fp16w.py) differs from fp32 by weight
rounding only: each weight moves by at most 2^-11 ≈ 4.9e-4 of itself (≈ 2.8e-4 RMS), and independent
rounding errors add up as √(depth) times the cancellation gain of each layer. Its bounds allow ten
times the unit roundoff (5e-3, half of fp16's CPU bounds, which round activations too) and are the
same on every EP, since no kernel computes in fp16. Measured on the eight flagship-architecture
exports (scripts/bench/measure_fp16w.py, random inputs, onnxruntime CPU): rel_l2 ≤ 6.2e-4, max_abs_of_range
≤ 4.0e-4 (docs/precision.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.recipe import NUMERIC_KIND
from pipeline.verify.judgement.decisions import DECISION_KINDS
from pipeline.verify.judgement.metrics import LOWER_BOUNDS

if TYPE_CHECKING:
    from pipeline.precision.variants import Variant
    from pipeline.recipe import Recipe

BROWSER_EPS = ("wasm", "webgpu")
FLOAT_PRECISIONS = ("fp32", "fp16", "fp16w")  # every other precision (quantized) is compared loosely
# A quantized source without a float twin is its own reference: its host check bounds non-finite values only.
SELF_REFERENCE_BOUNDS = {"nan": 0, "inf": 0}

_BASE = {
    # (precision, accumulates in fp16) -> bounds
    ("fp32", False): {"max_abs_of_range": 1e-3, "rel_l2": 1e-3},
    ("fp16", False): {"max_abs_of_range": 1e-2, "rel_l2": 1e-2},
    ("fp16", True): {"max_abs_of_range": 3e-2, "rel_l2": 3e-2},
    ("fp16w", False): {"max_abs_of_range": 5e-3, "rel_l2": 5e-3},
}
_DB_BOUNDS = {
    "image": {"fp32": {"psnr_db": 60.0}, "fp16": {"psnr_db": 35.0}, "fp16w": {"psnr_db": 45.0}},
    "audio": {"fp32": {"snr_db": 50.0, "seg_snr_db": 30.0}, "fp16": {"snr_db": 25.0, "seg_snr_db": 20.0}, "fp16w": {"snr_db": 35.0, "seg_snr_db": 25.0}},
}
# Images (docs/precision.md, "Calibration"): the 99.9th percentile of |error| replaces the single
# worst pixel; fp16 that is visually lossless (PSNR >= 50 dB) has a few levels of 255 there, so fp16
# allows 5 levels (2e-2). The worst 8x8 block's mean |error| sees a wrong patch too small for the
# percentile (an 8x8 patch is 0.02 % of a 512x512 image): 2.5 levels on average over a block for fp16.
_IMAGE_P999 = {"fp32": 1e-3, "fp16": 2e-2, "fp16w": 5e-3}
_IMAGE_BLOCK = {"fp32": 1e-3, "fp16": 1e-2, "fp16w": 5e-3}
# Integer images (uint8): float rounding inside the model flips a rounding step on some pixels
# (MI-GAN 512²: 0.19-0.26 % one level off in fp16); one level is allowed on this share, errors beyond
# one level are judged by the bounds above.
_ONE_LEVEL_SHARE = {"fp32": 5e-3, "fp16": 2e-2, "fp16w": 1e-2}
# Precisions that are not float (quantized uint8/int8 shipped as-is) are compared loosely: against
# their dequantized twin (pipeline/precision/dequantize.py) the 8-bit activations' rounding adds up
# layer by layer (ISNet's 119 dynamically quantized convs, 2026-12-03: on uniform noise rel_l2 0.12,
# max 0.15 of range on its mask, 0.15 and 0.26 on a side output; on its recipe's image-pattern
# sample max 0.62 of range on the mask, rel_l2 0.45 on a side output, and 99.8 % of the mask's
# pixels on the same side of 0.5); the bounds still fail zeros, wrong slices and overflow, whose
# errors are of order 100 % of the range (zeros: rel_l2 1).
_QUANTIZED = {"max_abs_of_range": 0.75, "rel_l2": 0.5}
# Decisions (decisions.py): no flip beyond a near-tie, and one near-tie (a flip no numeric bound could
# keep: fp32's margin is within the error the variant is allowed) per output; more must be allowed by
# the recipe, which sees each one reported with its margin. Boxes: fp16's error of 1e-2 of a 0..320
# range is 3 px, an IoU of ~0.9 on a 30 px box; scores move by about the error bound. Embeddings: fp16
# rounding (2^-11 per value) leaves a cosine of ~0.99999; 0.999 still fails a wrong vector.
_NEAR_TIES = {"flips": 0, "near_ties": 1}
_DECISION = {
    "detection": {"fp32": {"min_iou": 0.99, "score_diff": 1e-3}, "fp16": {"min_iou": 0.9, "score_diff": 2e-2}, "fp16w": {"min_iou": 0.95, "score_diff": 1e-2}},
    "mask": {"fp32": {"mask_agreement": 0.9999}, "fp16": {"mask_agreement": 0.999}, "fp16w": {"mask_agreement": 0.999}, "quantized": {"mask_agreement": 0.995}},
    "embedding": {"fp32": {"cosine": 0.99999}, "fp16": {"cosine": 0.999}, "fp16w": {"cosine": 0.9995}},
}
# fp16 on WebGPU accumulates in fp16 (3x the error, as for the numeric bounds)
_DECISION_WEBGPU_FP16 = {"detection": {"min_iou": 0.85, "score_diff": 5e-2}, "embedding": {"cosine": 0.995}}


def decision_bounds(kind: str, precision: str, ep: str) -> dict:
    """The default bounds of the decision check of an output of `kind` (none for a kind that decides nothing)."""
    if kind not in DECISION_KINDS:
        return {}
    bounds = dict(_NEAR_TIES) if kind != "mask" else {}
    by_precision = _DECISION.get(kind, {})
    bounds.update(by_precision.get(precision, by_precision.get("fp16", {})))
    if precision == "fp16" and ep == "webgpu":
        bounds.update(_DECISION_WEBGPU_FP16.get(kind, {}))
    return bounds


def threshold_for(kind: str, precision: str, ep: str, override: dict | None = None) -> dict:
    """The default bounds of an output of `kind` (pipeline/recipe.py OUTPUT_KINDS) in `precision` on
    `ep` (cpu, wasm, webgpu): its numbers' (by its NUMERIC_KIND) and its decision's; `override`
    (from the recipe) wins key by key."""
    decision = decision_bounds(kind, precision, ep)
    kind = NUMERIC_KIND.get(kind, "tensor")
    if precision in FLOAT_PRECISIONS:
        fp16_accumulation = precision == "fp16" and ep == "webgpu"
        bounds = dict(_BASE[(precision, fp16_accumulation)])
        if kind in _DB_BOUNDS:
            # For images and audio the dB figure carries the same information as rel_l2
            # (SNR = -20·log10(rel_l2)) in the units their users judge quality in.
            del bounds["rel_l2"]
            bounds.update(_DB_BOUNDS[kind][precision])
        if kind == "image":
            # One pixel off by a few levels is invisible; a patch of wrong pixels (0.1 % of them) is not.
            del bounds["max_abs_of_range"]
            bounds["p999_abs_of_range"] = _IMAGE_P999[precision] * (3 if fp16_accumulation else 1)
            bounds["block_mae_of_range"] = _IMAGE_BLOCK[precision] * (3 if fp16_accumulation else 1)
            bounds["one_level_share"] = _ONE_LEVEL_SHARE[precision]
        if fp16_accumulation and kind in _DB_BOUNDS:
            for key in _DB_BOUNDS[kind]["fp16"]:
                bounds[key] = bounds[key] - 10.0
    else:
        bounds = dict(_QUANTIZED)
    bounds.update(decision)
    if override:
        bounds.update(override)
    return bounds


def webgpu_aware_threshold(threshold: dict, kind: str, precision: str, ep: str) -> dict:
    """`threshold`, each bound widened to at least the WebGPU fp16 default when fp16 runs on WebGPU.

    onnxruntime-web's WebGPU kernels accumulate fp16 in fp16 (1-2 % of the largest output on long
    reductions), which host (CPU, fp32-accumulating) thresholds do not allow for. The default still
    fails zeros, wrong slices and overflow, whose errors are of order 100 % of the range.
    """
    if not (ep == "webgpu" and precision == "fp16"):
        return dict(threshold)
    webgpu = threshold_for(kind, precision, ep)
    widened = dict(threshold)
    for key, bound in webgpu.items():
        if key in widened:
            widened[key] = min(widened[key], bound) if key in LOWER_BOUNDS else max(widened[key], bound)
    return widened


def check_bounds(kind: str, precision: str, ep: str, override: dict | None = None) -> dict:
    """The bounds of one output's check on `ep`: "cpu" the host stage's; "wasm" and "webgpu" the
    browser's (the wasm bounds, fp16 widened on webgpu), which the `webgpu-kernels` stage uses too."""
    if ep == "cpu":
        return threshold_for(kind, precision, ep, override)
    return webgpu_aware_threshold(threshold_for(kind, precision, "wasm", override), kind, precision, ep)


def output_kind(recipe: Recipe, output: str) -> str:
    """The recipe's numeric kind of `output` (image, audio, tensor: how metrics.py compares it)."""
    spec = recipe.outputs.get(output)
    return spec.numeric_kind if spec else "tensor"


def output_judging(recipe: Recipe, output: str) -> dict:
    """How `output` is judged besides its bounds: its `decision` and `parts` (pipeline/recipe.py
    OutputSpec; the manifest output's keys of the same names), each None when it has none."""
    spec = recipe.outputs.get(output)
    return {"decision": spec.decision(), "parts": spec.part_slices()} if spec else {"decision": None, "parts": None}


def recipe_bounds(recipe: Recipe, variant: str, precision: str, output: str, ep: str) -> dict:
    """`check_bounds` of one output of a variant, with the recipe's override for that variant."""
    spec = recipe.outputs.get(output)
    override = spec.thresholds.get(variant) if spec else None
    return check_bounds(spec.kind if spec else "tensor", precision, ep, override)


def search_bounds(recipe: Recipe, output: str, ep: str) -> dict:
    """The bounds an fp16 candidate's output must meet in the keep-in-fp32 search on `ep` ("cpu"
    for the host, "webgpu" for the WebGPU kernels): the fp16 defaults there with the recipe's fp16
    override (not widened: an override tighter than the WebGPU default holds in the search)."""
    spec = recipe.outputs.get(output)
    return threshold_for(spec.kind if spec else "tensor", "fp16", ep, spec.thresholds.get("fp16") if spec else None)


def node_bounds(precision: str) -> dict:
    """The bound a node's output must meet in the node audit (the `webgpu-kernels` stage of a model
    too heavy to run whole): a "tensor" output's WebGPU `max_abs_of_range` bound of `precision`,
    taken against the output tensor's scale."""
    return {"max_abs_of_scale": threshold_for("tensor", precision, "webgpu")["max_abs_of_range"]}


def ep_thresholds(variants: list[Variant], outputs: list[str], recipe: Recipe, ep: str) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] of the checks on `ep` (see `check_bounds`)."""
    return {v.name: {name: recipe_bounds(recipe, v.name, v.precision, name, ep) for name in outputs} for v in variants}


def threshold_table(variants: list[Variant], outputs: list[str], recipe: Recipe, variant_for: dict[str, list[str]]) -> dict[str, dict[str, dict[str, dict]]]:
    """manifest `thresholds[ep][variant][output]`: exactly the bounds the build's checks use: the
    host checks' (cpu), and the browser's for every variant on each EP a chain has (the browser
    checks every variant an EP can be asked for: plan_runs, wasm x fp16 too); webgpu's are also the
    `webgpu-kernels` stage's. The browser harness takes this table as it is."""
    table: dict[str, dict[str, dict[str, dict]]] = {"cpu": {}}
    for variant in variants:
        table["cpu"][variant.name] = {
            name: dict(SELF_REFERENCE_BOUNDS) if variant.self_reference else recipe_bounds(recipe, variant.name, variant.precision, name, "cpu")
            for name in outputs
        }
    for ep in BROWSER_EPS:
        if ep in variant_for:
            table[ep] = ep_thresholds(variants, outputs, recipe, ep)
    return table


def manifest_kind(output: dict) -> str:
    """A manifest output's kind as a recipe states it: its decision's, else its numeric `kind`."""
    return (output.get("decision") or {}).get("kind") or output.get("kind", "tensor")


def manifest_judging(manifest: dict) -> dict[str, dict]:
    """Per manifest output, how it is judged besides its bounds, as output_judging gives it from a
    recipe: its `decision` and `parts` (None each when it has none)."""
    return {output["name"]: {"decision": output.get("decision"), "parts": output.get("parts")} for output in manifest["outputs"]}


def recorded_thresholds(manifest: dict) -> dict[str, dict[str, dict[str, dict]]]:
    """thresholds[ep][variant][output] for the browser checks of a built package (`pack verify`):
    the bounds the build checked, from the manifest (its wasm bounds, else its webgpu ones), else
    the defaults; fp16 widened on webgpu as the build widened it."""
    recorded = manifest.get("thresholds") or {}
    table: dict[str, dict[str, dict[str, dict]]] = {ep: {} for ep in BROWSER_EPS}
    for variant, spec in manifest["variants"].items():
        precision = spec.get("precision", "fp32")
        for ep in BROWSER_EPS:
            table[ep][variant] = {}
        for output in manifest["outputs"]:
            name, kind = output["name"], manifest_kind(output)
            bounds = next((recorded[ep][variant][name] for ep in BROWSER_EPS if name in recorded.get(ep, {}).get(variant, {})), None)
            base = dict(bounds) if bounds else threshold_for(kind, precision, "wasm")
            for ep in BROWSER_EPS:
                table[ep][variant][name] = webgpu_aware_threshold(base, kind, precision, ep)
    return table


def recorded_kernel_thresholds(manifest: dict, outputs: list[str]) -> dict[str, dict[str, dict]]:
    """thresholds[variant][output] for the `webgpu-kernels` checks of a built package's float
    variants: the WebGPU bounds the build recorded in the manifest, else the defaults."""
    recorded = (manifest.get("thresholds") or {}).get("webgpu") or {}
    kinds = {output["name"]: manifest_kind(output) for output in manifest["outputs"]}
    table: dict[str, dict[str, dict]] = {}
    for name, variant in manifest["variants"].items():
        precision = variant.get("precision", "fp32")
        if precision not in FLOAT_PRECISIONS:
            continue
        table[name] = {output: recorded.get(name, {}).get(output) or threshold_for(kinds.get(output, "tensor"), precision, "webgpu") for output in outputs}
    return table
