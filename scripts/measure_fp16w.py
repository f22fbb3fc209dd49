"""fp16w against fp32 on the flagship-architecture test exports (tests/data/flagship): bytes, the
initializers narrowed and kept, and each float output's error on onnxruntime CPU for random
inputs (seed 0), as the host check measures it. The figures behind fp16w's bounds
(pipeline/verify/thresholds.py, docs/precision.md).

    PYTHONPATH=. .venv/bin/python scripts/measure_fp16w.py [NAME ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from pipeline.dtypes import NUMPY_DTYPES, name_of_onnx
from pipeline.graph.model_io import model_bytes
from pipeline.precision.fp16w import narrow_initializers, widen_model_bytes
from pipeline.verify.metrics import compare

FLAGSHIP = Path(__file__).resolve().parents[1] / "tests" / "data" / "flagship"
NAMES = ("lama", "migan", "vocos", "mdx", "mpsenet", "htdemucs", "scnet", "wavtokenizer")


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for info in model.graph.input:
        if info.name in initializers:
            continue
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in info.type.tensor_type.shape.dim]
        dtype = NUMPY_DTYPES[name_of_onnx(info.type.tensor_type.elem_type)]
        feeds[info.name] = rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else np.zeros(shape, dtype)
    return feeds


def main(names: list[str]) -> None:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for name in names:
        model = onnx.load(str(FLAGSHIP / f"{name}.onnx"))
        narrowed = narrow_initializers(model)
        if isinstance(narrowed, str):
            print(f"{name}: no fp16w: {narrowed}")
            continue
        fp32, shipped = model_bytes(model), model_bytes(narrowed.model)
        widened, _ = widen_model_bytes(shipped)
        feeds = feeds_for(model)
        outputs = [ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds) for data in (fp32, widened)]
        for index, (expected, actual) in enumerate(zip(*outputs)):
            if expected.dtype.kind != "f":
                continue
            metrics = compare(expected, actual, "tensor")
            print(f"{name} output {index}: fp32 {len(fp32)} B, fp16w {len(shipped)} B ({len(shipped) / len(fp32):.0%}), "
                  f"{narrowed.narrowed} narrowed / {len(narrowed.kept)} kept; rel_l2 {metrics['rel_l2']:.2g}, max_abs_of_range {metrics['max_abs_of_range']:.2g}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(NAMES))
