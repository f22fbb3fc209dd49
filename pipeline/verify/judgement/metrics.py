"""Numeric comparison of one output against its fp32 reference, and the pass/fail judgement.

Metric names are the keys used in report.json: `max_abs`, `max_abs_of_range` (max abs error as a
fraction of the reference's value range: the figure fp16 accumulation error scales with), `rel_l2`,
`psnr_db` and `p999_abs_of_range` (images: the 99.9th percentile of |error| as a fraction of the
range, what a person can see, where `max_abs_of_range` is one pixel; `block_mae_of_range`, the
worst mean |error| over any 8x8 window of the last two axes as a fraction of the range, which sees a
wrong patch too small for the 99.9th percentile), `snr_db` and `seg_snr_db`
(audio: SNR over the whole signal, and the mean SNR of 256-sample segments, each clamped to
[-10, 35] dB, so a quiet passage that breaks is not hidden by loud ones), `nan`/`inf` (non-finite
values the reference does not have), `shape_ok`, and `identical` (true when the output equals the
reference exactly: its dB figures would be infinite, which JSON cannot hold, so they are left out). Integer images (uint8 pixels) also get `one_level_share` (the share of elements exactly one level off: float rounding
inside the model flips a rounding step on some of them) and their `p999_abs_of_range` and
`block_mae_of_range` count only errors beyond one level. Threshold keys are the same names: upper bounds for
errors, lower bounds for dB figures. docs/precision.md has the measurements behind the defaults.

An output that stacks quantities of different scales (a detection head's boxes 0..320 beside its
scores 0..1) is compared per part (`parts`: {"axis", "slices": [[start, stop], ...]}, a stop of None
meaning the end): `max_abs_of_range` and `rel_l2` are each part's error over that part's own range
and norm, the worst part reported (`worst_part`, its index), so a score error is not diluted by the
boxes' range.

A degenerate reference (constant, all zero, non-finite, or a spread within a few fp32 rounding
steps of its magnitude) cannot tell a right output from a wrong one: `verdict` makes such a check
`not-verifiable` with the reason, never `passed` (`degenerate_reference` says why).
"""

from __future__ import annotations

import math

import numpy as np

# higher is better; every other threshold is an upper bound (the last four: decision checks, decisions.py)
LOWER_BOUNDS = ("psnr_db", "snr_db", "seg_snr_db", "min_iou", "mask_agreement", "cosine", "top1_agreement")
SEGMENT = 256  # samples per segment of the segmental SNR (16 ms at 16 kHz)
SEG_SNR_RANGE = (-10.0, 35.0)  # the usual per-segment clamp: silence cannot dominate the mean
BLOCK = 8  # pixels per side of the blocks of block_mae_of_range
# A reference whose values spread over at most this many fp32 rounding steps of its magnitude is as
# good as constant: any output near that constant passes, right or wrong.
DEGENERATE_SPREAD_STEPS = 16
FP32_EPS = float(np.finfo(np.float32).eps)
FP32_TINY = float(np.finfo(np.float32).tiny)


def _exact_compare(reference: np.ndarray, kind: str) -> bool:
    """Integer tensors (ids, indices, flags) must match exactly; an integer image or waveform is a
    quantized measurement, judged like floats."""
    return (reference.dtype.kind in "biu" or reference.dtype == np.bool_) and kind == "tensor"


def degenerate_reference(reference: np.ndarray, kind: str = "tensor") -> str | None:
    """Why `reference` cannot tell a right output from a wrong one, or None when it can. Exactly
    compared integer tensors are never degenerate; a one-element output is judged against its
    magnitude, so only a zero one is."""
    reference = np.asarray(reference)
    if reference.size == 0 or _exact_compare(reference, kind):
        return None
    values = reference.astype(np.float64)
    finite = np.isfinite(values)
    if not finite.all():
        return f"{values.size - int(np.count_nonzero(finite))} of its {values.size} values are NaN or Inf"
    low, high = float(values.min()), float(values.max())
    magnitude = max(abs(low), abs(high))
    if magnitude < FP32_TINY:
        return f"all {values.size} of its values are 0" if magnitude == 0 else f"all {values.size} of its values are below fp32's normal range (under {FP32_TINY:.3g})"
    if values.size == 1:
        return None
    if low == high:
        return f"all {values.size} of its values are {low:.6g} (constant)"
    spread = high - low
    if spread <= DEGENERATE_SPREAD_STEPS * FP32_EPS * magnitude:
        return f"its {values.size} values span only {spread:.3g} around {magnitude:.6g}, within {DEGENERATE_SPREAD_STEPS} fp32 rounding steps (as good as constant)"
    return None


def compare(reference: np.ndarray, actual: np.ndarray, kind: str = "tensor", parts: dict | None = None) -> dict:
    """Error figures of `actual` against `reference` (both are converted to float64); `parts`: the
    slices normalised each by its own range (module docstring)."""
    reference = np.asarray(reference)
    actual = np.asarray(actual)
    metrics: dict = {"shape_ok": tuple(reference.shape) == tuple(actual.shape)}
    if not metrics["shape_ok"]:
        metrics["shape"] = list(actual.shape)
        metrics["expected_shape"] = list(reference.shape)
        return metrics
    if _exact_compare(reference, kind):
        mismatches = int(np.count_nonzero(reference != actual))
        metrics.update(mismatches=mismatches, max_abs=float(np.max(np.abs(reference.astype(np.float64) - actual.astype(np.float64)), initial=0.0)),
                       identical=mismatches == 0)
        return metrics
    ref = reference.astype(np.float64)
    act = actual.astype(np.float64)
    ref_finite = np.isfinite(ref)
    metrics["nan"] = int(np.count_nonzero(np.isnan(act) & ~np.isnan(ref)))
    metrics["inf"] = int(np.count_nonzero(np.isinf(act) & ~np.isinf(ref)))
    both = ref_finite & np.isfinite(act)
    diff = np.where(both, act - ref, 0.0)
    ref_f = np.where(ref_finite, ref, 0.0)
    max_abs = float(np.max(np.abs(diff), initial=0.0))
    # the reference's own span (as compare.js computes it), not widened to include zero
    # the span of the reference's values and zero: a constant or one-element output (an energy, a
    # score) is judged against its magnitude, not against a zero span (compare.js does the same)
    value_range = float(max(np.max(ref_f), 0.0) - min(np.min(ref_f), 0.0)) if ref_f.size else 0.0
    # sums of squares without BLAS: np.linalg.norm goes through a threaded dot that stalls for
    # seconds per call on a loaded machine (the node audit compares hundreds of outputs)
    ref_norm = math.sqrt(float(np.sum(np.square(ref_f))))
    err_norm = math.sqrt(float(np.sum(np.square(diff))))
    metrics["max_abs"] = max_abs
    metrics["identical"] = err_norm == 0 and not metrics["nan"] and not metrics["inf"]
    metrics["max_abs_of_range"] = max_abs / value_range if value_range > 0 else (0.0 if max_abs == 0 else math.inf)
    metrics["rel_l2"] = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    if parts:
        _worst_part(metrics, ref_f, diff, parts)
    if reference.dtype.kind in "iu" and kind == "image":
        steps = np.abs(diff)
        metrics["one_level_share"] = float(np.count_nonzero(steps == 1)) / max(diff.size, 1)
        beyond = np.where(steps <= 1, 0.0, steps)  # one rounding step is judged by its share alone
    else:
        beyond = np.abs(diff)
    if kind == "image":
        mse = err_norm**2 / max(diff.size, 1)
        peak = value_range if value_range > 0 else 1.0
        if mse > 0:  # no error: an infinite figure, left out (JSON has no infinity)
            metrics["psnr_db"] = round(10 * math.log10(peak**2 / mse), 3)
        p999 = float(np.percentile(beyond, 99.9)) if diff.size else 0.0
        metrics["p999_abs_of_range"] = p999 / peak
        metrics["block_mae_of_range"] = _worst_block_mae(beyond) / peak
    elif kind == "audio":
        if err_norm > 0:  # no error: infinite figures, left out (JSON has no infinity)
            metrics["snr_db"] = round(20 * math.log10(max(ref_norm, 1e-30) / err_norm), 3)
            metrics["seg_snr_db"] = _segmental_snr(ref_f, diff)
    for key in ("max_abs_of_range", "rel_l2"):
        if math.isinf(metrics[key]):
            metrics[key] = 1e9
    return metrics


def part_views(array: np.ndarray, parts: dict) -> list[np.ndarray]:
    """The slices of `array` that `parts` names (stops past the end are cut; empty slices left out)."""
    axis = parts["axis"] % array.ndim if array.ndim else 0
    size = array.shape[axis] if array.ndim else 1
    views = []
    for start, stop in parts["slices"]:
        stop = size if stop is None else min(stop, size)
        if start < stop:
            views.append(np.take(array, np.arange(start, stop), axis=axis))
    return views


def _worst_part(metrics: dict, ref: np.ndarray, diff: np.ndarray, parts: dict) -> None:
    """`max_abs_of_range` and `rel_l2` as the worst over `parts`, each against its own range and
    norm (the span with zero, as for the whole output), and `worst_part`."""
    worst = (-1.0, -1.0, 0)
    for index, (ref_part, diff_part) in enumerate(zip(part_views(ref, parts), part_views(diff, parts))):
        span = float(max(np.max(ref_part), 0.0) - min(np.min(ref_part), 0.0))
        max_abs = float(np.max(np.abs(diff_part), initial=0.0))
        of_range = max_abs / span if span > 0 else (0.0 if max_abs == 0 else math.inf)
        ref_norm = math.sqrt(float(np.sum(np.square(ref_part))))
        err_norm = math.sqrt(float(np.sum(np.square(diff_part))))
        rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
        if of_range > worst[0] or (of_range == worst[0] and rel > worst[1]):
            worst = (of_range, rel, index)
        metrics["rel_l2"] = max(metrics["rel_l2"], rel) if index else rel
    if worst[0] >= 0:
        metrics["max_abs_of_range"], metrics["worst_part"] = worst[0], worst[2]


def _worst_block_mae(error: np.ndarray) -> float:
    """The largest mean of `error` over any BLOCK x BLOCK window of the last two axes (every
    position, so a patch is seen wherever it lies; a 1-D output has windows of BLOCK² values)."""
    if error.size == 0:
        return 0.0
    rows = error.reshape(-1, *error.shape[-2:]) if error.ndim >= 2 else error.reshape(1, 1, -1)
    bh = min(BLOCK, rows.shape[1]) if error.ndim >= 2 else 1
    bw = min(BLOCK if error.ndim >= 2 else BLOCK * BLOCK, rows.shape[2])
    integral = np.zeros((rows.shape[0], rows.shape[1] + 1, rows.shape[2] + 1))
    integral[:, 1:, 1:] = rows.cumsum(axis=1).cumsum(axis=2)
    sums = integral[:, bh:, bw:] - integral[:, :-bh, bw:] - integral[:, bh:, :-bw] + integral[:, :-bh, :-bw]
    return float(sums.max() / (bh * bw))


def _segmental_snr(reference: np.ndarray, diff: np.ndarray) -> float:
    """Mean per-segment SNR along the last axis (segments of SEGMENT samples, the tail too), each
    clamped to SEG_SNR_RANGE; segments that are silent in both are skipped."""
    ref = reference.reshape(-1, reference.shape[-1]) if reference.ndim else reference.reshape(1, 1)
    err = diff.reshape(ref.shape)
    low, high = SEG_SNR_RANGE
    figures = []
    for row_ref, row_err in zip(ref, err):
        for start in range(0, row_ref.size, SEGMENT):
            signal = float(np.sum(row_ref[start:start + SEGMENT] ** 2))
            noise = float(np.sum(row_err[start:start + SEGMENT] ** 2))
            if signal == 0 and noise == 0:
                continue
            db = high if noise == 0 else (low if signal == 0 else 10 * math.log10(signal / noise))
            figures.append(min(max(db, low), high))
    return round(float(np.mean(figures)), 3) if figures else high


def figure(value: float, bound: float) -> str:
    """`value` to 3 significant digits, or as many more as tell it from `bound` and keep a value
    that is not whole from reading as one (a cosine of 0.99997 against a bound of 1, or a mask
    agreement of 0.99997, reads "0.99997", not "1")."""
    for digits in range(3, 12):
        shown = f"{value:.{digits}g}"
        rounded_whole = float(shown) == round(float(shown)) and float(shown) != value
        if value == bound or (shown != f"{bound:.{digits}g}" and not rounded_whole):
            return shown
    return repr(value)


def judge(metrics: dict, threshold: dict) -> tuple[bool, str | None]:
    """(passed, reason). A wrong shape or new NaN/Inf fails whatever the thresholds say."""
    if not metrics.get("shape_ok", False):
        return False, f"shape {metrics.get('shape')} != expected {metrics.get('expected_shape')}"
    if metrics.get("nan", 0) or metrics.get("inf", 0):
        return False, f"{metrics.get('nan', 0)} NaN and {metrics.get('inf', 0)} Inf values that the reference does not have"
    if metrics.get("mismatches"):
        return False, f"{metrics['mismatches']} elements differ"
    for key, bound in threshold.items():
        if key not in metrics:
            continue
        value = metrics[key]
        if key in LOWER_BOUNDS:
            if value < bound:
                return False, f"{key} {figure(value, bound)} < {bound:g}"
        elif value > bound:
            return False, f"{key} {figure(value, bound)} > {bound:g}"
    return True, None


def verdict(reference: np.ndarray, actual: np.ndarray, kind: str, threshold: dict, parts: dict | None = None) -> tuple[dict, str, str | None]:
    """(figures, status, why not passed) of one output: `failed` on a wrong shape, new NaN/Inf or a
    figure past its bound; `not-verifiable` when the reference is degenerate (whatever the figures
    say, unless the output is broken in a way no reference excuses); else `passed`."""
    metrics = compare(reference, actual, kind, parts)
    passed, reason = judge(metrics, threshold)
    broken = not metrics.get("shape_ok", False) or metrics.get("nan", 0) or metrics.get("inf", 0)
    degenerate = None if broken else degenerate_reference(reference, kind)
    if degenerate:
        return metrics, "not-verifiable", f"degenerate fp32 reference: {degenerate}; a comparison with it cannot tell a right output from a wrong one: give a sample that exercises the model (--inputs)"
    return metrics, "passed" if passed else "failed", reason


def format_metrics(metrics: dict, threshold: dict) -> str:
    """One human line: each thresholded figure next to its bound ("identical" for an exact match)."""
    if metrics.get("identical") and metrics.get("shape_ok", True):
        return "identical to the reference"
    parts = []
    for key, bound in threshold.items():
        if key in metrics:
            op = ">=" if key in LOWER_BOUNDS else "<="
            parts.append(f"{key} {figure(metrics[key], bound)} ({op} {bound:g})")
    if not metrics.get("shape_ok", True):
        parts.append(f"shape {metrics.get('shape')} vs {metrics.get('expected_shape')}")
    return ", ".join(parts)
