"""Benchmark the browser harness: its fixed cost, then a small model's times per (bundle, EP) side by side.

    .venv/bin/python scripts/bench/bench_browser.py [--repeat 3] [--json]
    .venv/bin/python scripts/bench/bench_browser.py --smoke --json   # one repetition, a one-layer model, one bundle

Fixed cost = launch Chromium, probe the adapter, serve a one-node package and get its first checked
result through the package's loader (target: under 5 s on a 2-core machine without a GPU).
Per-EP times = session create / first run / steady run of a small conv stack, one row per (bundle,
EP): webgpu and wasm of the desktop chain beside wasm of the apple-mobile one. Needs Chromium.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from browser_helpers import IR_VERSION, Variant, negative_step_slice_model, reference_of, thresholds_for, write_package  # noqa: E402
from pipeline.verify.engines.browser.chromium import launch_browser  # noqa: E402
from pipeline.verify.engines.browser.harness import verify_in_browser  # noqa: E402

FIXED_COST_TARGET_S = 5.0


def conv_stack(layers: int = 4, channels: int = 16, size: int = 32):
    """`layers` 3x3 Conv+Relu, 1 x channels x size x size (about 19 MFLOP per layer at the defaults)."""
    rng = np.random.default_rng(0)
    nodes, initializers, current = [], [], "x"
    for index in range(layers):
        weights = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weights, f"W{index}"))
        nodes.append(helper.make_node("Conv", [current, f"W{index}"], [f"c{index}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name=f"conv{index}"))
        current = f"r{index}" if index < layers - 1 else "y"
        nodes.append(helper.make_node("Relu", [f"c{index}"], [current], name=f"relu{index}"))
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION), shape


def fixed_cost(tmp: Path) -> float:
    model = negative_step_slice_model()
    feeds = {"x": np.arange(31, dtype=np.float32).reshape(1, 1, 1, 31)}
    package = write_package(tmp / f"slice-{time.monotonic_ns()}", {"fp32": Variant(model)}, feeds, chains={"desktop": ["webgpu"]})
    reference = reference_of(model, feeds, tmp)
    started = time.monotonic()
    result = verify_in_browser(package, reference, thresholds_for(package))  # launches its own browser
    elapsed = time.monotonic() - started
    if [c["status"] for c in result.checks] != ["passed"]:
        raise SystemExit(f"fixed-cost run did not pass: {result.checks}")
    return elapsed


def per_ep(tmp: Path, repeat: int, layers: int, size: int, chains: dict[str, list[str]]) -> dict[str, dict[str, list[float]]]:
    model, shape = conv_stack(layers=layers, size=size)
    feeds = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    package = write_package(tmp / "convs", {"fp32": Variant(model)}, feeds, chains=chains)
    reference = reference_of(model, feeds, tmp)
    figures: dict[str, dict[str, list[float]]] = {}
    with launch_browser() as browser:
        for _ in range(repeat):
            result = verify_in_browser(package, reference, thresholds_for(package), browser=browser)
            for label, run in result.report["eps"].items():
                for key in ("session_create_ms", "first_run_ms", "steady_run_ms"):
                    figures.setdefault(label, {}).setdefault(key, []).append(run.get(key, float("nan")))
                if run["status"] != "passed":
                    print(f"warning: {label} {run['status']}: {run.get('error') or ''}", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (medians are printed)")
    parser.add_argument("--smoke", action="store_true", help="one repetition of a one-layer 8x8 model: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    repeat, layers, size = (1, 1, 8) if args.smoke else (args.repeat, 4, 32)
    # the wasm bundle of the apple-mobile chain beside the webgpu bundle's EPs (smoke: the desktop chain only)
    chains = {"desktop": ["webgpu", "wasm"]} if args.smoke else {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]}
    with tempfile.TemporaryDirectory(prefix="pack-bench-browser-") as scratch:
        tmp = Path(scratch)
        costs = [fixed_cost(tmp) for _ in range(repeat)]
        medians = {label: {key: statistics.median(v) for key, v in values.items()} for label, values in per_ep(tmp, repeat, layers, size, chains).items()}
    median = statistics.median(costs)
    if args.json:
        print(json.dumps({"fixed_cost_s": costs, "fixed_cost_median_s": median, "target_s": FIXED_COST_TARGET_S,
                          "model": {"layers": layers, "size": size}, "per_ep_median_ms": medians}, indent=2))
        return
    verdict = "ok" if median < FIXED_COST_TARGET_S else "OVER TARGET"
    print(f"fixed cost (launch -> first checked result, 1 run): median {median:.2f} s "
          f"(runs: {', '.join(f'{c:.2f}' for c in costs)}); target < {FIXED_COST_TARGET_S:.0f} s: {verdict}")
    print(f"small model ({layers}x Conv3x3 16ch on 1x16x{size}x{size}), medians in ms:")
    print(f"  {'run':<28} {'create':>8} {'first':>8} {'steady':>8}")
    for label, row in medians.items():
        print(f"  {label:<28} {row['session_create_ms']:>8.0f} {row['first_run_ms']:>8.0f} {row['steady_run_ms']:>8.1f}")


if __name__ == "__main__":
    main()
