"""Sample inputs: from --inputs NPZ, per-input .npy files, constants or seeded random ranges; and the
raw little-endian `sample.bin` the package ships for the demo page and the browser checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from pipeline.dtypes import ONNX_TO_NAME
from pipeline.errors import PackError
from pipeline.recipe import InputSpec, Recipe

ONNX_TO_NUMPY = ONNX_TO_NAME  # the one dtype table (pipeline/dtypes.py)


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def tensor_dtype(info: onnx.ValueInfoProto) -> str:
    elem = info.type.tensor_type.elem_type
    if elem not in ONNX_TO_NUMPY:
        raise PackError(f"model input/output '{info.name}': element type {TensorProto.DataType.Name(elem)} is not supported by pack")
    return ONNX_TO_NUMPY[elem]


def declared_shape(info: onnx.ValueInfoProto) -> list[int | str]:
    dims = info.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]


def _resolve_shape(info: onnx.ValueInfoProto, spec: InputSpec | None, where: str) -> list[int]:
    model_shape = declared_shape(info)
    shape = spec.shape if spec and spec.shape is not None else model_shape
    if len(shape) != len(model_shape) and info.type.tensor_type.HasField("shape"):
        raise PackError(f"{where} '{info.name}': shape {shape} has rank {len(shape)}, the model expects {model_shape}")
    symbolic = [d for d in shape if not isinstance(d, int)]
    if symbolic:
        raise PackError(f"input '{info.name}' has symbolic dims {symbolic} ({model_shape}); give --input {info.name}=" + "x".join(str(d) if isinstance(d, int) else "N" for d in shape) + f" or recipe key inputs.{info.name}.shape")
    for want, declared in zip(shape, model_shape):
        if isinstance(declared, int) and declared and want != declared:
            raise PackError(f"{where} '{info.name}': shape {shape} does not match the model's {model_shape}")
    return shape


def make_feeds(model: onnx.ModelProto, recipe: Recipe, npz: Path | None) -> dict[str, np.ndarray]:
    inputs = graph_inputs(model)
    names = {i.name for i in inputs}
    for name in recipe.inputs:
        if name not in names:
            raise PackError(f"recipe key 'inputs.{name}': the model has no input '{name}'; its inputs are: {', '.join(sorted(names))}")
    given: dict[str, np.ndarray] = {}
    if npz is not None:
        try:
            with np.load(npz, allow_pickle=False) as archive:
                given = {key: archive[key] for key in archive.files}
        except (OSError, ValueError) as error:
            raise PackError(f"--inputs {npz}: cannot read as .npz ({error}); save with numpy.savez(path, name=array)") from None
        unknown = sorted(set(given) - names)
        if unknown:
            raise PackError(f"--inputs {npz}: keys {unknown} are not model inputs; expected {sorted(names)}")
    rng = np.random.default_rng(recipe.seed)
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        dtype = tensor_dtype(info)
        spec = recipe.inputs.get(info.name)
        if spec and spec.dtype and spec.dtype != dtype:
            raise PackError(f"recipe key 'inputs.{info.name}.dtype': '{spec.dtype}' but the model's input is {dtype}; remove the key or fix it")
        if info.name in given:
            array = np.asarray(given[info.name])
            where = f"--inputs {npz}"
        elif spec and spec.file:
            try:
                array = np.load(spec.file, allow_pickle=False)
            except (OSError, ValueError) as error:
                raise PackError(f"recipe key 'inputs.{info.name}.file': cannot read {spec.file} ({error}); give a .npy file") from None
            where = f"inputs.{info.name}.file"
        else:
            shape = _resolve_shape(info, spec, "recipe input")
            if spec and spec.value is not None:
                array = np.full(shape, spec.value)
            elif np.dtype(dtype).kind == "f":
                low, high = spec.range if spec and spec.range else (-1.0, 1.0)
                array = rng.uniform(low, high, size=shape)
            elif np.dtype(dtype).kind in "iu":
                low, high = spec.range if spec and spec.range else (0, 1)
                array = rng.integers(int(low), int(high), size=shape, endpoint=True)
            else:
                array = np.zeros(shape, dtype=bool)
            feeds[info.name] = array.astype(dtype)
            continue
        if array.dtype != np.dtype(dtype):
            if array.ndim == 0 or np.can_cast(array.dtype, dtype, casting="same_kind"):
                array = array.astype(dtype)
            else:
                raise PackError(f"{where}: '{info.name}' is {array.dtype}, the model expects {dtype}")
        if array.ndim == 0 and declared_shape(info):
            array = np.full(_resolve_shape(info, spec, where), array, dtype=dtype)
        _resolve_shape(info, InputSpec(info.name, shape=list(array.shape)), where)
        feeds[info.name] = array
    return feeds


def sample_bytes(feeds: dict[str, np.ndarray]) -> tuple[bytes, dict]:
    """Concatenated little-endian tensors and the manifest's `sample.tensors` description."""
    chunks, tensors, offset = [], {}, 0
    for name, array in feeds.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        # 8-byte alignment so the browser can view each tensor without copying.
        padding = (-offset) % 8
        chunks.append(b"\0" * padding)
        offset += padding
        tensors[name] = {"dtype": str(array.dtype), "dims": list(array.shape), "offset": offset, "length": len(data)}
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks), tensors
