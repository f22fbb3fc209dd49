"""Sample shapes and values as exporters declare them: dynamic dims in every convention
onnxruntime accepts, hints that run on the model they name, synthetic samples in the input's domain."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.assets.samples import declared_shape, make_feeds
from pipeline.errors import PackError
from pipeline.recipe import InputSpec, Recipe, parse_input_option
from typer.testing import CliRunner

from build_helpers import save
from pipeline.cli import app


def build(*args: str):
    return CliRunner().invoke(app, ["build", *args])


def _input(dims: list) -> onnx.ValueInfoProto:
    """A float input whose dims are written raw: int -> dim_value (-1 and 0 too), str -> dim_param, None -> empty."""
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    shape = value.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        elif isinstance(d, str):
            dim.dim_param = d
    return value


def paddle_style(scale: float | None = None) -> onnx.ModelProto:
    """paddle2onnx's conventions: `dim_value: -1` batch, '?'-less empty spatial dims, weights in a Constant."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["w"], value=weight, name="w_const")]
    source = "x"
    if scale is not None:
        nodes.append(helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array(scale, np.float32), "s")))
        nodes.append(helper.make_node("Div", ["x", "s"], ["xs"], name="normalise"))
        source = "xs"
    nodes.append(helper.make_node("Conv", [source, "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"))
    graph = helper.make_graph(nodes, "paddle", [_input([-1, 3, None, None])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4, None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def detector_style() -> onnx.ModelProto:
    """A YOLO-style neck: a stride-2 and a stride-4 branch, the second upsampled and concatenated
    with the first. At 1x1 ceil-mode pooling leaves both 1x1 and the upsampled one 2x2, so the
    Concat fails as the real detector's did ('Non concat axis dimensions must match')."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    nodes = [
        helper.make_node("MaxPool", ["images"], ["p8"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, name="stride2"),
        helper.make_node("MaxPool", ["p8"], ["p16"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, name="stride4"),
        helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")),
        helper.make_node("Resize", ["p16", "", "scales"], ["up"], mode="nearest", name="upsample"),
        helper.make_node("Concat", ["p8", "up"], ["y"], axis=1, name="concat_strides"),
    ]
    graph = helper.make_graph(nodes, "detector", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, "h2", "w2"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("dims", [[-1, 3, 8, 8], [0, 3, 8, 8], ["?", 3, 8, 8], [None, 3, 8, 8], ["batch", 3, 8, 8]])
def test_every_dynamic_dim_convention_is_dynamic(dims):
    value = _input(dims)
    assert declared_shape(value)[1:] == [3, 8, 8] and not isinstance(declared_shape(value)[0], int)
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [value], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    for batch in (1, 2):  # any size fills it; a fixed dim still has to match
        feeds = make_feeds(model, Recipe(name="m", inputs={"x": InputSpec("x", shape=[batch, 3, 8, 8], option="x=...")}), None).feeds
        assert feeds["x"].shape == (batch, 3, 8, 8)
    with pytest.raises(PackError, match=r"does not match the model's \['?\??\w*'?, 3, 8, 8\]"):
        make_feeds(model, Recipe(name="m", inputs={"x": InputSpec("x", shape=[1, 3, 8, 9], option="x=...")}), None)


def test_paddle_style_minus_one_dims_take_every_way_of_giving_a_shape(tmp_path):
    model = paddle_style()
    shape = [1, 3, 48, 192]
    assert make_feeds(model, Recipe(name="m", inputs={"x": InputSpec("x", shape=shape, option="x=1x3x48x192")}), None).feeds["x"].shape == tuple(shape)
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.zeros(shape, np.float32))
    assert make_feeds(model, Recipe(name="m"), npz).feeds["x"].shape == tuple(shape)
    # the hint is accepted by pack's own parser and runs: -1 is not printed back as a size
    with pytest.raises(PackError) as missing:
        make_feeds(model, Recipe(name="m"), None)
    message = str(missing.value)
    assert "'x' ['?', 3, '?', '?']" in message and "(onnxruntime runs the model at this size)" in message
    option = message.split("--input ", 1)[1].split()[0]
    name, sizes = parse_input_option(option)
    assert name == "x" and sizes == [1, 3, 32, 32]


def test_the_hint_for_a_detector_is_a_size_its_strides_divide(tmp_path):
    """The 1x1 the hint used to print fails this model's Concat; the hint is one that runs, and
    following it builds."""
    path = save(detector_style(), tmp_path / "detector.onnx")
    out = tmp_path / "d"
    missing = build(str(path), "--no-browser", "--out", str(out))
    assert missing.exit_code == 2, missing.output
    assert "--input images=1x3x32x32 (onnxruntime runs the model at this size)" in missing.output
    hinted = missing.output.split("--input ", 1)[1].split()[0]
    followed = build(str(path), "--input", hinted, "--no-browser", "--out", str(out))
    assert followed.exit_code == 0, followed.output
    # the summary says the sample is made up, and what it is made of
    assert "step sample: images: synthetic, image pattern in [0, 1], an image (a 4-D float input of 3 channels; assumed 0..1" in followed.output
    report = json.loads((out / "detector" / "report.json").read_text())
    step = next(s for s in report["steps"] if s["name"] == "sample")
    assert step["changed"] and step["records"][0]["synthetic"]


def test_a_model_no_candidate_runs_gets_a_hint_that_says_so():
    # a Reshape to a fixed 7 elements: no sample size runs it
    text_model = helper.make_model(helper.make_graph(
        [helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([7], np.int64), "s")),
         helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "m"])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])]),
        opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(PackError, match=r"onnxruntime ran none of the sizes 32, 64, 128, 256, 320, 640 on zeros \(last: .*\); give the size the model was made for"):
        make_feeds(text_model, Recipe(name="m"), None)


@pytest.mark.parametrize(("scale", "high"), [(None, 1.0), (255.0, 255.0)])
def test_a_synthetic_image_sample_is_in_the_image_range_the_graph_reads(scale, high):
    recipe = Recipe(name="m", inputs={"x": InputSpec("x", shape=[1, 3, 32, 32], option="x=1x3x32x32")})
    sample = make_feeds(paddle_style(scale), recipe, None)
    x = sample.feeds["x"]
    assert x.min() >= 0 and x.max() <= high and x.max() > high / 2
    assert f"image pattern in [0, {high:g}]" in sample.step["records"][0]["what"]


def test_synthetic_token_ids_stay_in_the_vocabulary_and_unknown_floats_say_so():
    table = numpy_helper.from_array(np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"), helper.make_node("Add", ["e", "f"], ["y"])],
        "text", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 64]), helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 64, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 4])], [table])
    sample = make_feeds(helper.make_model(graph), Recipe(name="m"), None)
    ids = sample.feeds["ids"]
    assert ids.min() >= 0 and ids.max() <= 49 and ids.max() > 25
    whats = [r["what"] for r in sample.step["records"]]
    assert whats == ["ids: synthetic, token ids below the 50 rows Gather 'embed' indexes",
                     "f: synthetic, uniform noise in [-1, 1]: nothing in the recipe or the graph says its domain"]
