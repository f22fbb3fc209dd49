"""Where a node can be cut down for the node audit without changing what breaks fp16 in it.

Every window starts at index 0 of each axis and is given by its sizes. Reduced axes (a reduction's
axes, a MatMul's K, a Conv's input channels and kernel taps) keep their full extent, so each
audited output accumulates exactly as many terms as in the real model; the axes an output does not
reduce over (rows, output channels, positions) are cut to a few, so the audit's cost follows the
node count rather than the model's multiply-accumulates.

`plan_node` returns a `Plan` (one window per input, attribute changes) or the reason the node
cannot be cut; the audit then runs it at full size when its tensors are small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Elements kept along the axes an output does not reduce over (per input of an elementwise node,
# per reduction row set of a reduction).
FREE_ELEMENTS = 4096
MATMUL_ROWS, MATMUL_COLUMNS = 8, 8
CONV_CHANNELS = 4
CONV_POSITIONS = 64  # output positions per channel: 64 in 1-D, 8x8 in 2-D, 4x4x4 in 3-D

ELEMENTWISE = frozenset(
    "Abs Acos Acosh Add And Asin Asinh Atan Atanh BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Cast CastLike "
    "Ceil Celu Clip Cos Cosh Div Elu Equal Erf Exp Floor Gelu Greater GreaterOrEqual HardSigmoid HardSwish "
    "Identity IsInf IsNaN LeakyRelu Less LessOrEqual Log Max Mean Min Mish Mod Mul Neg Not Or PRelu Pow "
    "Reciprocal Relu Round Selu Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Sub Sum Tan Tanh "
    "ThresholdedRelu Where Xor".split()
)
REDUCTIONS = frozenset(
    "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum "
    "ReduceSumSquare".split()
)
POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
# Ops that only move or select values: exact in any precision, so not auditing one at a size
# too large to run is no loss.
DATA_MOVEMENT = frozenset(
    "Concat DepthToSpace Expand Flatten Gather GatherElements GatherND Identity Pad Reshape Shape Size Slice "
    "SpaceToDepth Split Squeeze Tile Transpose Unsqueeze".split()
)


@dataclass
class Plan:
    windows: list[list[int] | None]  # per input: sizes of the window from index 0, None = whole
    attributes: dict = field(default_factory=dict)  # attribute name -> new value
    how: str = ""  # what was cut, for the report


def window(shape: list[int], keep: set[int], budget: int = FREE_ELEMENTS) -> list[int]:
    """Sizes that keep the axes in `keep` whole and cut the others (last axis first) so that the
    window holds about `budget` elements (at least one row of the kept axes)."""
    sizes = list(shape)
    # the kept axes count against the budget too: a row of a long reduction is costly already
    left = max(1, budget // max(1, math.prod(shape[a] for a in keep)))
    for axis in reversed(range(len(shape))):
        if axis in keep:
            continue
        sizes[axis] = max(1, min(shape[axis], left))
        left = max(1, left // max(sizes[axis], 1))
    return sizes


def _broadcast_window(out: list[int], shape: list[int]) -> list[int]:
    """The window of an input that broadcasts to an output window `out` (right-aligned)."""
    offset = len(out) - len(shape)
    return [1 if d == 1 else out[offset + i] for i, d in enumerate(shape)]


def _norm_axes(axes, rank: int) -> set[int]:
    return {a % rank for a in axes} if rank else set()


def plan_node(op: str, attrs: dict, shapes: list[list[int] | None], constants: dict[int, list[int]]) -> Plan | str:
    """How to cut node `op` with attributes `attrs` and input shapes `shapes` (None for an absent
    optional input); `constants` holds the values of small integer constant inputs (axes, sizes)."""
    if shapes and shapes[0] is None:
        return "its first input's shape is unknown"
    if op in ELEMENTWISE:
        present = [s for s in shapes if s is not None]
        rank = max(len(s) for s in present)
        out = [max((s[i - (rank - len(s))] for s in present if i - (rank - len(s)) >= 0), default=1) for i in range(rank)]
        win = window(out, set())
        return Plan([None if s is None else _broadcast_window(win, s) for s in shapes], how="elementwise window")
    x = shapes[0]
    rank = len(x)
    if op in REDUCTIONS:
        if len(shapes) > 1 and shapes[1] is not None:
            if 1 not in constants:
                return "its axes are not a constant"
            axes = constants[1]
        else:
            axes = attrs.get("axes", [])
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                axes = []
            else:
                axes = list(range(rank))
        keep = _norm_axes(axes, rank)
        return Plan([window(x, keep)] + [None] * (len(shapes) - 1), how=f"rows cut, {math.prod(x[a] for a in keep)} values per reduction")
    if op in ("ArgMax", "ArgMin"):
        return Plan([window(x, _norm_axes([attrs.get("axis", 0)], rank))], how="rows cut")
    if op in ("Softmax", "LogSoftmax", "Hardmax"):
        axis = attrs.get("axis", -1) % rank
        # before opset 13 the axis means "flatten from here": every later axis is reduced too
        keep = set(range(axis, rank)) if attrs.get("_opset", 13) < 13 else {axis}
        return Plan([window(x, keep)], how="rows cut")
    if op == "LayerNormalization":
        axis = attrs.get("axis", -1) % rank
        return Plan([window(x, set(range(axis, rank)))] + [None] * (len(shapes) - 1), how="rows cut")
    if op in ("InstanceNormalization", "BatchNormalization") and rank >= 2:
        keep = set(range(2, rank)) if op == "InstanceNormalization" else set()
        win = window(x, keep)
        return Plan([win] + [None if s is None else [win[1]] for s in shapes[1:]], how="channels cut" if keep else "window")
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool") and rank >= 2:
        return Plan([window(x, set(range(2, rank)))], how="channels cut")
    if op == "MatMul":
        return _plan_matmul(shapes)
    if op == "Gemm":
        return _plan_gemm(attrs, shapes)
    if op in ("Conv", "ConvTranspose") + tuple(POOLS):
        return _plan_conv(op, attrs, shapes)
    if op == "Resize":
        return _plan_resize(shapes, constants)
    if op == "DFT" and rank >= 3:
        # every output of a DFT sums over its whole transform axis (and the re/im axis last);
        # the other axes (batch, channels, the other spatial axis of a 2-D FFT) are rows.
        if len(shapes) > 2 and shapes[2] is not None:  # opset 20: the axis is an input
            if 2 not in constants:
                return "its axis is not a constant"
            axis = constants[2][0]
        else:
            axis = attrs.get("axis", 1)
        keep = {axis % rank, rank - 1}
        return Plan([window(x, keep)] + [None] * (len(shapes) - 1), how=f"rows cut, {x[axis % rank]} values per transform")
    return f"{op} has no cutting rule"


def _plan_matmul(shapes: list[list[int] | None]) -> Plan | str:
    a, b = shapes[0], shapes[1]
    if a is None or b is None:
        return "an input shape is unknown"
    wa, wb = list(a), list(b)
    if len(a) >= 2:
        wa[-2] = min(a[-2], MATMUL_ROWS)
        for i in range(len(a) - 2):
            wa[i] = 1
    if len(b) >= 2:
        wb[-1] = min(b[-1], MATMUL_COLUMNS)
        for i in range(len(b) - 2):
            wb[i] = 1
    return Plan([wa, wb], how=f"{MATMUL_ROWS} rows x {MATMUL_COLUMNS} columns, K = {a[-1]} whole")


def _plan_gemm(attrs: dict, shapes: list[list[int] | None]) -> Plan | str:
    a, b = shapes[0], shapes[1]
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return "Gemm inputs are not 2-D with known shapes"
    wa, wb = list(a), list(b)
    m_axis = 1 if attrs.get("transA", 0) else 0
    n_axis = 0 if attrs.get("transB", 0) else 1
    wa[m_axis] = min(a[m_axis], MATMUL_ROWS)
    wb[n_axis] = min(b[n_axis], MATMUL_COLUMNS)
    windows: list[list[int] | None] = [wa, wb]
    if len(shapes) > 2 and shapes[2] is not None:
        out = [wa[m_axis], wb[n_axis]]
        windows.append(_broadcast_window(out, shapes[2]))
    k = a[1 - m_axis]
    return Plan(windows, how=f"{MATMUL_ROWS} rows x {MATMUL_COLUMNS} columns, K = {k} whole")


def _explicit_pads(attrs: dict, x: list[int], kernel: list[int], strides: list[int], dilations: list[int]) -> list[int] | None:
    spatial = len(kernel)
    auto = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("NOTSET", ""):
        return list(attrs.get("pads", [0] * (2 * spatial)))
    if auto == "VALID":
        return [0] * (2 * spatial)
    begins, ends = [], []
    for size, k, s, d in zip(x[2:], kernel, strides, dilations):
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends


def _plan_conv(op: str, attrs: dict, shapes: list[list[int] | None]) -> Plan | str:
    x = shapes[0]
    w = shapes[1] if len(shapes) > 1 and op not in POOLS else None
    if op not in POOLS and w is None:
        return "the weight's shape is unknown"
    spatial = len(x) - 2
    if spatial < 1:
        return f"{op} input of rank {len(x)}"
    kernel = list(attrs.get("kernel_shape") or (w[2:] if w else []))
    if len(kernel) != spatial:
        return "kernel shape unknown"
    strides = list(attrs.get("strides") or [1] * spatial)
    dilations = list(attrs.get("dilations") or [1] * spatial)
    group = int(attrs.get("group", 1))
    per_axis = max(1, round(CONV_POSITIONS ** (1 / spatial)))
    changes: dict = {}
    wx = list(x)
    wx[0] = 1
    if op == "ConvTranspose":
        if attrs.get("output_shape") or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", ""):
            return "ConvTranspose with output_shape/auto_pad"
        pads = list(attrs.get("pads", [0] * (2 * spatial)))
        out_padding = list(attrs.get("output_padding", [0] * spatial))
        in_per_group, out_per_group = x[1] // group, w[1]
        # output channels of group 0 only: all of its input channels feed them
        ww = list(w)
        ww[0] = in_per_group
        ww[1] = min(out_per_group, CONV_CHANNELS)
        wx[1] = in_per_group
        # Inputs 0..n-1 give every output o < n*stride - pad_begin its full set of taps.
        for i in range(spatial):
            taps = math.ceil(kernel[i] * dilations[i] / strides[i])
            n = min(x[2 + i], taps + per_axis)
            if n < x[2 + i]:
                wx[2 + i] = n
                pads[spatial + i] = 0
                out_padding[i] = 0
        changes.update(pads=pads, output_padding=out_padding, group=1)
        windows: list[list[int] | None] = [wx, ww]
        if len(shapes) > 2 and shapes[2] is not None:
            windows.append([ww[1]])
        return Plan(windows, changes, how=f"{ww[1]} output channels, input cut to {wx[2:]}")
    pads = _explicit_pads(attrs, x, kernel, strides, dilations)
    if pads is None:
        return "unknown padding"
    new_pads = list(pads)
    for i in range(spatial):
        size = x[2 + i]
        span = (kernel[i] - 1) * dilations[i] + 1
        ceil_mode = attrs.get("ceil_mode", 0)
        out = ((size + pads[i] + pads[spatial + i] - span) // strides[i]) + 1
        if ceil_mode or out <= per_axis:
            continue
        need = (per_axis - 1) * strides[i] - pads[i] + span
        if need <= 0:
            continue
        wx[2 + i] = min(size, need)
        new_pads[spatial + i] = max(0, need - size)
    if "auto_pad" in attrs:
        changes["auto_pad"] = "NOTSET"
    changes["pads"] = new_pads
    if op in POOLS:
        wx[1] = min(x[1], CONV_CHANNELS)
        return Plan([wx] + [None] * (len(shapes) - 1), changes, how=f"{wx[1]} channels, input cut to {wx[2:]}")
    out_channels = w[0]
    in_per_group = w[1]
    per_group = out_channels // group
    ww = list(w)
    if group == 1:
        ww[0] = min(out_channels, CONV_CHANNELS)
    else:
        # the first groups' output channels, with exactly their input channels
        groups = max(1, min(group, CONV_CHANNELS // max(per_group, 1)))
        ww[0] = groups * per_group
        wx[1] = groups * in_per_group
        changes["group"] = groups
    windows = [wx, ww]
    if len(shapes) > 2 and shapes[2] is not None:
        windows.append([ww[0]])
    return Plan(windows, changes, how=f"{ww[0]} output channels of {out_channels}, input cut to {wx[2:]}, {in_per_group * math.prod(kernel)} terms per output")


def _plan_resize(shapes: list[list[int] | None], constants: dict[int, list[int]]) -> Plan | str:
    """Resize scales the spatial axes only (scales/sizes of 1 on N and C, as images have): a few
    channels of the first image, every position; `sizes`, when given, is cut to match."""
    x = shapes[0]
    if len(x) < 3:
        return "Resize of rank < 3"
    scales = constants.get(2)
    if scales and any(s != 1 for s in scales[:2]):
        return "Resize scales the batch or channel axis"
    wx = list(x)
    wx[0] = 1
    wx[1] = min(x[1], CONV_CHANNELS)
    windows: list[list[int] | None] = [wx] + [None] * (len(shapes) - 1)
    return Plan(windows, {"_resize_channels": wx[1]}, how=f"{wx[1]} channels")
