"""fp16 keeps the paths that decide shapes: float values rounded into lengths, counts or indices
stay fp32, found from the graph before any trial (pipeline/precision/decision_paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from build_helpers import conv_model, model_from_text, run, save
from pipeline.cli import app
from pipeline.graph.passes.util import all_graphs
from pipeline.precision.decision_paths import decision_paths

DATA = Path(__file__).resolve().parent / "data"

# A duration predictor as VITS has it: float durations, Ceil, cast to integers, summed into the
# output's length. At x = 2.0004 fp32 rounds up to 3; fp16 holds 2.0004 as 2.0 and rounds to 2.
DURATIONS = """
<ir_version: 8, opset_import: ["" : 17]>
durations (float[1, 8] x) => (float[T] y) <float[8] gain = {1, 1, 1, 1, 1, 1, 1, 1}, int64 axis = {0}> {
  d = Mul (x, gain)
  up = Ceil (d)
  frames = Cast <to = 7> (up)
  total = ReduceSum <keepdims = 0> (frames)
  length = Unsqueeze (total, axis)
  ones = ConstantOfShape <value = float[1] {0.5}> (length)
  y = CumSum (ones, axis)
}
"""

# sizes computed as an image model's exporter writes them: a Shape cast to float, scaled, floored
RESIZE_BY_SHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
resize (float[1, 3, 8, 8] x) => (float[1, 3, 16, 16] y) <float[4] two = {1, 1, 2, 2}, int64[1] idx = {0}> {
  s = Shape (x)
  sf = Cast <to = 1> (s)
  scaled = Mul (sf, two)
  floored = Floor (scaled)
  sizes = Cast <to = 7> (floored)
  y = Resize <mode = "nearest"> (x, , , sizes)
}
"""

# shape arithmetic without any float: nothing to keep
RESHAPE_BY_SHAPE = """
<ir_version: 8, opset_import: ["" : 17]>
reshape (float[2, 3, 4] x) => (float[2, 12] y) <int64[1] zero = {0}, int64[1] minus = {-1}> {
  s = Shape (x)
  n = Gather (s, zero)
  shape = Concat <axis = 0> (n, minus)
  y = Reshape (x, shape)
}
"""


def named(text: str):
    """The model with each node named as the conversion names unnamed ones first."""
    model = model_from_text(text)
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type}_{index}"
    return model


def test_the_float_path_into_a_length_is_found_and_nothing_else():
    kept = decision_paths(named(DURATIONS))
    # the integer sum after the cast and the float tensor built at that length are not on the path
    assert sorted(kept) == ["Cast_2", "Ceil_1", "Mul_0"]
    assert kept["Ceil_1"] == "decides a shape, length, count or index: input 0 of ConstantOfShape 'ConstantOfShape_5'; kept without a trial"


def test_shape_arithmetic_through_floats_is_kept_and_integer_only_shape_arithmetic_is_not():
    for text, expected in ((RESIZE_BY_SHAPE, ["Cast_1", "Cast_4", "Floor_3", "Mul_2"]), (RESHAPE_BY_SHAPE, [])):
        assert sorted(decision_paths(named(text))) == expected
    assert decision_paths(conv_model()) == {}


def test_fp16_of_a_duration_predictor_keeps_the_length_of_fp32(tmp_path):
    model = model_from_text(DURATIONS)
    x = (np.arange(8, dtype=np.float32) + 2.0004).reshape(1, 8)
    assert run(model, {"x": x})["y"].shape == (sum(np.ceil(x[0]).astype(int)),)
    path = save(model, tmp_path / "durations.onnx")
    npz = tmp_path / "x.npz"
    np.savez(npz, x=x)
    # a lock of its own: an earlier build's kept nodes would be applied from the shared one without finding them
    result = CliRunner().invoke(app, ["build", str(path), "--inputs", str(npz), "--lock", str(tmp_path / "pack.lock.json"), "--no-browser", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "d" / "durations" / "report.json").read_text())
    step = next(s for s in report["steps"] if s["name"] == "fp16_keep_fp32")
    kept = {entry["op"]: entry["why"] for entry in step["records"][0]["kept"]}
    assert {"Mul", "Ceil", "Cast"} <= set(kept) and all(why.startswith("decides a shape") for op, why in kept.items() if op in ("Mul", "Ceil", "Cast"))
    assert "search" not in step["records"][0]  # found before any trial
    # unkept, WebGPU's fp16 gave 44 frames for fp32's 52 and a 4-trial search failed (fp16 refused)
    fp16 = {c["stage"]: c for c in report["checks"] if c["variant"] == "fp16" and c["stage"] in ("host", "webgpu-kernels")}
    assert fp16["host"]["status"] == "passed", fp16
    assert fp16["webgpu-kernels"]["status"] in ("passed", "skipped"), fp16  # skipped: no lavapipe on this machine
    assert not report["refused"] and not report["variants_refused"]


# The duration predictor behind a flag: the Ceil and the Cast live in an If branch, the length
# they make is read by the main graph's ConstantOfShape through the If's output.
DURATIONS_IN_IF = """
<ir_version: 8, opset_import: ["" : 17]>
durations (bool c, float[1, 8] x) => (float[T] y) <float[8] gain = {1, 1, 1, 1, 1, 1, 1, 1}, int64 axis = {0}> {
  d = Mul (x, gain)
  frames = If (c) <
    then_branch = ceil_g () => (int64[8] up_frames) {
      up = Ceil (d)
      up_frames = Cast <to = 7> (up)
    },
    else_branch = floor_g () => (int64[8] down_frames) {
      down = Floor (d)
      down_frames = Cast <to = 7> (down)
    }
  >
  total = ReduceSum <keepdims = 0> (frames)
  length = Unsqueeze (total, axis)
  ones = ConstantOfShape <value = float[1] {0.5}> (length)
  y = CumSum (ones, axis)
}
"""


def test_a_float_path_into_a_length_through_if_branches_is_found():
    model = model_from_text(DURATIONS_IN_IF)
    for graph in all_graphs(model.graph):
        for index, node in enumerate(graph.node):
            node.name = f"{graph.name}_{node.op_type}_{index}"
    kept = decision_paths(model)
    # both branches' rounding and cast, and the float Mul of the main graph above them
    assert sorted(kept) == ["ceil_g_Cast_1", "ceil_g_Ceil_0", "durations_Mul_0", "floor_g_Cast_1", "floor_g_Floor_0"]


# A float Range bound cast from an integer: `torch.arange(n, dtype=float)` over a length the durations
# decided, as the TorchScript exporter writes it: the walk goes on through the integer to the Ceil.
FLOAT_RANGE = """
<ir_version: 8, opset_import: ["" : 17]>
arange (float[1, 8] x) => (float[F] y) <float zero = {0.0}, float one = {1.0}> {
  up = Ceil (x)
  total = ReduceSum <keepdims = 0> (up)
  frames = Cast <to = 7> (total)
  limit = Cast <to = 1> (frames)
  y = Range (zero, limit, one)
}
"""


def test_a_float_range_bound_cast_from_an_integer_keeps_the_rounding_above_it():
    assert set(decision_paths(named(FLOAT_RANGE))) == {"Ceil_0", "ReduceSum_1", "Cast_2", "Cast_3"}


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_vits_export_of_either_torch_exporter_builds_a_verified_fp16_keeping_its_duration_path(tmp_path, exporter):
    """tests/data/exporter_corpus/vits.*.small.onnx (make_exporter_corpus.py): the duration
    predictor's path into the waveform's length (Ceil → sum → Cast → Range) stays fp32 with the
    encoder above it, found before any trial; the rest is fp16 and verified on the host and the
    WebGPU kernels, the waveform as long as fp32's."""
    source = DATA / "exporter_corpus" / f"vits.{exporter}.small.onnx"
    result = CliRunner().invoke(app, ["build", str(source), "--no-browser", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    package = tmp_path / f"vits.{exporter}.small"
    manifest = json.loads((package / "manifest.json").read_text())
    kept = {entry["op"]: entry["why"] for entry in manifest["fp16"]["keptFp32"]}
    assert {"Ceil", "Exp", "ReduceSum"} <= set(kept) and "Range" in kept["Ceil"] and "kept without a trial" in kept["Ceil"]
    assert "ConvTranspose" not in kept  # the decoder is fp16
    report = json.loads((package / "report.json").read_text())
    fp16 = {c["stage"]: c for c in report["checks"] if c["variant"] == "fp16" and c["stage"] in ("host", "webgpu-kernels")}
    assert fp16["host"]["status"] == "passed" and fp16["webgpu-kernels"]["status"] == "passed", fp16
