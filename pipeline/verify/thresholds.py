"""Default pass thresholds per output kind, precision and execution provider.

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
# Precisions that are not float (quantized uint8/int8 shipped as-is) are compared loosely.
_QUANTIZED = {"max_abs_of_range": 0.1, "rel_l2": 0.1}


def threshold_for(kind: str, precision: str, ep: str, override: dict | None = None) -> dict:
    """The bounds one output check must meet; `override` (from the recipe) wins key by key."""
    if precision in ("fp32", "fp16", "fp16w"):
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
    if override:
        bounds.update(override)
    return bounds
