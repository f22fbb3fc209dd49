"""The package's sample file (`sample.<h16>.bin`): its inputs, then their fp32 reference outputs,
as raw little-endian tensors that manifest `sample.tensors` and `sample.outputs` describe.

Written by the build (pipeline/assets/package.py), read back by `pack verify`
(pipeline/verify/package.py) and the report (pipeline/report/render.py); the browser reads it with
the loader's own code (web_template/loader/tensors.js `readSample`), the runner page included.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import PackError

if TYPE_CHECKING:
    import numpy as np

ALIGNMENT = 8  # bytes: the browser views each tensor without copying
# Inputs of at most this many elements carry their values in the manifest (`sample.tensors[name].
# values`), for the loader's pre-warm run: scalars and selectors (a sample rate, a mode, a token id,
# a length) and small shape or parameter vectors are where zeros break a model (a division by the
# rate, a Range of length 0, a branch that rejects 0). 64 covers those with room; a larger input is
# signal or a recurrent state, for which zeros are a valid value (a state's initial one), and its
# values would cost manifest bytes every first visit pays. The pre-warm then still fetches no sample
# file: it feeds these values and zeros elsewhere.
PREWARM_VALUES_MAX_ELEMENTS = 64
# An int64 beyond this is not exactly a JSON number in the browser (a double): such a tensor stays zeros.
_EXACT_INT = 2**53


def prewarm_values(array: np.ndarray) -> list | None:
    """The flattened values of a small input for manifest `sample.tensors[name].values`, or None
    (over PREWARM_VALUES_MAX_ELEMENTS elements, a value JSON cannot carry exactly: NaN, infinities,
    integers past 2**53)."""
    import numpy as np

    array = np.asarray(array)
    if array.size > PREWARM_VALUES_MAX_ELEMENTS:
        return None
    flat = array.reshape(-1)
    if array.dtype == np.bool_:
        return [int(v) for v in flat]
    if np.issubdtype(array.dtype, np.integer):
        values = [int(v) for v in flat]
        return values if all(abs(v) < _EXACT_INT for v in values) else None
    if np.issubdtype(array.dtype, np.floating):
        if not np.all(np.isfinite(flat)):
            return None
        return [float(v) for v in flat]
    return None


def sample_bytes(feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray] | None = None) -> tuple[bytes, dict, dict]:
    """Concatenated little-endian tensors: the inputs, then their fp32 reference `outputs` (so a
    page can compare its own run with the build's); and the manifest's `sample.tensors` and
    `sample.outputs` descriptions. A small input's description also has its `values`
    (prewarm_values), which the loader's pre-warm feeds without fetching this file."""
    import numpy as np

    chunks: list[bytes] = []
    offset = 0

    def append(array: np.ndarray) -> dict:
        nonlocal offset
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        padding = (-offset) % ALIGNMENT
        chunks.append(b"\0" * padding)
        offset += padding
        entry = {"dtype": str(array.dtype), "dims": list(array.shape), "offset": offset, "length": len(data)}
        chunks.append(data)
        offset += len(data)
        return entry

    tensors = {}
    for name, array in feeds.items():
        tensors[name] = append(array)
        values = prewarm_values(array)
        if values is not None:
            tensors[name]["values"] = values
    described = {name: append(np.asarray(array)) for name, array in (outputs or {}).items()}
    return b"".join(chunks), tensors, described


def read_sample(package: Path, manifest: dict) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The sample inputs and the fp32 reference outputs of a built package, decoded from
    `sample.<h>.bin` (or its .br copy; or its parts) as manifest `sample` describes them."""
    import brotli
    import numpy as np

    from pipeline.dtypes import NUMPY_DTYPES

    from pipeline.manifest import file_parts

    sample = manifest["sample"]

    def body(path: Path) -> bytes:
        if path.is_file():
            return path.read_bytes()
        if path.with_name(path.name + ".br").is_file():
            return brotli.decompress(path.with_name(path.name + ".br").read_bytes())
        raise PackError(f"{path}: sample file missing; rebuild the package")

    # over [assets] max_file_mib: in parts (manifest `split`), joined in order
    raw = b"".join(body(Path(package) / part) for part in file_parts(manifest, sample["file"]))

    def decode(key: str) -> dict[str, np.ndarray]:
        arrays = {}
        for name, tensor in (sample.get(key) or {}).items():
            dtype = NUMPY_DTYPES.get(tensor["dtype"])
            if dtype is None:
                raise PackError(f"manifest.json sample.{key}.{name}: dtype {tensor['dtype']!r} unsupported; rebuild the package")
            chunk = raw[tensor["offset"]: tensor["offset"] + tensor["length"]]
            arrays[name] = np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<")).reshape(tensor["dims"]).copy()
        return arrays

    return decode("tensors"), decode("outputs")
