"""Time the fp16w widening (FLOAT16 initializers back to FLOAT) in Python (the host checks) and in
JS (web_template/loader/widen.js, as the loader runs it, under node), on a synthetic model of
`--mb` MB of fp32 weights in 64 tensors. Prints one line per side.

    .venv/bin/python scripts/bench_fp16w_widen.py --mb 100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from pipeline.graph.model_io import model_bytes
from pipeline.precision.fp16w import narrow_initializers, widen_model_bytes

WIDEN_JS = Path(__file__).resolve().parents[1] / "web_template" / "loader" / "widen.js"


def synthetic(mb: float, tensors: int = 64) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    per = int(mb * 1e6 / 4 / tensors)
    weights = [numpy_helper.from_array(rng.standard_normal(per).astype(np.float32) * 0.1, f"w{i}") for i in range(tensors)]
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"s{i - 1}", f"w{i}"], [f"s{i}" if i < tensors - 1 else "y"]) for i in range(tensors)]
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [per])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [per])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="MB of fp32 weights")
    args = parser.parse_args()
    model = synthetic(args.mb)
    fp32 = model_bytes(model)
    narrowed = model_bytes(narrow_initializers(model).model)
    start = time.perf_counter()
    widened, count = widen_model_bytes(narrowed)
    python_s = time.perf_counter() - start
    print(f"fp32 {len(fp32) / 1e6:.1f} MB, fp16w {len(narrowed) / 1e6:.1f} MB ({len(narrowed) / len(fp32):.1%}), {count} tensors")
    print(f"python widen: {python_s * 1000:.0f} ms")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(narrowed)
        script = (
            f"import {{ widenFp16Initializers }} from {json.dumps(WIDEN_JS.as_uri())};\n"
            "import { readFileSync } from 'node:fs';\n"
            "const bytes = new Uint8Array(readFileSync(process.argv[1]));\n"
            "const times = []; let r;\n"
            "for (let i = 0; i < 3; i++) { r = widenFp16Initializers(bytes); times.push(r.ms); }\n"
            "console.log(JSON.stringify({ times, size: r.bytes.byteLength }));\n"
        )
        result = subprocess.run(["node", "--input-type=module", "-e", script, str(path)], capture_output=True, text=True, check=True)
        js = json.loads(result.stdout)
    assert js["size"] == len(widened)
    print(f"js widen (node {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}): " + ", ".join(f"{t:.0f}" for t in js["times"]) + " ms (3 runs)")


if __name__ == "__main__":
    main()
