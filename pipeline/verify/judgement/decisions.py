"""Decision checks: does a variant decide what fp32 decides from an output? Beside the numeric check
(metrics.py), for the kinds an app decides from (pipeline/recipe.py OUTPUT_KINDS; the manifest
output's `decision`: its kind and keys):

- logits, probabilities: the top-1 class at every position (every index but the class `axis`)
  equal; `top1_agreement` and the mean top-k overlap are shown;
- ctc: the greedy decoding (top-1 per step along `time_axis`, repeats merged, `blank` dropped)
  equal, per sequence (every other axis); flips that leave the decoding as it is pass;
- detection: boxes with a score (the best class score) at or above `threshold` matched one to one
  (greedy by IoU; by row where either run keeps over MAX_IOU_BOXES boxes: a raw head's rows are its
  anchors) with the IoU (`min_iou`) and the score difference (`score_diff`) bounded; a box without
  a match or whose class changed is a flip;
- mask: the share of elements on the same side of `threshold` (`mask_agreement`);
- embedding: the cosine of each vector along `axis` (`cosine`, the worst).

Audio and image outputs decide by their shape (the numeric check fails a different length, naming
both shapes), so they need no check here.

A flip (a changed class, box or pixel) where fp32's own margin (top-1 minus top-2; a score's or a
pixel's distance from the threshold) is within the error the variant is allowed (its
`max_abs_of_range`, or an image's `p999_abs_of_range`, bound times the range of the values
decided on) is a near-tie: no bound on the numbers could keep it, so it is reported with its
margin and counted against `near_ties`; any other is a flip (`flips`). A sample on which fp32
decides nothing (every step blank, no box over the threshold, every element on one side, one
class) makes the check `not-verifiable`, never passed. The bounds are thresholds.py's.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.verify.judgement.metrics import judge

# the figures with a bound (thresholds.py decision_bounds gives the defaults)
BOUND_KEYS = ("flips", "near_ties", "min_iou", "score_diff", "mask_agreement", "cosine")
MAX_IOU_BOXES = 1000  # above this, boxes are matched by row: an IoU table of 1000² is the most kept
SHOWN = 40  # decided items shown per run (labels, tokens, boxes)


def decide(reference: np.ndarray, actual: np.ndarray, decision: dict, bounds: dict) -> tuple[dict, str, str | None, dict]:
    """(figures, status, why not passed, shown) of the decision `decision` of one output. `bounds`:
    the output's bounds (the numeric ones give the near-tie tolerance; the BOUND_KEYS judge).
    `shown`: {"reference": ..., "actual": ...}, what each run decided, one line each."""
    reference = np.asarray(reference, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if reference.shape != actual.shape:
        figures = {"shape_ok": False, "shape": list(actual.shape), "expected_shape": list(reference.shape)}
        return figures, "failed", f"shape {list(actual.shape)} != expected {list(reference.shape)}", {}
    kind = decision["kind"]
    figures, nothing, ties, shown = JUDGES[kind](reference, actual, decision, _tolerance(bounds))
    figures["shape_ok"] = True
    if nothing:
        return figures, "not-verifiable", f"fp32 decides nothing on this sample ({nothing}): a {kind} check on it cannot tell a right output from a wrong one; give a sample that makes a decision (--inputs)", shown
    passed, reason = judge(figures, {key: bound for key, bound in bounds.items() if key in BOUND_KEYS})
    if kind == "ctc" and figures["edit_distance"] == 0:
        passed, reason = True, None  # the text is the decision: flips that leave it as it is pass
    if ties:
        told = "; ".join(ties[:5]) + (f"; +{len(ties) - 5} more" if len(ties) > 5 else "")
        reason = f"{reason}; near-ties: {told}" if reason else f"near-ties: {told}"
    return figures, "passed" if passed else "failed", reason, shown


def undecided(reference: np.ndarray, decision: dict) -> str | None:
    """Why fp32 decides nothing from `reference` (every step blank, no box over the threshold, ...),
    or None when it decides something: what a sample must avoid (pipeline/assets/samples.py)."""
    reference = np.asarray(reference, dtype=np.float64)
    return JUDGES[decision["kind"]](reference, reference, decision, 0.0)[1]


def _tolerance(bounds: dict) -> float:
    """The error a variant is allowed, as a fraction of the range (numeric bounds, thresholds.py)."""
    return float(bounds.get("max_abs_of_range", bounds.get("p999_abs_of_range", 0.0)))


def _span(values: np.ndarray) -> float:
    """The range the numeric check normalises by: the values' span with zero."""
    return float(max(values.max(initial=0.0), 0.0) - min(values.min(initial=0.0), 0.0))


def _rows(values: np.ndarray, axis: int) -> np.ndarray:
    """`values` with `axis` last, flattened to (positions, classes)."""
    moved = np.moveaxis(values, axis, -1) if values.ndim else values.reshape(1)
    return moved.reshape(-1, moved.shape[-1])


def _top_two(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the top-1 index and fp32's margin (top-1 minus top-2)."""
    top = np.argmax(rows, axis=1)
    ordered = np.sort(rows, axis=1)
    return top, ordered[:, -1] - ordered[:, -2]


def _flipped(reference: np.ndarray, actual: np.ndarray, axis: int, tolerance: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """(fp32 top-1, variant top-1, margins, near-tie mask over the flips, tie tolerance in values)."""
    ref, act = _rows(reference, axis), _rows(actual, axis)
    ref_top, margin = _top_two(ref)
    act_top = np.argmax(act, axis=1)
    allowed = tolerance * _span(ref)
    return ref_top, act_top, margin, (ref_top != act_top) & (margin <= allowed), allowed


def _tie_lines(where: np.ndarray, ref_top, act_top, margin, allowed: float, unit: str = "position") -> list[str]:
    return [f"{unit} {int(i)}: fp32 {int(ref_top[i])} by a margin of {margin[i]:.4g} (within the allowed error {allowed:.4g}), variant {int(act_top[i])}" for i in where]


def _labels(top: np.ndarray) -> str:
    return " ".join(str(int(v)) for v in top[:SHOWN]) + (f" … ({top.size} positions)" if top.size > SHOWN else "")


def _classes(reference, actual, decision, tolerance):
    axis = decision.get("axis", -1)
    classes = reference.shape[axis] if reference.ndim else 1
    if classes < 2:
        return {}, f"{classes} class along axis {axis}", [], {}
    ref_top, act_top, margin, tie, allowed = _flipped(reference, actual, axis, tolerance)
    flipped = ref_top != act_top
    k = min(int(decision.get("top_k", 5)), classes)
    ref_k = np.argpartition(-_rows(reference, axis), k - 1, axis=1)[:, :k]
    act_k = np.argpartition(-_rows(actual, axis), k - 1, axis=1)[:, :k]
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ref_k, act_k)]))
    figures = {"positions": int(ref_top.size), "top1_agreement": 1.0 - float(flipped.mean()), "flips": int((flipped & ~tie).sum()),
               "near_ties": int(tie.sum()), f"top{k}_overlap": overlap}
    ties = _tie_lines(np.flatnonzero(tie), ref_top, act_top, margin, allowed)
    return figures, None, ties, {"reference": _labels(ref_top), "actual": _labels(act_top)}


def greedy_ctc(top: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding of one sequence of top-1 classes: repeats merged, blanks dropped."""
    out, last = [], None
    for token in top.tolist():
        if token != last and token != blank:
            out.append(int(token))
        last = token
    return out


def _edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def _ctc(reference, actual, decision, tolerance):
    axis, blank = decision.get("axis", -1), int(decision.get("blank", 0))
    if reference.ndim < 2:
        return {}, f"{reference.ndim} axes: a CTC output has a time and a class axis", [], {}
    time, classes = decision.get("time_axis", -2) % reference.ndim, axis % reference.ndim
    if time == classes:
        return {}, f"its time_axis is its class axis ({classes}): set the output's time_axis", [], {}
    # sequences of steps: time and classes last ([N, T, C] as it is; torch's [T, N, C] moved)
    ref_steps, act_steps = (np.moveaxis(x, [time, classes], [-2, -1]) for x in (reference, actual))
    ref_top, act_top, margin, tie, allowed = _flipped(ref_steps, act_steps, -1, tolerance)
    steps = ref_steps.shape[-2]
    ref_text = [greedy_ctc(row, blank) for row in ref_top.reshape(-1, steps)]
    act_text = [greedy_ctc(row, blank) for row in act_top.reshape(-1, steps)]
    if not any(ref_text):
        return {}, f"every one of its {ref_top.size} steps is the blank {blank}", [], {}
    flipped = ref_top != act_top
    figures = {"steps": int(ref_top.size), "top1_agreement": 1.0 - float(flipped.mean()), "flips": int((flipped & ~tie).sum()), "near_ties": int(tie.sum()),
               "edit_distance": sum(_edit_distance(a, b) for a, b in zip(ref_text, act_text))}
    ties = _tie_lines(np.flatnonzero(tie), ref_top, act_top, margin, allowed, "step")
    text = lambda rows: " | ".join(" ".join(map(str, row[:SHOWN])) for row in rows)  # noqa: E731
    return figures, None, ties, {"reference": text(ref_text), "actual": text(act_text)}


def _boxes(values: np.ndarray, decision: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes as x1 y1 x2 y2, best score, best class) of each candidate row."""
    rows = _rows(values, decision.get("axis", 1))
    raw, scores = rows[:, :4], rows[:, 4:]
    layout = decision.get("boxes", "cxcywh")
    if layout == "cxcywh":
        boxes = np.concatenate([raw[:, :2] - raw[:, 2:] / 2, raw[:, :2] + raw[:, 2:] / 2], axis=1)
    elif layout == "xywh":
        boxes = np.concatenate([raw[:, :2], raw[:, :2] + raw[:, 2:]], axis=1)
    else:
        boxes = raw
    return boxes, scores.max(axis=1), scores.argmax(axis=1)


def kept_boxes(values: np.ndarray, decision: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes as x1 y1 x2 y2, scores, classes) of the candidates of a detection output that score
    at least its threshold, best first (what report.html draws on the sample image)."""
    boxes, scores, classes = _boxes(np.asarray(values, dtype=np.float64), decision)
    keep = np.flatnonzero(scores >= float(decision.get("threshold", 0.25)))
    keep = keep[np.argsort(-scores[keep], kind="stable")]
    return boxes[keep], scores[keep], classes[keep]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in `a` with every box in `b` (x1 y1 x2 y2)."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _detection(reference, actual, decision, tolerance):
    axis = decision.get("axis", 1)
    if reference.ndim < 2 or reference.shape[axis] < 5:
        return {}, f"axis {axis} holds {reference.shape[axis] if reference.ndim >= 2 else reference.size} values, not 4 box values and a score", [], {}
    threshold = float(decision.get("threshold", 0.25))
    ref_boxes, ref_score, ref_class = _boxes(reference, decision)
    act_boxes, act_score, act_class = _boxes(actual, decision)
    ref_keep, act_keep = np.flatnonzero(ref_score >= threshold), np.flatnonzero(act_score >= threshold)
    if ref_keep.size == 0:
        return {}, f"no box scores {threshold:g} or more (best {ref_score.max():.3g})", [], {}
    allowed = tolerance * _span(np.take(reference, np.arange(4, reference.shape[axis]), axis=axis))
    pairs = _match(ref_boxes, act_boxes, ref_keep, act_keep)
    matched_ref, matched_act = {i for i, _ in pairs}, {j for _, j in pairs}
    flips, ties = 0, []
    for i in ref_keep:
        if i not in matched_ref:
            near = ref_score[i] - threshold <= allowed
            flips += not near
            ties += [f"box {int(i)} (class {int(ref_class[i])}, fp32 score {ref_score[i]:.4g}) lost: {ref_score[i] - threshold:.4g} over the threshold, within the allowed error {allowed:.4g}"] if near else []
    for j in act_keep:
        if j not in matched_act:
            near = act_score[j] - threshold <= allowed
            flips += not near
            ties += [f"box {int(j)} (class {int(act_class[j])}, score {act_score[j]:.4g}) added: {act_score[j] - threshold:.4g} over the threshold, within the allowed error {allowed:.4g}"] if near else []
    ious, diffs = [], []
    for i, j in pairs:
        ious.append(float(_iou(ref_boxes[[i]], act_boxes[[j]])[0, 0]))
        diffs.append(abs(float(ref_score[i] - act_score[j])))
        if ref_class[i] != act_class[j]:
            margin = float(np.sort(_rows(reference, axis)[i, 4:])[-2:] @ [-1, 1]) if reference.shape[axis] > 5 else math.inf
            near = margin <= allowed
            flips += not near
            ties += [f"box {int(i)}: fp32 class {int(ref_class[i])} by a margin of {margin:.4g} (within the allowed error {allowed:.4g}), variant {int(act_class[j])}"] if near else []
    figures = {"boxes": int(ref_keep.size), "boxes_actual": int(act_keep.size), "matched": len(pairs), "flips": flips, "near_ties": len(ties),
               "min_iou": min(ious, default=1.0), "score_diff": max(diffs, default=0.0)}
    show = lambda keep, boxes, score, cls: "; ".join(f"{int(cls[i])} {score[i]:.2f} [{', '.join(f'{v:.0f}' for v in boxes[i])}]" for i in keep[np.argsort(-score[keep])][:SHOWN])  # noqa: E731
    return figures, None, ties, {"reference": show(ref_keep, ref_boxes, ref_score, ref_class), "actual": show(act_keep, act_boxes, act_score, act_class)}


def _match(ref_boxes, act_boxes, ref_keep, act_keep) -> list[tuple[int, int]]:
    """One-to-one pairs (fp32 row, variant row): greedy by IoU, highest first, IoU > 0; by row
    (the same anchor) when either side keeps more than MAX_IOU_BOXES."""
    if max(ref_keep.size, act_keep.size) > MAX_IOU_BOXES:
        return [(int(i), int(i)) for i in np.intersect1d(ref_keep, act_keep)]
    table = _iou(ref_boxes[ref_keep], act_boxes[act_keep])
    pairs, used_ref, used_act = [], set(), set()
    for flat in np.argsort(-table, axis=None):
        r, a = divmod(int(flat), table.shape[1])
        if table[r, a] <= 0:
            break
        if r not in used_ref and a not in used_act:
            used_ref.add(r)
            used_act.add(a)
            pairs.append((int(ref_keep[r]), int(act_keep[a])))
    return pairs


def _mask(reference, actual, decision, tolerance):
    threshold = float(decision.get("threshold", 0.5))
    ref_on, act_on = reference >= threshold, actual >= threshold
    share = float(ref_on.mean())
    if share in (0.0, 1.0):
        return {}, f"all {reference.size} of its values are {'at or above' if share else 'below'} the threshold {threshold:g}", [], {}
    allowed = tolerance * _span(reference)
    differ = ref_on != act_on
    tie = differ & (np.abs(reference - threshold) <= allowed)
    figures = {"elements": int(reference.size), "mask_agreement": 1.0 - float(differ.mean()), "flips": int((differ & ~tie).sum()), "near_ties": int(tie.sum())}
    ties = [f"{int(tie.sum())} elements within the allowed error {allowed:.4g} of the threshold changed side"] if tie.any() else []
    return figures, None, ties, {"reference": f"{share:.2%} at or above {threshold:g}", "actual": f"{float(act_on.mean()):.2%} at or above {threshold:g}"}


def _embedding(reference, actual, decision, tolerance):
    axis = decision.get("axis", -1)
    ref, act = _rows(reference, axis), _rows(actual, axis)
    ref_norm, act_norm = np.sqrt(np.sum(ref * ref, axis=1)), np.sqrt(np.sum(act * act, axis=1))
    if not np.any(ref_norm > 0):
        return {}, f"all {ref.shape[0]} of its vectors are zero", [], {}
    live = ref_norm > 0
    cosine = np.sum(ref[live] * act[live], axis=1) / np.maximum(ref_norm[live] * act_norm[live], 1e-300)
    return {"vectors": int(ref.shape[0]), "cosine": float(cosine.min())}, None, [], {}


def format_shown(shown: dict) -> str:
    """One line of what the reference (fp32; a quantized source's own host run) and the variant
    decided ("" when nothing is shown)."""
    if not shown:
        return ""
    same = shown.get("reference") == shown.get("actual")
    return f"reference: {shown.get('reference')}" + (" (the same)" if same else f"; variant: {shown.get('actual')}")


# kind -> (reference, actual, decision, tolerance) -> (figures, why fp32 decides nothing, near-tie lines, shown)
JUDGES = {"logits": _classes, "probabilities": _classes, "ctc": _ctc, "detection": _detection, "mask": _mask, "embedding": _embedding}
DECISION_KINDS = tuple(JUDGES)
