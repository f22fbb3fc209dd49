"""The `fp16w` variant: the fp32 graph with its float32 initializers stored as fp16 (half the bytes
on the wire), widened back to float32 before a session is created.

`narrow_initializers` makes the shipped model; `widen_model_bytes` is what the browser loader does to
it (web_template/loader/widen.js, its byte-for-byte twin, cross-checked by tests/test_fp16w.py), so
the host and webgpu-kernels checks run exactly the bytes the loader hands onnxruntime-web.

The widening rewrites the protobuf in place rather than re-serializing a parsed model: every field
other than an FLOAT16 initializer's `data_type` and `raw_data` is copied verbatim, so the result
does not depend on a protobuf library's field order and a JS walker of a few dozen lines can match
it. Only the main graph's initializers are narrowed (Constant nodes and subgraphs stay as they are:
they are small in the models pack ships), and only when the graph has no FLOAT16 initializer of its
own, so "every FLOAT16 initializer of the main graph" names exactly the narrowed ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.cache import cache_dir
from pipeline.errors import PackError

WIDEN = "fp16-initializers"  # manifest variants[name].widen
FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14
# Protobuf field numbers (onnx.proto3): ModelProto.graph, GraphProto.initializer,
# TensorProto.data_type / raw_data / data_location.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_DATA_TYPE, _TENSOR_RAW_DATA = 7, 5, 2, 9


class WidenError(ValueError):
    """The bytes are not a model this widening can read (truncated, or not made by pack)."""


@dataclass
class Narrowed:
    model: onnx.ModelProto
    narrowed: int = 0  # initializers stored as fp16
    kept: list[dict] = field(default_factory=list)  # [{initializer, why}]: float32 ones left as they are
    bytes_saved: int = 0


def keeps_fp32(values: np.ndarray) -> str | None:
    """Why a float32 tensor must stay float32, or None when fp16 storage holds it: every value
    finite and within fp16's range, and its largest magnitude a normal fp16 number, so rounding
    moves no value by more than half an fp16 step (2^-11) of the tensor's largest value (values
    far below that flush toward zero harmlessly; a tensor whose scale is itself tiny, an epsilon,
    would lose its digits)."""
    if values.size == 0:
        return "empty"
    if not np.isfinite(values).all():
        return "holds inf or NaN"
    largest = float(np.abs(values).max())
    if largest > FP16_MAX:
        return f"|value| up to {largest:.6g} > fp16 max {FP16_MAX:g}"
    if 0 < largest < FP16_MIN_NORMAL and not np.array_equal(values.astype(np.float16).astype(np.float32), values):
        return f"largest |value| {largest:.3g} is below fp16's normal range ({FP16_MIN_NORMAL:.3g}): fp16 would lose its digits"
    return None


def narrow_initializers(model: onnx.ModelProto) -> Narrowed | str:
    """A copy of the fp32 `model` whose main-graph float32 initializers are FLOAT16 (raw_data),
    those that must stay float32 listed with the reason; or the reason no fp16w variant can be made."""
    if any(t.data_type == FLOAT16 for t in model.graph.initializer):
        return "the fp32 graph has FLOAT16 initializers of its own: the loader could not tell them from narrowed ones"
    narrowed = onnx.ModelProto()
    narrowed.CopyFrom(model)
    result = Narrowed(narrowed)
    for tensor in narrowed.graph.initializer:
        if tensor.data_type != FLOAT:
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            result.kept.append({"initializer": tensor.name, "why": "external data"})
            continue
        values = numpy_helper.to_array(tensor)
        why = keeps_fp32(values)
        if why:
            result.kept.append({"initializer": tensor.name, "why": why})
            continue
        half = np.ascontiguousarray(values.astype("<f2"))
        before = tensor.ByteSize()
        tensor.ClearField("float_data")
        tensor.data_type = FLOAT16
        tensor.raw_data = half.tobytes()
        result.narrowed += 1
        result.bytes_saved += before - tensor.ByteSize()
    return result


# --- the widening, on the protobuf bytes ------------------------------------------------------


def _varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WidenError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WidenError("varint longer than 10 bytes")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(data: memoryview) -> list[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the key, start of the value, end) of each top-level field."""
    fields = []
    pos = 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value_start = pos
            _, pos = _varint(data, pos)
        elif wire == 1:
            value_start, pos = pos, pos + 8
        elif wire == 2:
            length, value_start = _varint(data, pos)
            pos = value_start + length
        elif wire == 5:
            value_start, pos = pos, pos + 4
        else:
            raise WidenError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise WidenError("field runs past the end of its message")
        fields.append((number, wire, start, value_start, pos))
    return fields


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _widen_tensor(data: memoryview) -> bytes | None:
    """The TensorProto widened to FLOAT, or None when it is not FLOAT16."""
    fields = _fields(data)
    type_field = next((f for f in fields if f[0] == _TENSOR_DATA_TYPE and f[1] == 0), None)
    if type_field is None or _varint(data, type_field[3])[0] != FLOAT16:
        return None
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA and f[1] == 2]
    if len(raw) != 1:
        raise WidenError("a FLOAT16 initializer without raw_data (not made by pack)")
    out = []
    for f in fields:
        number, wire, start, value_start, end = f
        if f is type_field:
            out.append(_encode_varint(_TENSOR_DATA_TYPE << 3) + _encode_varint(FLOAT))
        elif number == _TENSOR_RAW_DATA and wire == 2:
            half = np.frombuffer(data[value_start:end], dtype="<f2")
            out.append(_length_delimited(_TENSOR_RAW_DATA, half.astype("<f4").tobytes()))
        else:
            out.append(bytes(data[start:end]))
    return b"".join(out)


def _rewrite(data: memoryview, number_wanted: int, rewrite) -> tuple[bytes, int]:
    """`data` with each length-delimited field `number_wanted` passed through `rewrite` (None: as is)."""
    out = []
    count = 0
    for number, wire, start, value_start, end in _fields(data):
        if number == number_wanted and wire == 2:
            new, inner = rewrite(data[value_start:end])
            if new is not None:
                out.append(_length_delimited(number, new))
                count += inner
                continue
        out.append(bytes(data[start:end]))
    return b"".join(out), count


def widen_model_bytes(model: bytes) -> tuple[bytes, int]:
    """(the model with every FLOAT16 initializer of its main graph widened to FLOAT, how many)."""
    view = memoryview(model)

    def tensor(data: memoryview) -> tuple[bytes | None, int]:
        widened = _widen_tensor(data)
        return widened, int(widened is not None)

    def graph(data: memoryview) -> tuple[bytes, int]:
        return _rewrite(data, _GRAPH_INITIALIZER, tensor)

    return _rewrite(view, _MODEL_GRAPH, graph)


def widened_model_file(shipped: Path) -> Path:
    """The widened model (what the loader hands onnxruntime-web) of the shipped fp16w file, in the
    work cache keyed by the shipped bytes: the host and webgpu-kernels checks run this file."""
    try:
        data = shipped.read_bytes()
    except OSError as error:
        raise PackError(f"{shipped}: cannot read the fp16w model ({error.strerror or error}); rebuild the package") from None
    key = hashlib.sha256(Path(__file__).read_bytes() + b"\0" + data).hexdigest()  # this code and the bytes
    target = cache_dir("work", "fp16w-" + key) / "widened.onnx"
    if not target.exists():
        try:
            widened, _ = widen_model_bytes(data)
        except WidenError as error:
            raise PackError(f"{shipped}: not an fp16w model pack can widen ({error}); rebuild the package") from None
        partial = target.with_suffix(".partial")
        partial.write_bytes(widened)
        partial.replace(target)
    return target
