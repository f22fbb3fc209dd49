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


def sample_bytes(feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray] | None = None) -> tuple[bytes, dict, dict]:
    """Concatenated little-endian tensors: the inputs, then their fp32 reference `outputs` (so a
    page can compare its own run with the build's); and the manifest's `sample.tensors` and
    `sample.outputs` descriptions."""
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

    tensors = {name: append(array) for name, array in feeds.items()}
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
