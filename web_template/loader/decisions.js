// Decision checks: does a run decide what fp32 decides from an output? The twin of
// pipeline/verify/judgement/decisions.py (cross-checked by tests/test_loader_js.py), for the
// manifest output's `decision` ({ kind, axis, top_k, blank, threshold, boxes }):
// logits/probabilities: the top-1 class per position; ctc: the greedy decoding (repeats merged,
// blank dropped); detection: boxes over the score threshold matched one to one (IoU, score
// difference); mask: the share of elements on fp32's side of the threshold; embedding: the cosine
// of each vector. A flip where fp32's own margin is within the error the run is allowed (the
// max_abs_of_range, or an image's p999_abs_of_range, bound times the range) is a near-tie, counted
// against `near_ties` and told with its margin; a sample on which fp32 decides nothing makes the
// check not verifiable.

import { judge } from './compare.js';
import { numbers } from './tensors.js';

export const DECISION_KINDS = Object.freeze(['logits', 'probabilities', 'ctc', 'detection', 'mask', 'embedding']);
export const BOUND_KEYS = Object.freeze(['flips', 'near_ties', 'min_iou', 'score_diff', 'mask_agreement', 'cosine']);
const MAX_IOU_BOXES = 1000; // above this, boxes are matched by row (a raw head's rows are its anchors)
const SHOWN = 40; // decided items shown per run

const span = (values) => {
  let low = 0;
  let high = 0;
  for (const v of values) {
    if (v < low) low = v;
    if (v > high) high = v;
  }
  return high - low;
};

/** `data` (flat, C order, `dims`) as rows of the classes along `axis`: { rows: Float64Array[], classes, remaining }. */
function rowsOf(data, dims, axis) {
  const rank = dims.length;
  const at = rank ? ((axis % rank) + rank) % rank : 0;
  const classes = rank ? dims[at] : 1;
  const outer = dims.slice(0, at).reduce((a, b) => a * b, 1);
  const inner = dims.slice(at + 1).reduce((a, b) => a * b, 1);
  const rows = [];
  for (let o = 0; o < outer; o++) {
    for (let i = 0; i < inner; i++) {
      const row = new Float64Array(classes);
      for (let c = 0; c < classes; c++) row[c] = data[(o * classes + c) * inner + i];
      rows.push(row);
    }
  }
  return { rows, classes, remaining: dims.filter((_, d) => d !== at) };
}

/** [top-1 index, margin (top-1 minus top-2)] of one row; the first index on equal values, as numpy. */
function topTwo(row) {
  let best = 0;
  for (let c = 1; c < row.length; c++) if (row[c] > row[best]) best = c;
  let second = -Infinity;
  for (let c = 0; c < row.length; c++) if (c !== best && row[c] > second) second = row[c];
  return [best, row[best] - second];
}

const argmax = (row) => topTwo(row)[0];

function tolerance(bounds) {
  if ('max_abs_of_range' in bounds) return Number(bounds.max_abs_of_range);
  if ('p999_abs_of_range' in bounds) return Number(bounds.p999_abs_of_range);
  return 0;
}

const fixed = (value, digits) => Number(value).toFixed(digits);
const short = (value) => Number(Number(value).toPrecision(4)).toString();

function flipped(reference, actual, axis, tol) {
  const ref = rowsOf(reference.data, reference.dims, axis);
  const act = rowsOf(actual.data, actual.dims, axis);
  const refTop = [];
  const margins = [];
  for (const row of ref.rows) {
    const [top, margin] = topTwo(row);
    refTop.push(top);
    margins.push(margin);
  }
  const actTop = act.rows.map(argmax);
  const allowed = tol * span(reference.data);
  const tie = refTop.map((top, i) => top !== actTop[i] && margins[i] <= allowed);
  return { ref, act, refTop, actTop, margins, tie, allowed };
}

function tieLines(indices, f, unit) {
  return indices.map((i) => `${unit} ${i}: fp32 ${f.refTop[i]} by a margin of ${short(f.margins[i])} (within the allowed error ${short(f.allowed)}), variant ${f.actTop[i]}`);
}

const labels = (top) => top.slice(0, SHOWN).join(' ') + (top.length > SHOWN ? ` … (${top.length} positions)` : '');

function classes(reference, actual, decision, tol) {
  const axis = decision.axis ?? -1;
  const dims = reference.dims;
  const count = dims.length ? dims[((axis % dims.length) + dims.length) % dims.length] : 1;
  if (count < 2) return { nothing: `${count} class along axis ${axis}` };
  const f = flipped(reference, actual, axis, tol);
  const k = Math.min(Number(decision.top_k ?? 5), count);
  const topK = (row) => new Set(Array.from(row.keys()).sort((a, b) => row[b] - row[a] || a - b).slice(0, k));
  let overlap = 0;
  f.ref.rows.forEach((row, i) => {
    const mine = topK(f.act.rows[i]);
    overlap += [...topK(row)].filter((c) => mine.has(c)).length / k;
  });
  const flips = f.refTop.filter((top, i) => top !== f.actTop[i]);
  const ties = f.tie.map((t, i) => (t ? i : -1)).filter((i) => i >= 0);
  const figures = {
    positions: f.refTop.length,
    top1_agreement: 1 - flips.length / f.refTop.length,
    flips: flips.length - ties.length,
    near_ties: ties.length,
    [`top${k}_overlap`]: overlap / f.refTop.length,
  };
  return { figures, ties: tieLines(ties, f, 'position'), shown: { reference: labels(f.refTop), actual: labels(f.actTop) } };
}

/** Greedy CTC decoding of one sequence of top-1 classes: repeats merged, blanks dropped. */
export function greedyCtc(top, blank) {
  const out = [];
  let last = null;
  for (const token of top) {
    if (token !== last && token !== blank) out.push(token);
    last = token;
  }
  return out;
}

function editDistance(a, b) {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let previous = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const here = row[j];
      row[j] = Math.min(row[j] + 1, row[j - 1] + 1, previous + (a[i - 1] !== b[j - 1] ? 1 : 0));
      previous = here;
    }
  }
  return row[b.length];
}

/** `data` (flat, C order, `dims`) with axes `a` then `b` moved last, the others in order (numpy moveaxis). */
function moveLast(data, dims, a, b) {
  const order = [...dims.keys()].filter((d) => d !== a && d !== b).concat([a, b]);
  const outDims = order.map((d) => dims[d]);
  const strides = dims.map((_, d) => dims.slice(d + 1).reduce((x, y) => x * y, 1));
  const out = new Float64Array(data.length);
  const index = new Array(order.length).fill(0);
  for (let i = 0; i < out.length; i++) {
    let from = 0;
    for (let k = 0; k < order.length; k++) from += index[k] * strides[order[k]];
    out[i] = data[from];
    for (let k = order.length - 1; k >= 0; k--) { // the next index, last axis fastest
      if (++index[k] < outDims[k]) break;
      index[k] = 0;
    }
  }
  return { data: out, dims: outDims };
}

function ctc(reference, actual, decision, tol) {
  const rank = reference.dims.length;
  const blank = Number(decision.blank ?? 0);
  if (rank < 2) return { nothing: `${rank} axes: a CTC output has a time and a class axis` };
  const norm = (axis) => ((axis % rank) + rank) % rank;
  const time = norm(decision.time_axis ?? -2);
  const classes = norm(decision.axis ?? -1);
  if (time === classes) return { nothing: `its time_axis is its class axis (${classes}): set the output's time_axis` };
  // sequences of steps: time and classes last ([N, T, C] as it is; torch's [T, N, C] moved)
  const refSteps = moveLast(reference.data, reference.dims, time, classes);
  const actSteps = moveLast(actual.data, actual.dims, time, classes);
  const f = flipped(refSteps, actSteps, -1, tol);
  const steps = refSteps.dims[rank - 2];
  const texts = (top) => {
    const rows = [];
    for (let s = 0; s < top.length; s += steps) rows.push(greedyCtc(top.slice(s, s + steps), blank));
    return rows;
  };
  const refText = texts(f.refTop);
  const actText = texts(f.actTop);
  if (!refText.some((row) => row.length)) return { nothing: `every one of its ${f.refTop.length} steps is the blank ${blank}` };
  const flips = f.refTop.filter((top, i) => top !== f.actTop[i]).length;
  const ties = f.tie.map((t, i) => (t ? i : -1)).filter((i) => i >= 0);
  const figures = {
    steps: f.refTop.length,
    top1_agreement: 1 - flips / f.refTop.length,
    flips: flips - ties.length,
    near_ties: ties.length,
    edit_distance: refText.reduce((sum, row, i) => sum + editDistance(row, actText[i]), 0),
  };
  const text = (rows) => rows.map((row) => row.slice(0, SHOWN).join(' ')).join(' | ');
  return { figures, ties: tieLines(ties, f, 'step'), shown: { reference: text(refText), actual: text(actText) } };
}

function boxesOf(tensor, decision) {
  const { rows } = rowsOf(tensor.data, tensor.dims, decision.axis ?? 1);
  const layout = decision.boxes || 'cxcywh';
  return rows.map((row) => {
    const [a, b, c, d] = row;
    const box = layout === 'cxcywh' ? [a - c / 2, b - d / 2, a + c / 2, b + d / 2] : layout === 'xywh' ? [a, b, a + c, b + d] : [a, b, c, d];
    const scores = row.subarray(4);
    const [cls, margin] = scores.length > 1 ? topTwo(scores) : [0, Infinity];
    return { box, score: scores[cls], cls, margin };
  });
}

function iou(a, b) {
  const w = Math.max(Math.min(a[2], b[2]) - Math.max(a[0], b[0]), 0);
  const h = Math.max(Math.min(a[3], b[3]) - Math.max(a[1], b[1]), 0);
  const inter = w * h;
  const area = (x) => Math.max(x[2] - x[0], 0) * Math.max(x[3] - x[1], 0);
  const union = area(a) + area(b) - inter;
  return union > 0 ? inter / union : 0;
}

/** One-to-one [fp32 row, run row] pairs: greedy by IoU, highest first, IoU > 0; by row over MAX_IOU_BOXES. */
function match(ref, act, refKeep, actKeep) {
  if (Math.max(refKeep.length, actKeep.length) > MAX_IOU_BOXES) {
    const kept = new Set(actKeep);
    return refKeep.filter((i) => kept.has(i)).map((i) => [i, i]);
  }
  const table = [];
  refKeep.forEach((i, r) => actKeep.forEach((j, a) => table.push({ value: iou(ref[i].box, act[j].box), flat: r * actKeep.length + a, i, j })));
  table.sort((x, y) => y.value - x.value || x.flat - y.flat);
  const usedRef = new Set();
  const usedAct = new Set();
  const pairs = [];
  for (const entry of table) {
    if (entry.value <= 0) break;
    if (!usedRef.has(entry.i) && !usedAct.has(entry.j)) {
      usedRef.add(entry.i);
      usedAct.add(entry.j);
      pairs.push([entry.i, entry.j]);
    }
  }
  return pairs;
}

function detection(reference, actual, decision, tol) {
  const axis = decision.axis ?? 1;
  const dims = reference.dims;
  const rank = dims.length;
  const attributes = rank >= 2 ? dims[((axis % rank) + rank) % rank] : reference.data.length;
  if (rank < 2 || attributes < 5) return { nothing: `axis ${axis} holds ${attributes} values, not 4 box values and a score` };
  const threshold = Number(decision.threshold ?? 0.25);
  const ref = boxesOf(reference, decision);
  const act = boxesOf(actual, decision);
  const refKeep = ref.map((b, i) => (b.score >= threshold ? i : -1)).filter((i) => i >= 0);
  const actKeep = act.map((b, i) => (b.score >= threshold ? i : -1)).filter((i) => i >= 0);
  if (!refKeep.length) return { nothing: `no box scores ${threshold} or more (best ${Number(Math.max(...ref.map((b) => b.score))).toPrecision(3)})` };
  const scores = rowsOf(reference.data, dims, axis).rows.flatMap((row) => Array.from(row.subarray(4)));
  const allowed = tol * span(scores);
  const pairs = match(ref, act, refKeep, actKeep);
  const matchedRef = new Set(pairs.map(([i]) => i));
  const matchedAct = new Set(pairs.map(([, j]) => j));
  let flips = 0;
  const ties = [];
  for (const i of refKeep) {
    if (matchedRef.has(i)) continue;
    if (ref[i].score - threshold <= allowed) ties.push(`box ${i} (class ${ref[i].cls}, fp32 score ${short(ref[i].score)}) lost: ${short(ref[i].score - threshold)} over the threshold, within the allowed error ${short(allowed)}`);
    else flips++;
  }
  for (const j of actKeep) {
    if (matchedAct.has(j)) continue;
    if (act[j].score - threshold <= allowed) ties.push(`box ${j} (class ${act[j].cls}, score ${short(act[j].score)}) added: ${short(act[j].score - threshold)} over the threshold, within the allowed error ${short(allowed)}`);
    else flips++;
  }
  const ious = [];
  const diffs = [];
  for (const [i, j] of pairs) {
    ious.push(iou(ref[i].box, act[j].box));
    diffs.push(Math.abs(ref[i].score - act[j].score));
    if (ref[i].cls !== act[j].cls) {
      if (ref[i].margin <= allowed) ties.push(`box ${i}: fp32 class ${ref[i].cls} by a margin of ${short(ref[i].margin)} (within the allowed error ${short(allowed)}), variant ${act[j].cls}`);
      else flips++;
    }
  }
  const figures = {
    boxes: refKeep.length, boxes_actual: actKeep.length, matched: pairs.length, flips, near_ties: ties.length,
    min_iou: ious.length ? Math.min(...ious) : 1, score_diff: diffs.length ? Math.max(...diffs) : 0,
  };
  const show = (boxes, keep) => keep.slice().sort((a, b) => boxes[b].score - boxes[a].score || a - b).slice(0, SHOWN)
    .map((i) => `${boxes[i].cls} ${fixed(boxes[i].score, 2)} [${boxes[i].box.map((v) => fixed(v, 0)).join(', ')}]`).join('; ');
  return { figures, ties, shown: { reference: show(ref, refKeep), actual: show(act, actKeep) } };
}

function mask(reference, actual, decision, tol) {
  const threshold = Number(decision.threshold ?? 0.5);
  const ref = reference.data;
  const act = actual.data;
  let on = 0;
  let actOn = 0;
  let differ = 0;
  let tie = 0;
  const allowed = tol * span(ref);
  for (let i = 0; i < ref.length; i++) {
    const r = ref[i] >= threshold;
    const a = act[i] >= threshold;
    if (r) on++;
    if (a) actOn++;
    if (r !== a) {
      differ++;
      if (Math.abs(ref[i] - threshold) <= allowed) tie++;
    }
  }
  if (on === 0 || on === ref.length) return { nothing: `all ${ref.length} of its values are ${on ? 'at or above' : 'below'} the threshold ${threshold}` };
  const figures = { elements: ref.length, mask_agreement: 1 - differ / ref.length, flips: differ - tie, near_ties: tie };
  const ties = tie ? [`${tie} elements within the allowed error ${short(allowed)} of the threshold changed side`] : [];
  const share = (count) => `${fixed((100 * count) / ref.length, 2)}% at or above ${threshold}`;
  return { figures, ties, shown: { reference: share(on), actual: share(actOn) } };
}

function embedding(reference, actual, decision) {
  const axis = decision.axis ?? -1;
  const ref = rowsOf(reference.data, reference.dims, axis).rows;
  const act = rowsOf(actual.data, actual.dims, axis).rows;
  let worst = Infinity;
  let live = 0;
  ref.forEach((row, i) => {
    let rr = 0;
    let aa = 0;
    let ra = 0;
    for (let c = 0; c < row.length; c++) {
      rr += row[c] * row[c];
      aa += act[i][c] * act[i][c];
      ra += row[c] * act[i][c];
    }
    if (rr > 0) {
      live++;
      worst = Math.min(worst, ra / Math.max(Math.sqrt(rr) * Math.sqrt(aa), 1e-300));
    }
  });
  if (!live) return { nothing: `all ${ref.length} of its vectors are zero` };
  return { figures: { vectors: ref.length, cosine: worst }, ties: [], shown: {} };
}

const KINDS = { logits: classes, probabilities: classes, ctc, detection, mask, embedding };

/**
 * The decision check of one output: { figures, status: 'passed' | 'failed' | 'not-verifiable',
 * reason, shown: { reference, actual } }. `reference` and `actual`: { data, dims, type }; `bounds`:
 * the output's bounds (the numeric ones give the near-tie tolerance, BOUND_KEYS judge).
 */
export function decide(reference, actual, decision, bounds = {}) {
  const refDims = Array.from(reference.dims, Number);
  const actDims = Array.from(actual.dims, Number);
  if (refDims.length !== actDims.length || refDims.some((d, i) => d !== actDims[i])) {
    return { figures: { shape_ok: false, shape: actDims, expected_shape: refDims }, status: 'failed', reason: `shape [${actDims}] != expected [${refDims}]`, shown: {} };
  }
  const asFloat = (t, dims) => ({ data: Float64Array.from(numbers(t), Number), dims });
  const judged = KINDS[decision.kind];
  if (!judged) return { figures: {}, status: 'not-verifiable', reason: `unknown decision kind ${decision.kind}`, shown: {} };
  const result = judged(asFloat(reference, refDims), asFloat(actual, actDims), decision, tolerance(bounds));
  if (result.nothing) {
    return {
      figures: { shape_ok: true }, status: 'not-verifiable', shown: {},
      reason: `fp32 decides nothing on this sample (${result.nothing}): a ${decision.kind} check on it cannot tell a right output from a wrong one`,
    };
  }
  const figures = { ...result.figures, shape_ok: true };
  const decisionBounds = Object.fromEntries(Object.entries(bounds).filter(([key]) => BOUND_KEYS.includes(key)));
  let { passed, reason } = judge(figures, decisionBounds);
  if (decision.kind === 'ctc' && figures.edit_distance === 0) [passed, reason] = [true, null]; // the text is the decision
  if (result.ties.length) {
    const told = result.ties.slice(0, 5).join('; ') + (result.ties.length > 5 ? `; +${result.ties.length - 5} more` : '');
    reason = reason ? `${reason}; near-ties: ${told}` : `near-ties: ${told}`;
  }
  return { figures, status: passed ? 'passed' : 'failed', reason, shown: result.shown };
}
