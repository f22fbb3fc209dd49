"""Benchmark: pack's fp16 keep-in-fp32 search against onnxconverter-common's auto_mixed_precision.

One generated model (a chain of MatMul → Add → Tanh blocks, at least 500 nodes) with a few planted
fp16-unsafe nodes on side heads (each its own graph output, like the duration/pitch heads of a TTS
model): `Mul` by a constant above 1e4 (an int16-style scale), which fp16 conversion clamps to 1e4,
followed by a `Mul` by its inverse (below the clamp, so converted fine). Both tools
get the same model, the same inputs and the same pass criterion (pack's fp16 host thresholds,
`max_abs_of_range` and `rel_l2` <= 1e-2 per output against fp32 on onnxruntime CPU), measured side
by side in one run: trials, wall time and the number of nodes each keeps in fp32.

    python scripts/bench/bench_fp16_search.py [--blocks 170] [--plants 4] [--width 32] [--json]
    python scripts/bench/bench_fp16_search.py --hazards [--trials 80] [--json]   # issue 22's planted hazards
    python scripts/bench/bench_fp16_search.py --smoke --json   # 12 blocks, 1 plant, width 8
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

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
            scale = 70000.0 + 2000 * len(planted)
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
    from pipeline.verify.judgement.metrics import compare, judge
    from pipeline.verify.judgement.thresholds import threshold_for

    threshold = threshold_for("tensor", "fp16", "cpu")
    return all(judge(compare(r, a), threshold)[0] for r, a in zip(reference, actual))


def run_pack(model: onnx.ModelProto, feeds: dict, trials: int, seconds: float) -> dict:
    from pipeline.lockfile import LockFile
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.recipe import Recipe
    from pipeline.verify.stages import fp16_evaluators, onnxruntime_refusal
    from pipeline.verify.engines.host import run_model

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
    search = record.get("search") or {"trials": 0, "minimal": True}
    # +1: the first fp16 check (auto_mixed_precision's count has no such step).
    return {"trials": search["trials"] + 1, "seconds": round(wall, 2), "kept": sorted(k["node"] for k in record["kept"]), "passes": ok, "minimal": search["minimal"],
            "kept_why": {k["node"]: k["why"] for k in record["kept"]}, "model": fp16.model, "unfixable": search.get("unfixable"), "diagnosis": search.get("diagnosis"),
            "outcome": search.get("failed") or search.get("stopped") or "minimal", "ranked": [r["node"] for r in search.get("ranked", [])]}


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
    return {"trials": len(calls), "seconds": round(wall, 2), "kept": sorted(calls[-1]), "passes": converted is not None, "model": converted}


def make_hazard_model(seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, str]]:
    """One model per hazard class of issue 22, each on its own output: a constant beyond fp16's
    range, a ReduceMean over 65536 values (WebGPU's fp16 kernel returns 0), a ConvTranspose whose
    overlap-add exceeds 65504, a cancellation of a rounded constant, a loudness variance
    E[L²] − E[L]² whose L fans out to kept nodes, and a duration predictor feeding a Ceil."""
    rng = np.random.default_rng(seed)
    t = 32768
    f = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    i64 = lambda name, value: numpy_helper.from_array(np.asarray(value, np.int64), name)  # noqa: E731
    inits = [
        i64("all_axes", [1, 2]), i64("last", [2]), f("gain_big", 70000.0), f("gain_inv", 1 / 70000.0),
        f("ct_w", rng.normal(0, 1, (16, 1, 8)) * 9000), f("ct_scale", 1e-4), f("int16", 32768.0), f("dc_gain", 32600.3),
        f("three", 3.0), f("seventy", 70.0), f("dur_w", rng.normal(0, 0.05, (64, 64))), f("frame_rate", 10.3),
        f("enc_w", rng.normal(0, 0.125, (64, 1024))),
    ]
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["audio", "all_axes"], ["chunk_mean"], name="chunk_mean", keepdims=1),
        n("Sub", ["audio", "chunk_mean"], ["centred"], name="centre"),
        n("ReduceMean", ["centred", "last"], ["centred_mean"], name="standardised", keepdims=1),
        n("Mul", ["feat", "gain_big"], ["boosted"], name="boost"),
        n("Mul", ["boosted", "gain_inv"], ["gain_out"], name="unboost"),
        n("ConvTranspose", ["feat", "ct_w"], ["upsampled_raw"], name="upsample", strides=[4]),
        n("Mul", ["upsampled_raw", "ct_scale"], ["upsampled"], name="upsample_scale"),
        n("Tanh", ["feat"], ["tf"], name="tanh_feat"),
        n("Mul", ["tf", "int16"], ["pcm_raw"], name="pcm_scale"),
        n("Mul", ["tf", "dc_gain"], ["dc"], name="dc_est"),
        n("Sub", ["pcm_raw", "dc"], ["pcm"], name="dc_remove"),
        n("Mul", ["feat", "three"], ["l3"], name="loud_scale"),
        n("Add", ["l3", "seventy"], ["loud"], name="loudness"),
        n("Mul", ["loud", "loud"], ["loud_sq"], name="loud_square"),
        n("ReduceMean", ["loud_sq", "last"], ["e2"], name="mean_square", keepdims=1),
        n("ReduceMean", ["loud", "last"], ["e1"], name="mean", keepdims=1),
        n("Mul", ["e1", "e1"], ["e1_sq"], name="square_mean"),
        n("Sub", ["e2", "e1_sq"], ["loud_var"], name="variance"),
        n("MatMul", ["tf", "dur_w"], ["dur_logit"], name="duration_proj"),
        n("Exp", ["dur_logit"], ["dur"], name="duration"),
        n("Mul", ["dur", "frame_rate"], ["dur_frames"], name="to_frames"),
        n("Ceil", ["dur_frames"], ["frames"], name="frames_ceil"),
        # most of a real model's weights sit in layers fp16 handles: an encoder
        n("MatMul", ["feat", "enc_w"], ["embedding"], name="encoder"),
    ]
    outputs = {"centred_mean": [1, 2, 1], "gain_out": [1, 16, 64], "upsampled": [1, 1, 260], "pcm": [1, 16, 64], "loud_var": [1, 16, 1], "frames": [1, 16, 64], "embedding": [1, 16, 1024]}
    graph = helper.make_graph(
        nodes, "hazards",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 2, t]), helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 16, 64])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs.items()], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    feeds = {"audio": (rng.uniform(-0.5, 0.5, (1, 2, t)) + 0.3).astype(np.float32), "feat": rng.uniform(-1, 1, (1, 16, 64)).astype(np.float32)}
    planted = {"chunk_mean": "ReduceMean over 65536 values", "boost": "constant 70000", "upsample": "ConvTranspose above 65504",
               "dc_remove": "cancellation", "variance": "fan-out of L between kept nodes", "frames_ceil": "discrete op"}
    return model, feeds, planted


def judge_everywhere(model: onnx.ModelProto | None, reference: onnx.ModelProto, feeds: dict) -> dict[str, list[str]]:
    """Outputs a model fails on the host CPU and on the webgpu-kernels stage (where set up)."""
    from pipeline.verify.engines import webgpu_kernels
    from pipeline.verify.engines.host import run_model
    from pipeline.verify.judgement.metrics import compare, judge
    from pipeline.verify.judgement.thresholds import threshold_for

    if model is None:
        return {"host": ["no model"], "webgpu-kernels": ["no model"]}
    with tempfile.TemporaryDirectory() as tmp:
        ref_file, model_file = Path(tmp) / "ref.onnx", Path(tmp) / "m.onnx"
        onnx.save(reference, str(ref_file))
        onnx.save(model, str(model_file))
        expected = run_model(ref_file, feeds).outputs
        result = {}
        runs = {"host": (run_model(model_file, feeds), "cpu")}
        if webgpu_kernels.unavailable_reason() is None:
            runs["webgpu-kernels"] = (webgpu_kernels.run_on_webgpu(model_file, feeds, {}), "webgpu")
        for label, (run, ep) in runs.items():
            if run.outputs is None:
                result[label] = [f"did not run: {run.error}"]
                continue
            result[label] = [f"{name}: {judge(compare(value, run.outputs[name]), threshold_for('tensor', 'fp16', ep))[1]}" for name, value in expected.items()
                             if not judge(compare(value, run.outputs[name]), threshold_for("tensor", "fp16", ep))[0]]
    return result


def hazards_main(args: argparse.Namespace) -> None:
    model, feeds, planted = make_hazard_model()
    pack = run_pack(model, feeds, args.trials, args.seconds)
    amp = run_amp(model, feeds)
    rows = {"pack": pack, "auto_mixed_precision": amp}
    result = {"nodes": len(model.graph.node), "planted": planted}
    for label, row in rows.items():
        result[label] = {**{k: v for k, v in row.items() if k != "model"}, "fails": judge_everywhere(row["model"], model, feeds)}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"hazard model: {result['nodes']} nodes; planted: " + "; ".join(f"{k} ({v})" for k, v in planted.items()))
    for label in rows:
        row = result[label]
        print(f"{label}: {row['trials']} trials, {row['seconds']:.1f} s, {len(row['kept'])} kept: {', '.join(row['kept'])}" + (f"; search: {row['outcome']}" if row.get("outcome") else ""))
        for line in row.get("unfixable") or []:
            print(f"    not fixable by node choice: {line}")
        for line in row.get("diagnosis") or []:
            print(f"    what the search faced: {line}")
        if row.get("ranked"):
            print(f"    ranked first: {', '.join(row['ranked'])}")
        for place, failures in row["fails"].items():
            print(f"    {place}: " + ("passes every output" if not failures else "FAILS " + "; ".join(failures)))
        for node, why in (row.get("kept_why") or {}).items():
            print(f"    kept {node}: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=170)
    parser.add_argument("--plants", type=int, default=4)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hazards", action="store_true", help="the planted-hazard model of issue 22 instead of the chain")
    parser.add_argument("--smoke", action="store_true", help="a 12-block chain with 1 plant, width 8: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.blocks, args.plants, args.width = 12, 1, 8
    warnings.simplefilter("ignore")  # the converter warns once per clamped constant, per trial
    # A fresh cache: no conversion or host run is reused from an earlier run of the benchmark.
    fresh_cache = tempfile.mkdtemp(prefix="pack-bench-fp16-")
    atexit.register(shutil.rmtree, fresh_cache, True)
    os.environ["PACK_CACHE_DIR"] = fresh_cache
    if args.hazards:
        hazards_main(args)
        return
    model, planted = make_model(args.blocks, args.plants, args.width)
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, (4, args.width)).astype(np.float32)}
    pack = run_pack(model, feeds, args.trials, args.seconds)
    amp = run_amp(model, feeds)
    pack.pop("model"), amp.pop("model")
    result = {"nodes": len(model.graph.node), "planted": planted, "pack": {k: v for k, v in pack.items() if k != "kept_why"}, "auto_mixed_precision": amp,
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
