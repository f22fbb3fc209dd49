// Output comparison with the build's fp32 reference, the same figures as pipeline/verify/metrics.py:
// max_abs, max_abs_of_range, rel_l2, psnr_db, p999_abs_of_range and block_mae_of_range (images:
// the worst mean error over any 8x8 window;
// integer images also one_level_share, their p99.9 and block figures counting errors beyond one
// level only), snr_db and seg_snr_db (audio), nan/inf, shape_ok, identical (an exact match: its
// dB figures would be infinite and are left out); thresholds are upper bounds except the dB
// figures (lower bounds). A degenerate reference (constant, all zero, non-finite, or a spread within
// a few fp32 rounding steps) cannot tell a right output from a wrong one: degenerateReference says
// why, and compareOutputs calls such an output not verifiable, never passed. An output that stacks
// quantities of different scales (the manifest output's `parts`: { axis, slices }) has its
// max_abs_of_range and rel_l2 taken per part against the part's own range, the worst reported
// (worst_part), as metrics.py does.

import { numbers } from './tensors.js';
// decisions.js uses this module's judge: a cycle ES modules resolve (both export hoisted functions)
import { decide } from './decisions.js';

// the last four: decision checks (pipeline/verify/judgement/decisions.py)
export const LOWER_BOUNDS = Object.freeze(['psnr_db', 'snr_db', 'seg_snr_db', 'min_iou', 'mask_agreement', 'cosine', 'top1_agreement']);
const SEGMENT = 256; // samples per segment of the segmental SNR
const SEG_SNR_RANGE = [-10, 35]; // per-segment clamp: silence cannot dominate the mean
const BLOCK = 8; // pixels per side of the blocks of block_mae_of_range
const INTEGER_TYPES = ['int8', 'uint8', 'int16', 'uint16', 'int32', 'uint32', 'int64', 'uint64', 'bool'];
const DEGENERATE_SPREAD_STEPS = 16; // fp32 rounding steps of the magnitude: as good as constant
const FP32_EPS = 2 ** -23;
const FP32_TINY = 2 ** -126;

const roundDb = (value) => Math.round(value * 1000) / 1000;
const exactCompare = (reference, kind) => INTEGER_TYPES.includes(reference.type) && kind === 'tensor';

/** Why `reference` cannot tell a right output from a wrong one, or null (metrics.py degenerate_reference). */
export function degenerateReference(reference, kind = 'tensor') {
  const values = numbers(reference);
  if (values.length === 0 || exactCompare(reference, kind)) return null;
  let bad = 0;
  let low = Infinity;
  let high = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = Number(values[i]);
    if (!Number.isFinite(v)) bad++;
    else {
      if (v < low) low = v;
      if (v > high) high = v;
    }
  }
  if (bad) return `${bad} of its ${values.length} values are NaN or Inf`;
  const magnitude = Math.max(Math.abs(low), Math.abs(high));
  if (magnitude < FP32_TINY) return magnitude === 0 ? `all ${values.length} of its values are 0` : `all ${values.length} of its values are below fp32's normal range`;
  if (values.length === 1) return null;
  if (low === high) return `all ${values.length} of its values are ${g(low)} (constant)`;
  const spread = high - low;
  if (spread <= DEGENERATE_SPREAD_STEPS * FP32_EPS * magnitude) {
    return `its ${values.length} values span only ${g(spread)} around ${g(magnitude)}, within ${DEGENERATE_SPREAD_STEPS} fp32 rounding steps (as good as constant)`;
  }
  return null;
}

const sameDims = (a, b) => a.length === b.length && a.every((d, i) => Number(d) === Number(b[i]));

/** Error figures of `actual` against `reference` ({ data, dims, type } each); `parts` ({ axis,
 * slices: [[start, stop|null], ...] }) or null: the slices normalised each by its own range. */
export function compareTensor(reference, actual, kind = 'tensor', parts = null) {
  const metrics = { shape_ok: sameDims(Array.from(reference.dims), Array.from(actual.dims)) };
  if (!metrics.shape_ok) {
    metrics.shape = Array.from(actual.dims, Number);
    metrics.expected_shape = Array.from(reference.dims, Number);
    return metrics;
  }
  const ref = numbers(reference);
  const act = numbers(actual);
  // Integer tensors (ids, flags) must match exactly; an integer image or waveform is judged like floats.
  if (exactCompare(reference, kind)) {
    let mismatches = 0;
    let maxAbs = 0;
    for (let i = 0; i < ref.length; i++) {
      const d = Math.abs(Number(ref[i]) - Number(act[i]));
      if (d !== 0) mismatches++;
      if (d > maxAbs) maxAbs = d;
    }
    return Object.assign(metrics, { mismatches, max_abs: maxAbs, identical: mismatches === 0 });
  }
  let nan = 0;
  let inf = 0;
  let maxAbs = 0;
  let min = Infinity;
  let max = -Infinity;
  let refSquares = 0;
  let errSquares = 0;
  const diffs = new Float64Array(ref.length);
  const refs = new Float64Array(ref.length);
  for (let i = 0; i < ref.length; i++) {
    const r = ref[i];
    const a = act[i];
    if (Number.isNaN(a) && !Number.isNaN(r)) nan++;
    const aInf = a === Infinity || a === -Infinity;
    const rInf = r === Infinity || r === -Infinity;
    if (aInf && !rInf) inf++;
    const rf = Number.isFinite(r) ? r : 0;
    const d = Number.isFinite(r) && Number.isFinite(a) ? a - r : 0;
    diffs[i] = d;
    refs[i] = rf;
    if (Math.abs(d) > maxAbs) maxAbs = Math.abs(d);
    if (rf < min) min = rf;
    if (rf > max) max = rf;
    refSquares += rf * rf;
    errSquares += d * d;
  }
  // the span of the reference's values and zero (as metrics.py): a constant or one-element output
  // is judged against its magnitude, not against a zero span
  const range = ref.length ? Math.max(max, 0) - Math.min(min, 0) : 0;
  const refNorm = Math.sqrt(refSquares);
  const errNorm = Math.sqrt(errSquares);
  Object.assign(metrics, { nan, inf, max_abs: maxAbs, identical: errNorm === 0 && nan === 0 && inf === 0 });
  metrics.max_abs_of_range = range > 0 ? maxAbs / range : maxAbs === 0 ? 0 : Infinity;
  metrics.rel_l2 = refNorm > 0 ? errNorm / refNorm : errNorm === 0 ? 0 : Infinity;
  if (parts) worstPart(metrics, refs, diffs, Array.from(reference.dims, Number), parts);
  if (kind === 'image') {
    const mse = errNorm ** 2 / Math.max(ref.length, 1);
    const peak = range > 0 ? range : 1;
    let beyond = diffs.map(Math.abs);
    if (INTEGER_TYPES.includes(reference.type) && reference.type !== 'bool') {
      // one rounding step is judged by its share alone
      metrics.one_level_share = beyond.filter((d) => d === 1).length / Math.max(beyond.length, 1);
      beyond = beyond.map((d) => (d <= 1 ? 0 : d));
    }
    if (mse > 0) metrics.psnr_db = roundDb(10 * Math.log10(peak ** 2 / mse)); // no error: infinite, left out
    metrics.p999_abs_of_range = percentile(beyond, 99.9) / peak;
    metrics.block_mae_of_range = worstBlockMae(beyond, Array.from(reference.dims, Number)) / peak;
  } else if (kind === 'audio') {
    if (errNorm > 0) { // no error: infinite figures, left out
      metrics.snr_db = roundDb(20 * Math.log10(Math.max(refNorm, 1e-30) / errNorm));
      const dims = Array.from(reference.dims, Number);
      metrics.seg_snr_db = segmentalSnr(refs, diffs, dims.length ? dims[dims.length - 1] : 1);
    }
  }
  for (const key of ['max_abs_of_range', 'rel_l2']) if (metrics[key] === Infinity) metrics[key] = 1e9;
  return metrics;
}

/** max_abs_of_range and rel_l2 as the worst over `parts`, each against its own range (the span
 * with zero) and norm, and worst_part (metrics.py _worst_part). */
function worstPart(metrics, refs, diffs, dims, parts) {
  const axis = dims.length ? ((parts.axis % dims.length) + dims.length) % dims.length : 0;
  const size = dims.length ? dims[axis] : 1;
  const stride = dims.slice(axis + 1).reduce((a, b) => a * b, 1);
  const slices = parts.slices
    .map(([start, stop]) => [start, stop === null || stop === undefined ? size : Math.min(stop, size)])
    .filter(([start, stop]) => start < stop);
  const figures = slices.map(() => ({ min: Infinity, max: -Infinity, maxAbs: 0, refSquares: 0, errSquares: 0 }));
  for (let i = 0; i < refs.length; i++) {
    const at = Math.floor(i / stride) % size;
    const index = slices.findIndex(([start, stop]) => at >= start && at < stop);
    if (index < 0) continue;
    const part = figures[index];
    const r = refs[i];
    const d = diffs[i];
    if (r < part.min) part.min = r;
    if (r > part.max) part.max = r;
    if (Math.abs(d) > part.maxAbs) part.maxAbs = Math.abs(d);
    part.refSquares += r * r;
    part.errSquares += d * d;
  }
  let worst = null;
  figures.forEach((part, index) => {
    const span = Math.max(part.max, 0) - Math.min(part.min, 0);
    const ofRange = span > 0 ? part.maxAbs / span : part.maxAbs === 0 ? 0 : Infinity;
    const refNorm = Math.sqrt(part.refSquares);
    const errNorm = Math.sqrt(part.errSquares);
    const rel = refNorm > 0 ? errNorm / refNorm : errNorm === 0 ? 0 : Infinity;
    if (worst === null || ofRange > worst.ofRange || (ofRange === worst.ofRange && rel > worst.rel)) worst = { ofRange, rel, index };
    metrics.rel_l2 = index ? Math.max(metrics.rel_l2, rel) : rel;
  });
  if (worst) {
    metrics.max_abs_of_range = worst.ofRange;
    metrics.worst_part = worst.index;
  }
}

/** numpy's default (linear) percentile. */
function percentile(values, q) {
  if (values.length === 0) return 0;
  const sorted = Float64Array.from(values).sort();
  const index = (q / 100) * (sorted.length - 1);
  const low = Math.floor(index);
  const high = Math.ceil(index);
  return sorted[low] + (sorted[high] - sorted[low]) * (index - low);
}

/** The largest mean error over any BLOCK x BLOCK window of the last two axes (a 1-D output has
 * windows of BLOCK² values), from an integral image, as metrics.py's _worst_block_mae. */
function worstBlockMae(error, dims) {
  if (error.length === 0) return 0;
  const [h, w] = dims.length >= 2 ? dims.slice(-2) : [1, error.length];
  const bh = dims.length >= 2 ? Math.min(BLOCK, h) : 1;
  const bw = Math.min(dims.length >= 2 ? BLOCK : BLOCK * BLOCK, w);
  let worst = 0;
  const integral = new Float64Array((h + 1) * (w + 1));
  for (let start = 0; start < error.length; start += h * w) {
    // cumulative sums along rows, then columns, in the order numpy's cumsum takes
    for (let i = 0; i < h; i++) {
      let row = 0;
      for (let j = 0; j < w; j++) {
        row += error[start + i * w + j];
        integral[(i + 1) * (w + 1) + j + 1] = row;
      }
    }
    for (let j = 1; j <= w; j++) for (let i = 1; i <= h; i++) integral[i * (w + 1) + j] += integral[(i - 1) * (w + 1) + j];
    for (let i = bh; i <= h; i++) {
      for (let j = bw; j <= w; j++) {
        const sum = integral[i * (w + 1) + j] - integral[(i - bh) * (w + 1) + j] - integral[i * (w + 1) + j - bw] + integral[(i - bh) * (w + 1) + j - bw];
        if (sum > worst) worst = sum;
      }
    }
  }
  return worst / (bh * bw);
}

/** Mean per-segment SNR along the last axis (rows of `row` samples), each clamped; silent segments skipped. */
function segmentalSnr(ref, diff, row) {
  const [low, high] = SEG_SNR_RANGE;
  const figures = [];
  for (let start = 0; start < ref.length; start += row) {
    for (let s = start; s < start + row; s += SEGMENT) {
      let signal = 0;
      let noise = 0;
      for (let i = s; i < Math.min(s + SEGMENT, start + row); i++) {
        signal += ref[i] * ref[i];
        noise += diff[i] * diff[i];
      }
      if (signal === 0 && noise === 0) continue;
      const db = noise === 0 ? high : signal === 0 ? low : 10 * Math.log10(signal / noise);
      figures.push(Math.min(Math.max(db, low), high));
    }
  }
  if (figures.length === 0) return high;
  return Math.round((figures.reduce((a, b) => a + b, 0) / figures.length) * 1000) / 1000;
}

const g = (value) => Number(Number(value).toPrecision(3)).toString();
// `value` to 3 significant digits, or as many more as tell it from `bound` and keep a value that
// is not whole from reading as one (metrics.py figure)
const near = (value, bound) => {
  const at = (x, digits) => Number(Number(x).toPrecision(digits));
  for (let digits = 3; digits < 12; digits++) {
    const shown = at(value, digits);
    const roundedWhole = Number.isInteger(shown) && shown !== value;
    if (value === bound || (shown !== at(bound, digits) && !roundedWhole)) return String(shown);
  }
  return String(value);
};

/** { passed, reason }: a wrong shape or new NaN/Inf fails whatever the thresholds say. */
export function judge(metrics, threshold = {}) {
  if (!metrics.shape_ok) return { passed: false, reason: `shape [${metrics.shape}] != expected [${metrics.expected_shape}]` };
  if (metrics.nan || metrics.inf) {
    return { passed: false, reason: `${metrics.nan || 0} NaN and ${metrics.inf || 0} Inf values that the reference does not have` };
  }
  if (metrics.mismatches) return { passed: false, reason: `${metrics.mismatches} elements differ` };
  for (const [key, bound] of Object.entries(threshold)) {
    if (!(key in metrics)) continue;
    const value = metrics[key];
    if (LOWER_BOUNDS.includes(key) ? value < bound : value > bound) {
      return { passed: false, reason: `${key} ${near(value, bound)} ${LOWER_BOUNDS.includes(key) ? '<' : '>'} ${g(bound)}` };
    }
  }
  return { passed: true, reason: null };
}

/** "rel_l2 2e-07 ≤ 0.001, psnr_db 72.1 ≥ 60": each thresholded figure next to its bound ("identical" for an exact match). */
export function formatMetrics(metrics, threshold = {}) {
  if (metrics.identical && metrics.shape_ok !== false) return 'identical to the reference';
  const parts = [];
  for (const [key, bound] of Object.entries(threshold)) {
    if (key in metrics) parts.push(`${key} ${near(metrics[key], bound)} ${LOWER_BOUNDS.includes(key) ? '≥' : '≤'} ${g(bound)}`);
  }
  if (!metrics.shape_ok) parts.push(`shape [${metrics.shape}] vs [${metrics.expected_shape}]`);
  // Integer tensors are judged by exact equality: their bounds name no figure of theirs.
  if (!parts.length && 'mismatches' in metrics) parts.push(`${metrics.mismatches} elements differ (max_abs ${g(metrics.max_abs)})`);
  return parts.join(', ');
}

/** The bounds the build checked for (ep, variant): manifest.thresholds[ep][variant] ({ output: bounds }), or null. */
export function thresholdsFor(manifest, ep, variant) {
  const byEp = manifest && manifest.thresholds && manifest.thresholds[ep];
  const bounds = byEp && byEp[variant];
  return bounds && typeof bounds === 'object' ? bounds : null;
}

/**
 * Every output of a run against the reference: { passed, outputs: { name: { metrics, threshold,
 * passed, reason, decision? } }, text }. An output with a manifest `decision` also gets its decision
 * check (decisions.js: { figures, status, reason, shown }), whose failure fails the output. `thresholds` ({ output: bounds }) may be null: then figures only, and
 * `passed` is null (nothing to judge by). An output missing from the run fails. An output whose
 * reference is degenerate is not verifiable (its `passed` null, `verifiable` false, the reason
 * given): it neither passes nor, unless it is broken (shape, NaN/Inf), fails the run.
 */
export function compareOutputs(manifest, reference, actual, thresholds) {
  const kinds = Object.fromEntries((manifest.outputs || []).map((o) => [o.name, o.kind || 'tensor']));
  const parts = Object.fromEntries((manifest.outputs || []).map((o) => [o.name, o.parts || null]));
  const decisions = Object.fromEntries((manifest.outputs || []).map((o) => [o.name, o.decision || null]));
  const outputs = {};
  let passed = thresholds ? true : null;
  const texts = [];
  for (const [name, expected] of Object.entries(reference)) {
    const threshold = (thresholds && thresholds[name]) || {};
    if (!actual[name]) {
      outputs[name] = { metrics: null, threshold, passed: false, reason: `output "${name}" is missing` };
      passed = false;
      texts.push(`${name}: missing`);
      continue;
    }
    const metrics = compareTensor(expected, actual[name], kinds[name], parts[name]);
    const verdict = judge(metrics, threshold);
    const broken = !metrics.shape_ok || metrics.nan || metrics.inf;
    const degenerate = broken ? null : degenerateReference(expected, kinds[name]);
    if (degenerate) {
      const reason = `degenerate fp32 reference: ${degenerate}`;
      outputs[name] = { metrics, threshold, passed: null, verifiable: false, reason };
      texts.push(`${name}: not verifiable (${reason})`);
      continue;
    }
    const judged = thresholds ? verdict.passed : verdict.passed ? null : false;
    if (judged === false) passed = false;
    outputs[name] = { metrics, threshold, passed: judged, reason: verdict.reason };
    const shown = thresholds ? formatMetrics(metrics, threshold) : formatMetrics(metrics, { rel_l2: Infinity, max_abs_of_range: Infinity }).replace(/ ≤ Infinity/g, '');
    texts.push(`${name}: ${verdict.reason && !verdict.passed ? verdict.reason : shown}`);
    if (decisions[name]) {
      // beside the numbers, what the app decides from them (decisions.js): judged only with bounds
      const decided = decide(expected, actual[name], decisions[name], threshold);
      outputs[name].decision = decided;
      if (thresholds && decided.status === 'failed') {
        outputs[name].passed = false;
        passed = false;
      }
      texts.push(`${name} (${decisions[name].kind} decision): ${decided.status}${decided.reason ? ` (${decided.reason})` : ''}`);
    }
  }
  return { passed, outputs, text: texts.join('; ') };
}
