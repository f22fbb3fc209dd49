"""fp16w side by side with fp32 on the flagship-architecture test exports (tests/data/flagship):
bytes, the initializers narrowed and kept, and each float output's error on onnxruntime CPU for
random inputs (seed 0), as the host check measures it. The figures behind fp16w's bounds
(pipeline/verify/judgement/thresholds.py, docs/precision.md).

    .venv/bin/python scripts/bench/measure_fp16w.py [NAME ...] [--json]
    .venv/bin/python scripts/bench/measure_fp16w.py --smoke --json   # the LaMa export only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.dtypes import NUMPY_DTYPES, name_of_onnx  # noqa: E402
from pipeline.graph.model_io import model_bytes  # noqa: E402
from pipeline.precision.fp16w import narrow_initializers, widen_model_bytes  # noqa: E402
from pipeline.verify.judgement.metrics import compare  # noqa: E402

FLAGSHIP = ROOT / "tests" / "data" / "flagship"
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


def measure(name: str, options: ort.SessionOptions) -> dict:
    """{"name", "fp32_bytes", "fp16w_bytes", "narrowed", "kept", "outputs": [{"index", "rel_l2", "max_abs_of_range"}]}, or
    {"name", "no_fp16w": why}."""
    model = onnx.load(str(FLAGSHIP / f"{name}.onnx"))
    narrowed = narrow_initializers(model)
    if isinstance(narrowed, str):
        return {"name": name, "no_fp16w": narrowed}
    fp32, shipped = model_bytes(model), model_bytes(narrowed.model)
    widened, _ = widen_model_bytes(shipped)
    feeds = feeds_for(model)
    runs = [ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds) for data in (fp32, widened)]
    outputs = []
    for index, (expected, actual) in enumerate(zip(*runs)):
        if expected.dtype.kind == "f":
            metrics = compare(expected, actual, "tensor")
            outputs.append({"index": index, "rel_l2": float(metrics["rel_l2"]), "max_abs_of_range": float(metrics["max_abs_of_range"])})
    return {"name": name, "fp32_bytes": len(fp32), "fp16w_bytes": len(shipped), "narrowed": narrowed.narrowed, "kept": len(narrowed.kept), "outputs": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"flagship exports (default: all of {', '.join(NAMES)})")
    parser.add_argument("--smoke", action="store_true", help="the LaMa export only: checks the script runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(NAMES))
    if unknown:
        parser.error(f"no flagship export {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    rows = [measure(name, options) for name in (["lama"] if args.smoke else args.names or NAMES)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        if "no_fp16w" in row:
            print(f"{row['name']}: no fp16w: {row['no_fp16w']}")
            continue
        for output in row["outputs"]:
            print(f"{row['name']} output {output['index']}: fp32 {row['fp32_bytes']} B, fp16w {row['fp16w_bytes']} B ({row['fp16w_bytes'] / row['fp32_bytes']:.0%}), "
                  f"{row['narrowed']} narrowed / {row['kept']} kept; rel_l2 {output['rel_l2']:.2g}, max_abs_of_range {output['max_abs_of_range']:.2g}")


if __name__ == "__main__":
    main()
