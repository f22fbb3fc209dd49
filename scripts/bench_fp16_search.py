"""Benchmark: pack's fp16 keep-in-fp32 search against onnxconverter-common's auto_mixed_precision.

One generated model (a chain of MatMul → Add → Tanh blocks, at least 500 nodes) with a few planted
fp16-unsafe nodes on side heads (each its own graph output, like the duration/pitch heads of a TTS
model): `Mul` by a constant above 1e4 (an int16-style scale), which fp16 conversion clamps to 1e4,
followed by a `Mul` by its inverse (below the clamp, so converted fine). Both tools
get the same model, the same inputs and the same pass criterion (pack's fp16 host thresholds,
`max_abs_of_range` and `rel_l2` <= 1e-2 per output against fp32 on onnxruntime CPU), measured side
by side in one run: trials, wall time and the number of nodes each keeps in fp32.

Usage: python scripts/bench_fp16_search.py [--blocks 170] [--plants 4] [--width 32] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Weight scale of the chain: below 1 the chain contracts, so fp16 rounding does not grow along 170
# blocks and only the planted nodes need fp32 (at 1.2 the chain is chaotic and fp16 drifts past the
# thresholds by itself: auto_mixed_precision then kept 2 MatMuls besides the 4 planted nodes). The
# plants sit on side heads because a contracting chain would wash their error out.
GAIN = 0.9


def make_model(blocks: int, plants: int, width: int, seed: int = 0) -> tuple[onnx.ModelProto, list[str]]:
    rng = np.random.default_rng(seed)
    nodes, inits, planted, heads = [], [], [], []
    h = "x"
    plant_at = {int(b) for b in np.linspace(blocks * 0.1, blocks * 0.9, plants)}
    for b in range(blocks):
        w, bias = f"w{b}", f"b{b}"
        inits += [numpy_helper.from_array(rng.normal(0, GAIN / np.sqrt(width), (width, width)).astype(np.float32), w),
                  numpy_helper.from_array(rng.normal(0, 0.1, (width,)).astype(np.float32), bias)]
        nodes += [helper.make_node("MatMul", [h, w], [f"m{b}"], name=f"matmul_{b}"),
                  helper.make_node("Add", [f"m{b}", bias], [f"a{b}"], name=f"add_{b}"),
                  helper.make_node("Tanh", [f"a{b}"], [f"t{b}"], name=f"tanh_{b}")]
        h = f"t{b}"
        if b in plant_at:
            scale = 20000.0 + 2000 * len(planted)
            inits += [numpy_helper.from_array(np.array(scale, np.float32), f"big{b}"), numpy_helper.from_array(np.array(1 / scale, np.float32), f"inv{b}")]
            nodes += [helper.make_node("Mul", [h, f"big{b}"], [f"s{b}"], name=f"planted_scale_{b}"),
                      helper.make_node("Mul", [f"s{b}", f"inv{b}"], [f"head{b}"], name=f"unscale_{b}")]
            planted.append(f"planted_scale_{b}")
            heads.append(f"head{b}")
    nodes.append(helper.make_node("Identity", [h], ["y"], name="out"))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, width]) for name in ["y", *heads]]
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, planted


def passes(reference: list[np.ndarray], actual: list[np.ndarray]) -> bool:
    from pipeline.verify.metrics import compare, judge
    from pipeline.verify.thresholds import threshold_for

    threshold = threshold_for("tensor", "fp16", "cpu")
    return all(judge(compare(r, a), threshold)[0] for r, a in zip(reference, actual))


def run_pack(model: onnx.ModelProto, feeds: dict, trials: int, seconds: float) -> dict:
    from pipeline.lockfile import LockFile
    from pipeline.precision.kept import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.recipe import Recipe
    from pipeline.verify.checks import fp16_evaluators, onnxruntime_refusal
    from pipeline.verify.host import run_model

    with tempfile.TemporaryDirectory() as tmp:
        reference_file = Path(tmp) / "ref.onnx"
        onnx.save(model, str(reference_file))
        recipe = Recipe(name="bench", path=None, fp16_search_trials=trials, fp16_search_seconds=seconds)
        start = time.perf_counter()
        evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
        context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, LockFile(None), Progress.quiet(), onnxruntime_refusal(feeds))
        made = make_variants(model, recipe, "bench", context)
        report, variants = {"steps": made.steps}, made.variants
        wall = time.perf_counter() - start
        fp16 = next(v for v in variants if v.name == "fp16")
        fp16_file = Path(tmp) / "fp16.onnx"
        onnx.save(fp16.model, str(fp16_file))
        expected, actual = run_model(reference_file, feeds).outputs, run_model(fp16_file, feeds).outputs
        ok = passes([expected[name] for name in sorted(expected)], [actual[name] for name in sorted(expected)])
    record = next(s for s in report["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]
    search = record["search"]
    # +1: the all-fp16 check that found the failure (auto_mixed_precision's count has no such step).
    return {"trials": search["trials"] + 1, "seconds": round(wall, 2), "kept": sorted(k["node"] for k in record["kept"]), "passes": ok, "minimal": search["minimal"]}


def run_amp(model: onnx.ModelProto, feeds: dict) -> dict:
    from onnxconverter_common import auto_mixed_precision, float16

    real_convert = float16.convert_float_to_float16
    calls: list[list[str]] = []

    def counting_convert(*args, **kwargs):
        calls.append(list(kwargs.get("node_block_list") or []))
        return real_convert(*args, **kwargs)

    reference_holder: list = []

    def validate(reference, actual):
        reference_holder[:] = [reference]
        return passes(reference, actual)

    start = time.perf_counter()
    auto_mixed_precision.float16.convert_float_to_float16 = counting_convert
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            converted = auto_mixed_precision.auto_convert_mixed_precision(model, feeds, validate_fn=validate, keep_io_types=True)
    finally:
        auto_mixed_precision.float16.convert_float_to_float16 = real_convert
    wall = time.perf_counter() - start
    return {"trials": len(calls), "seconds": round(wall, 2), "kept": sorted(calls[-1]), "passes": converted is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=170)
    parser.add_argument("--plants", type=int, default=4)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the converter warns once per clamped constant, per trial
    # A fresh cache: no conversion or host run is reused from an earlier run of the benchmark.
    os.environ["PACK_CACHE_DIR"] = tempfile.mkdtemp(prefix="pack-bench-fp16-")
    model, planted = make_model(args.blocks, args.plants, args.width)
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, args.width)).astype(np.float32)}
    pack = run_pack(model, feeds, args.trials, args.seconds)
    amp = run_amp(model, feeds)
    result = {"nodes": len(model.graph.node), "planted": planted, "pack": pack, "auto_mixed_precision": amp,
              "trial_ratio": round(amp["trials"] / max(pack["trials"], 1), 1)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"model: {result['nodes']} nodes, {len(planted)} planted fp16-unsafe nodes: {', '.join(planted)}")
    print(f"{'':24}{'trials':>8}{'wall s':>9}{'kept':>6}  passes  kept nodes")
    for label, row in (("pack search", pack), ("auto_mixed_precision", amp)):
        kept = ", ".join(row["kept"][:6]) + (" ..." if len(row["kept"]) > 6 else "")
        print(f"{label:24}{row['trials']:>8}{row['seconds']:>9.1f}{len(row['kept']):>6}  {str(row['passes']):6}  {kept}")
    print(f"trials: auto_mixed_precision / pack = {result['trial_ratio']}x")


if __name__ == "__main__":
    main()
