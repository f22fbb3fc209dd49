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

A chunked fp16w model (pipeline/assets/chunks.py) is its graph plus external data whose narrowed
initializers fill the tail, from an offset the manifest records (`externalData.widened.offset`) to
the end. Widening it rewrites the graph's FLOAT16 initializers to FLOAT, those in the external data
with their `offset` and `length` entries moved to where their float32 bytes land, and the external
data to its bytes before that offset as they are, then every fp16 value after it as float32
(`widen_external_data`): per initializer, the same float32 bytes `widen_model_bytes` gives the
one-file model. The loader widens each chunk straight into place as it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from pipeline.keys import stage_key
from pipeline.cache import atomic_write, cache_dir, cached_entry
from pipeline.errors import PackError

WIDEN = "fp16-initializers"  # manifest variants[name].widen
FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types
FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14
# Protobuf field numbers (onnx.proto3): ModelProto.graph, GraphProto.initializer,
# TensorProto.data_type / raw_data / external_data / data_location, StringStringEntryProto.key / value.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_DATA_TYPE, _TENSOR_RAW_DATA = 7, 5, 2, 9
_TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION, _ENTRY_KEY, _ENTRY_VALUE = 13, 14, 1, 2
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_MAX_SAFE = 2**53 - 1  # offsets and lengths the JS twin reads as plain numbers


@dataclass(frozen=True)
class WidenedLayout:
    """Where a chunked fp16w model's external data holds the fp16 values to widen: the location
    its initializers name, the offset from which every byte pair is one fp16 value, and the size
    of the external data as shipped (manifest externalData.path, .widened.offset, .size)."""

    location: str
    offset: int
    size: int


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


def _decimal(data: memoryview, what: str) -> int:
    text = bytes(data)
    if not text or len(text) > 16 or not text.isdigit() or int(text) > _MAX_SAFE:
        raise WidenError(f"external data {what} {text[:20]!r} is not a decimal number")
    return int(text)


def _widen_external(data: memoryview, fields: list, type_field: tuple, layout: WidenedLayout) -> bytes:
    """A FLOAT16 initializer in the external data, as FLOAT at the place of its widened bytes."""
    entries = []  # (field, key) per external_data entry
    values: dict[bytes, memoryview] = {}
    for f in fields:
        if f[0] == _TENSOR_EXTERNAL_DATA and f[1] == 2:
            inner = {g[0]: g for g in _fields(data[f[3] : f[4]]) if g[0] in (_ENTRY_KEY, _ENTRY_VALUE) and g[1] == 2}
            if _ENTRY_KEY not in inner or _ENTRY_VALUE not in inner:
                raise WidenError("an external_data entry without key or value")
            entry = data[f[3] : f[4]]
            key = bytes(entry[inner[_ENTRY_KEY][3] : inner[_ENTRY_KEY][4]])
            values[key] = entry[inner[_ENTRY_VALUE][3] : inner[_ENTRY_VALUE][4]]
            entries.append((f, key))
    if bytes(values.get(b"location", b"")) != layout.location.encode():
        raise WidenError(f"a FLOAT16 initializer in external data other than {layout.location!r}")
    if b"offset" not in values or b"length" not in values:
        raise WidenError("a FLOAT16 initializer in external data without offset and length")
    offset, length = _decimal(values[b"offset"], "offset"), _decimal(values[b"length"], "length")
    if offset < layout.offset or (offset - layout.offset) % 2 or length % 2 or offset + length > layout.size:
        raise WidenError(f"a FLOAT16 initializer at bytes {offset}-{offset + length} of the external data, outside its fp16 values ({layout.offset}-{layout.size})")
    moved = {b"offset": str(layout.offset + 2 * (offset - layout.offset)).encode(), b"length": str(2 * length).encode()}
    keyed = {f: key for f, key in entries}
    out = []
    for f in fields:
        number, wire, start, value_start, end = f
        if f is type_field:
            out.append(_encode_varint(_TENSOR_DATA_TYPE << 3) + _encode_varint(FLOAT))
        elif keyed.get(f) in moved:
            entry = data[value_start:end]
            parts = []
            for g in _fields(entry):
                if g[0] == _ENTRY_VALUE and g[1] == 2:
                    parts.append(_length_delimited(_ENTRY_VALUE, moved[keyed[f]]))
                else:
                    parts.append(bytes(entry[g[2] : g[4]]))
            out.append(_length_delimited(_TENSOR_EXTERNAL_DATA, b"".join(parts)))
        else:
            out.append(bytes(data[start:end]))
    return b"".join(out)


def _widen_tensor(data: memoryview, layout: WidenedLayout | None = None) -> bytes | None:
    """The TensorProto widened to FLOAT, or None when it is not FLOAT16."""
    fields = _fields(data)
    type_field = next((f for f in fields if f[0] == _TENSOR_DATA_TYPE and f[1] == 0), None)
    if type_field is None or _varint(data, type_field[3])[0] != FLOAT16:
        return None
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA and f[1] == 2]
    location = next((f for f in fields if f[0] == _TENSOR_DATA_LOCATION and f[1] == 0), None)
    if not raw and location is not None and _varint(data, location[3])[0] == _EXTERNAL:
        if layout is None:
            raise WidenError("a FLOAT16 initializer in external data, and no widened layout for it")
        return _widen_external(data, fields, type_field, layout)
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


def widen_model_bytes(model: bytes, layout: WidenedLayout | None = None) -> tuple[bytes, int]:
    """(the model with every FLOAT16 initializer of its main graph widened to FLOAT, how many).
    With `layout`, the model is a chunked fp16w graph: its FLOAT16 initializers in the external
    data point at their bytes in `widen_external_data` of it."""
    view = memoryview(model)

    def tensor(data: memoryview) -> tuple[bytes | None, int]:
        widened = _widen_tensor(data, layout)
        return widened, int(widened is not None)

    def graph(data: memoryview) -> tuple[bytes, int]:
        return _rewrite(data, _GRAPH_INITIALIZER, tensor)

    return _rewrite(view, _MODEL_GRAPH, graph)


def widen_external_data(data: bytes | memoryview, offset: int) -> bytes:
    """A chunked fp16w model's external data as the loader hands it to onnxruntime-web: the bytes
    before `offset` as they are, then every fp16 value from `offset` on as float32."""
    if offset % 2 or (len(data) - offset) % 2 or not 0 <= offset <= len(data):
        raise WidenError(f"fp16 values from byte {offset} of {len(data)} are not whole")
    if offset == len(data):
        return bytes(data)
    return bytes(data[:offset]) + np.frombuffer(data, dtype="<f2", offset=offset).astype("<f4").tobytes()


def widened_model_file(shipped: Path) -> Path:
    """The widened model (what the loader hands onnxruntime-web) of the shipped fp16w file, in the
    work cache keyed by the shipped bytes: the host and webgpu-kernels checks run this file."""
    try:
        data = shipped.read_bytes()
    except OSError as error:
        raise PackError(f"{shipped}: cannot read the fp16w model ({error.strerror or error}); rebuild the package") from None
    key = stage_key("fp16w-widen", inputs={"shipped": hashlib.sha256(data).hexdigest()}, code=("pipeline.precision.fp16w",), libraries=("numpy",))
    target = cache_dir("work", "fp16w-" + key) / "widened.onnx"
    if not cached_entry(target):
        try:
            widened, _ = widen_model_bytes(data)
        except WidenError as error:
            raise PackError(f"{shipped}: not an fp16w model pack can widen ({error}); rebuild the package") from None
        atomic_write(target, widened, entry=True)
    return target
