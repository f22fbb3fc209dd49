"""Tensor element types: one table for ONNX element types, numpy dtypes and the names that
manifest.json, onnxruntime-web (`Tensor.type`) and the browser pages use ("float32", "int64", ...).

onnxruntime-web, numpy and the manifest share these names for every type pack supports; the
in-page side maps the same names to typed arrays (pipeline/verify/engines/browser/page/runner.js).
"""

from __future__ import annotations

# name -> ONNX element type; the order is the order shown in error messages. The element types are
# onnx.TensorProto's numbers (fixed by the ONNX spec), written out, and the names are numpy's own,
# so that reading a recipe imports neither onnx nor numpy.
TYPES: dict[str, int] = {
    "float32": 1,    # TensorProto.FLOAT
    "float16": 10,   # TensorProto.FLOAT16
    "float64": 11,   # TensorProto.DOUBLE
    "int64": 7,      # TensorProto.INT64
    "int32": 6,      # TensorProto.INT32
    "int16": 5,      # TensorProto.INT16
    "int8": 3,       # TensorProto.INT8
    "uint64": 13,    # TensorProto.UINT64
    "uint32": 12,    # TensorProto.UINT32
    "uint16": 4,     # TensorProto.UINT16
    "uint8": 2,      # TensorProto.UINT8
    "bool": 9,       # TensorProto.BOOL
}

ONNX_TO_NAME: dict[int, str] = {onnx_type: name for name, onnx_type in TYPES.items()}

# name -> the typed array onnxruntime-web's Tensor.data is for it, as loader.d.ts names it (float16:
# Float16Array where the browser has it, else Uint16Array: the union of every array, TensorData).
TYPED_ARRAYS: dict[str, str] = {
    "float32": "Float32Array", "float16": "TensorData", "float64": "Float64Array",
    "int64": "BigInt64Array", "int32": "Int32Array", "int16": "Int16Array", "int8": "Int8Array",
    "uint64": "BigUint64Array", "uint32": "Uint32Array", "uint16": "Uint16Array", "uint8": "Uint8Array", "bool": "Uint8Array",
}


def __getattr__(attribute: str):
    # NUMPY_DTYPES (name -> numpy scalar type) is made on first use: numpy loads only where used.
    if attribute == "NUMPY_DTYPES":
        import numpy as np

        return {name: np.dtype(name).type for name in TYPES}
    raise AttributeError(attribute)


def name_of_numpy(dtype) -> str | None:
    """The table's name of a numpy dtype, or None when pack does not carry that type."""
    import numpy as np

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
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return "?"
