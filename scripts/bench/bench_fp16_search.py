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
    python scripts/bench/bench_fp16_search.py --corpus [--json]   # conversion time per model
    python scripts/bench/bench_fp16_search.py --corpus --smoke --json   # one export and the two small generated models

`--corpus` times what the build spends on the fp16 variant (source repairs, conversion, the
host and webgpu-kernels checks of each candidate, the keep-in-fp32 search when one runs) on every
export of tests/data/exporter_corpus/ and on two models built here with onnx.helper: a
paddle2onnx-style OCR recogniser (weights in `Constant` nodes, a `-1` batch dim, 62 Convs, about
5 MB) and a VITS-style voice (a duration predictor whose `Ceil` decides the waveform's length).
The target: at most 180 s for a model of at most 60 MB on a 2-core machine.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # measure_fp16_corpus: the corpus and its dims

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


def paddle_style_model(convs: int = 62, channels: int = 48, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """An OCR recogniser as paddle2onnx writes it: every weight in a `Constant` node, the batch dim
    `-1`, Conv + folded-BN scale + HardSwish blocks with residual adds; `convs` Convs in all."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = []

    def constant(name: str, value: np.ndarray) -> str:
        nodes.append(n("Constant", [], [name], value=numpy_helper.from_array(value.astype(np.float32), name), name=f"{name}_const"))
        return name

    h = "x"
    nodes.append(n("Conv", [h, constant("stem_w", rng.normal(0, 0.3, (channels, 3, 3, 3))), constant("stem_b", np.zeros(channels))], ["stem"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem_conv"))
    h = "stem"
    for index in range(convs - 1):
        w = constant(f"w{index}", rng.normal(0, np.sqrt(2 / (9 * channels)), (channels, channels, 3, 3)))
        b = constant(f"b{index}", rng.normal(0, 0.05, channels))
        # a folded BN's small gamma on the residual branch, as trained residual nets have it: with
        # gammas near 1 the 61 residual adds grow values without bound (overflow in fp16 and
        # every node "needed" in fp32: a search that cannot succeed, 570 s measured)
        scale = constant(f"s{index}", rng.uniform(0.05, 0.15, (1, channels, 1, 1)))
        nodes += [n("Conv", [h, w, b], [f"c{index}"], pads=[1, 1, 1, 1], name=f"conv_{index}"),
                  n("Mul", [f"c{index}", scale], [f"m{index}"], name=f"bn_{index}"),
                  n("HardSwish", [f"m{index}"], [f"a{index}"], name=f"act_{index}"),
                  n("Add", [f"a{index}", h], [f"r{index}"], name=f"residual_{index}")]
        h = f"r{index}"
    nodes += [n("ReduceMean", [h], ["pooled"], axes=[2], keepdims=0, name="pool_h"),
              n("Transpose", ["pooled"], ["seq"], perm=[0, 2, 1], name="to_seq"),
              n("MatMul", ["seq", constant("head_w", rng.normal(0, 0.1, (channels, 97)))], ["logits"], name="head"),
              n("Softmax", ["logits"], ["probs"], axis=-1, name="probs")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 32, 128])
    graph = helper.make_graph(nodes, "paddle_rec", [x], [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [-1, 64, 97])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model, {"x": rng.uniform(0, 1, (1, 3, 32, 128)).astype(np.float32)}


def vits_style_model(tokens: int = 32, width: int = 192, layers: int = 4, seed: int = 0) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A VITS-style voice: token embeddings, a MatMul encoder, a duration predictor (`Exp`, a
    length scale, `Ceil`, cast to int64) whose durations decide how many frames each token gets
    (`CumSum`, `Range`, a comparison count, `Gather`), and a ConvTranspose decoder upsampling
    frames 64x to samples: the waveform's length is decided by the float durations."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    f = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)  # noqa: E731
    i64 = lambda name, value: numpy_helper.from_array(np.asarray(value, np.int64), name)  # noqa: E731
    inits = [f("embed", rng.normal(0, 1, (64, width))), f("dur_w", rng.normal(0, 0.3 / np.sqrt(width), (width, 1))), f("dur_b", [0.6]),
             f("length_scale", [1.0003]), i64("zero", 0), i64("one", 1), i64("axis0", [0]), i64("axis1", [1]), i64("last", [-1]),
             f("dec_w", rng.normal(0, 1 / np.sqrt(width), (width, 64))), f("up1", rng.normal(0, 0.1, (64, 32, 16))), f("up2", rng.normal(0, 0.1, (32, 16, 16))),
             f("post", rng.normal(0, 0.2, (1, 16, 7)))]
    nodes = [n("Gather", ["embed", "tokens"], ["h0"], axis=0, name="embedding")]
    h = "h0"
    for index in range(layers):
        inits += [f(f"enc_w{index}", rng.normal(0, 1 / np.sqrt(width), (width, width))), f(f"enc_b{index}", rng.normal(0, 0.05, width))]
        nodes += [n("MatMul", [h, f"enc_w{index}"], [f"e{index}"], name=f"enc_mm{index}"), n("Add", [f"e{index}", f"enc_b{index}"], [f"eb{index}"], name=f"enc_add{index}"),
                  n("Tanh", [f"eb{index}"], [f"h{index + 1}"], name=f"enc_act{index}")]
        h = f"h{index + 1}"
    nodes += [
        n("MatMul", [h, "dur_w"], ["dur_logit0"], name="dur_proj"), n("Add", ["dur_logit0", "dur_b"], ["dur_logit"], name="dur_bias"),
        n("Exp", ["dur_logit"], ["dur_exp"], name="dur_exp"), n("Mul", ["dur_exp", "length_scale"], ["dur_scaled"], name="dur_scale"),
        n("Ceil", ["dur_scaled"], ["dur_ceil"], name="dur_ceil"), n("Cast", ["dur_ceil"], ["dur_int"], to=TensorProto.INT64, name="dur_int"),
        n("Squeeze", ["dur_int", "last"], ["dur"], name="dur_squeeze"),  # [1, T]
        n("CumSum", ["dur", "one"], ["ends"], name="dur_cumsum"), n("ReduceSum", ["dur"], ["total"], keepdims=0, name="dur_total"),
        n("Range", ["zero", "total", "one"], ["frame"], name="frames"),  # [F]
        n("Unsqueeze", ["frame", "axis1"], ["frame_col"], name="frame_col"),  # [F, 1]
        n("LessOrEqual", ["ends", "frame_col"], ["done"], name="tokens_done"),  # [F, T]
        n("Cast", ["done"], ["done_int"], to=TensorProto.INT64, name="done_int"), n("ReduceSum", ["done_int", "axis1"], ["token_of_frame"], keepdims=0, name="token_of_frame"),
        n("Squeeze", [h, "axis0"], ["h_tokens"], name="drop_batch"), n("Gather", ["h_tokens", "token_of_frame"], ["h_frames"], axis=0, name="expand"),
        n("MatMul", ["h_frames", "dec_w"], ["dec"], name="dec_proj"), n("Transpose", ["dec"], ["dec_t"], perm=[1, 0], name="dec_t"),
        n("Unsqueeze", ["dec_t", "axis0"], ["dec_in"], name="dec_in"),  # [1, 64, F]
        n("ConvTranspose", ["dec_in", "up1"], ["u1"], strides=[8], pads=[4, 4], name="upsample1"), n("LeakyRelu", ["u1"], ["u1a"], alpha=0.1, name="up1_act"),
        n("ConvTranspose", ["u1a", "up2"], ["u2"], strides=[8], pads=[4, 4], name="upsample2"), n("LeakyRelu", ["u2"], ["u2a"], alpha=0.1, name="up2_act"),
        n("Conv", ["u2a", "post"], ["wav_raw"], pads=[3, 3], name="post_conv"), n("Tanh", ["wav_raw"], ["wav"], name="wav"),
    ]
    graph = helper.make_graph(nodes, "vits_like", [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, tokens])],
                              [helper.make_tensor_value_info("wav", TensorProto.FLOAT, [1, 1, "samples"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model, {"tokens": rng.integers(0, 64, (1, tokens)).astype(np.int64)}


def time_conversion(model: onnx.ModelProto, feeds: dict[str, np.ndarray], name: str) -> dict:
    """What the build spends on the fp16 variant of `model` (source repairs included), and its outcome."""
    from pipeline.graph.repairs import auto_repairs, run_passes
    from pipeline.lockfile import LockFile
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.recipe import Recipe
    from pipeline.verify.engines.host import run_model
    from pipeline.verify.stages import fp16_evaluators, onnxruntime_refusal

    start = time.perf_counter()
    repaired, _ = run_passes(model, auto_repairs(model), finish=False)
    with tempfile.TemporaryDirectory() as tmp:
        reference_file = Path(tmp) / "ref.onnx"
        onnx.save(repaired, str(reference_file))
        recipe = Recipe(name=name, path=None)
        evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe, repaired)
        context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, LockFile(None), Progress.quiet(), onnxruntime_refusal(feeds))
        made = make_variants(repaired, recipe, name, context)
    seconds = time.perf_counter() - start
    fp16 = next((v for v in made.variants if v.name == "fp16"), None)
    record = next((s for s in made.steps if s["name"] == "fp16_keep_fp32"), {"records": [{}]})["records"][0]
    search = record.get("search") or {}
    # a search starts only when the first candidate fails: without one, fp16 passed every evaluator
    outcome = "fp16 refused: " + "; ".join(made.refused.values()) if fp16 is None else (f"search failed: {search['failed']}" if "failed" in search else "fp16 passes")
    return {"model": name, "nodes": sum(1 for _ in model.graph.node), "mb": round(len(model.SerializeToString()) / 1e6, 2), "seconds": round(seconds, 1),
            "trials": search.get("trials", 0), "kept": len(record.get("kept", [])), "outcome": outcome, "evaluators": [e.name for e in evaluators]}


def corpus_main(args: argparse.Namespace) -> None:
    from measure_fp16_corpus import CORPUS, SYMBOLIC

    small = {"convs": 6, "channels": 8} if args.smoke else {}
    # the two slow cases first, then the corpus
    models = [("paddle2onnx-style rec (Constant weights, -1 dims)", *paddle_style_model(**small)),
              ("VITS-style voice (Ceil durations)", *vits_style_model(**({"width": 16, "layers": 1} if args.smoke else {})))]
    for path in sorted(CORPUS.glob("*.onnx"))[: 1 if args.smoke else None]:
        model = onnx.load(str(path))
        rng = np.random.default_rng(0)
        feeds = {}
        for value in model.graph.input:
            dims = [d.dim_value if d.HasField("dim_value") else SYMBOLIC.get(d.dim_param, 1) for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.normal(0, 0.5, dims).astype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
        models.append((path.stem, model, feeds))
    if not args.json:
        print(f"{'model':52}{'nodes':>7}{'MB':>7}{'s':>8}{'trials':>8}{'kept':>6}  outcome", flush=True)
    rows = []
    for name, model, feeds in models:
        rows.append(time_conversion(model, feeds, name))
        row = rows[-1]
        if not args.json:  # each row as it is measured: the whole table takes minutes
            print(f"{row['model'][:51]:52}{row['nodes']:>7}{row['mb']:>7}{row['seconds']:>8}{row['trials']:>8}{row['kept']:>6}  {row['outcome']}", flush=True)
    if args.json:
        print(json.dumps({"rows": rows, "slowest_s": max(r["seconds"] for r in rows)}, indent=2))
        return
    print(f"evaluators: {', '.join(rows[0]['evaluators'])}; slowest: {max(r['seconds'] for r in rows)} s")


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
    parser.add_argument("--corpus", action="store_true", help="conversion time per model of the exporter corpus and two generated exports")
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
    if args.corpus:
        corpus_main(args)
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
