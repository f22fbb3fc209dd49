"""Tensor element types: one table for ONNX element types, numpy dtypes and the names that
manifest.json, onnxruntime-web (`Tensor.type`) and the browser pages use ("float32", "int64", ...).

onnxruntime-web, numpy and the manifest share these names for every type pack supports; the
in-page side maps the same names to typed arrays (pipeline/verify/browser/page/runner.js).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

# name -> (ONNX element type, numpy dtype); the order is the order shown in error messages
TYPES: dict[str, tuple[int, type]] = {
    "float32": (TensorProto.FLOAT, np.float32),
    "float16": (TensorProto.FLOAT16, np.float16),
    "float64": (TensorProto.DOUBLE, np.float64),
    "int64": (TensorProto.INT64, np.int64),
    "int32": (TensorProto.INT32, np.int32),
    "int16": (TensorProto.INT16, np.int16),
    "int8": (TensorProto.INT8, np.int8),
    "uint64": (TensorProto.UINT64, np.uint64),
    "uint32": (TensorProto.UINT32, np.uint32),
    "uint16": (TensorProto.UINT16, np.uint16),
    "uint8": (TensorProto.UINT8, np.uint8),
    "bool": (TensorProto.BOOL, np.bool_),
}

NUMPY_DTYPES: dict[str, type] = {name: numpy for name, (_, numpy) in TYPES.items()}
ONNX_TO_NAME: dict[int, str] = {onnx_type: name for name, (onnx_type, _) in TYPES.items()}


def name_of_numpy(dtype) -> str | None:
    """The table's name of a numpy dtype, or None when pack does not carry that type."""
    name = np.dtype(dtype).name
    return name if name in TYPES else None


def name_of_onnx(elem_type: int) -> str | None:
    """The table's name of an ONNX element type, or None when pack does not carry that type."""
    return ONNX_TO_NAME.get(elem_type)


def onnx_type_name(elem_type: int) -> str:
    """A readable name for any ONNX element type: the table's, else ONNX's own in lower case."""
    known = ONNX_TO_NAME.get(elem_type)
    if known:
        return known
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return "?"
