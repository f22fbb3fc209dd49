"""report.data.npz: what the last verification of a package produced that report.json does not
hold: the outputs each browser run compared (bounded by the harness), the host outputs of each
variant, and, after `pack verify`, that command's checks and browser facts (they replace the
build's in the report; report.json stays the build's record).

One .npz: the arrays under numbered keys, and `index`, a JSON string naming each (run label and
output name) and carrying the facts.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.cache import atomic_write
from pipeline.errors import PackError
from pipeline.report import REPORT_DATA


@dataclass
class ReportData:
    # run label ("cpu/fp16", "webgpu/fp32", "wasm/fp32 [wasm bundle]") -> output name -> array
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # set by `pack verify`: {"by": "pack verify", "checks": [...], "browser": {...}, "webgpu_kernels": {...}}
    verification: dict | None = None


def save(package: Path, data: ReportData) -> None:
    arrays: dict[str, np.ndarray] = {}
    entries = []
    for label, outputs in data.outputs.items():
        for name, array in outputs.items():
            key = f"a{len(arrays)}"
            arrays[key] = np.ascontiguousarray(array)
            entries.append({"key": key, "run": label, "output": name})
    index = {"outputs": entries, "verification": data.verification}
    arrays["index"] = np.array(json.dumps(index))
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write(Path(package) / REPORT_DATA, buffer.getvalue())


def load(package: Path) -> ReportData:
    """The package's report data; empty when it has none (a build made by an older pack, or
    under --no-browser before the host outputs were kept)."""
    path = Path(package) / REPORT_DATA
    if not path.is_file():
        return ReportData()
    try:
        with np.load(path, allow_pickle=False) as archive:
            index = json.loads(str(archive["index"]))
            outputs: dict[str, dict[str, np.ndarray]] = {}
            for entry in index["outputs"]:
                outputs.setdefault(entry["run"], {})[entry["output"]] = archive[entry["key"]]
    except OSError as error:
        raise PackError(f"{path}: cannot read ({error.strerror or error}); check its permissions") from None
    except (ValueError, KeyError, zipfile.BadZipFile):
        raise PackError(f"{path}: not a report data file that pack wrote; delete it and run `pack verify {package}` to make it again") from None
    return ReportData(outputs, index.get("verification"))
