"""Time the fp16w widening (FLOAT16 initializers back to FLOAT) side by side in Python (the host
checks) and in JS (web_template/loader/widen.js, as the loader runs it, under node), on a
synthetic model of `--mb` MB of fp32 weights in 64 tensors. Prints one line per side. Needs node.

    .venv/bin/python scripts/bench/bench_fp16w_widen.py --mb 100 [--json]
    .venv/bin/python scripts/bench/bench_fp16w_widen.py --smoke --json   # 1 MB, one JS run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.graph.model_io import model_bytes  # noqa: E402
from pipeline.precision.fp16w import narrow_initializers, widen_model_bytes  # noqa: E402

WIDEN_JS = ROOT / "web_template" / "loader" / "widen.js"


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
    parser.add_argument("--smoke", action="store_true", help="1 MB and one JS run: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    mb, js_runs = (1.0, 1) if args.smoke else (args.mb, 3)
    model = synthetic(mb)
    fp32 = model_bytes(model)
    narrowed = model_bytes(narrow_initializers(model).model)
    start = time.perf_counter()
    widened, count = widen_model_bytes(narrowed)
    python_ms = (time.perf_counter() - start) * 1000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(narrowed)
        script = (
            f"import {{ widenFp16Initializers }} from {json.dumps(WIDEN_JS.as_uri())};\n"
            "import { readFileSync } from 'node:fs';\n"
            "const bytes = new Uint8Array(readFileSync(process.argv[1]));\n"
            "const times = []; let r;\n"
            f"for (let i = 0; i < {js_runs}; i++) {{ r = widenFp16Initializers(bytes); times.push(r.ms); }}\n"
            "console.log(JSON.stringify({ times, size: r.bytes.byteLength, node: process.version }));\n"
        )
        result = subprocess.run(["node", "--input-type=module", "-e", script, str(path)], capture_output=True, text=True, check=True)
        js = json.loads(result.stdout)
    assert js["size"] == len(widened), f"JS widened to {js['size']} B, Python to {len(widened)} B"
    if args.json:
        print(json.dumps({"fp32_bytes": len(fp32), "fp16w_bytes": len(narrowed), "tensors": count, "python_ms": round(python_ms, 1),
                          "js_ms": js["times"], "node": js["node"]}, indent=2))
        return
    print(f"fp32 {len(fp32) / 1e6:.1f} MB, fp16w {len(narrowed) / 1e6:.1f} MB ({len(narrowed) / len(fp32):.1%}), {count} tensors")
    print(f"python widen: {python_ms:.0f} ms")
    print(f"js widen (node {js['node']}): " + ", ".join(f"{t:.0f}" for t in js["times"]) + f" ms ({js_runs} runs)")


if __name__ == "__main__":
    main()
