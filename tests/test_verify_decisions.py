"""Output kinds (recipe keys, what the graph shows) and the decision checks beside the numeric ones
(pipeline/verify/judgement/decisions.py), on tiny ONNX-text graphs and arrays."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest

from pipeline.errors import PackError
from pipeline.graph.output_kinds import read_output_kinds, with_graph_kinds
from pipeline.recipe import Recipe, parse_recipe
from pipeline.verify.judgement.thresholds import threshold_for


def _recipe(text: str) -> Recipe:
    return parse_recipe(tomllib.loads(text), Path("r.toml"))


# --- output kinds in recipes ---------------------------------------------------------------------

def test_a_recipe_declares_kinds_with_their_keys_and_defaults():
    recipe = _recipe('[outputs.text]\nkind = "ctc"\nblank = 6624\n[outputs.head]\nkind = "detection"\nthreshold = 0.4\nboxes = "xyxy"\n'
                     '[outputs.alpha]\nkind = "mask"\n[outputs.alpha.fp16]\nmask_agreement = 0.99\n')
    assert recipe.outputs["text"].decision() == {"kind": "ctc", "axis": -1, "blank": 6624, "from": "recipe"}
    assert recipe.outputs["head"].part_slices() == {"axis": 1, "slices": [[0, 4], [4, None]]}  # boxes and scores apart
    assert recipe.outputs["alpha"].numeric_kind == "image" and recipe.outputs["alpha"].decision()["threshold"] == 0.5
    assert threshold_for("mask", "fp16", "cpu", recipe.outputs["alpha"].thresholds["fp16"])["mask_agreement"] == 0.99


@pytest.mark.parametrize("text, message", [
    ('[outputs.y]\nkind = "labels"\n', "key 'outputs.y.kind': expected one of tensor, image, audio, logits"),
    ('[outputs.y]\nkind = "logits"\nblank = 0\n', "key 'outputs.y.blank' belongs to kind 'ctc', not 'logits'"),
    ('[outputs.y]\nkind = "detection"\nboxes = "yxyx"\n', "key 'outputs.y.boxes': expected one of cxcywh, xyxy, xywh"),
    ('[outputs.y]\nkind = "ctc"\nblank = -1\n', "key 'outputs.y.blank': expected a class index"),
    ('[outputs.y]\nparts = [[0, 4], [4, 8]]\n', "key 'outputs.y.parts' slices along 'outputs.y.axis'; set the axis"),
    ('[outputs.y]\naxis = 1\nparts = [[0, 4], [2, 8]]\n', "key 'outputs.y.parts': expected two or more [start, stop) slices in order"),
    ('[outputs.y]\nkind = "mask"\n[outputs.y.fp16]\nnear_tie = 2\n', "unknown key 'outputs.y.fp16.near_tie'"),
])
def test_bad_output_keys_are_named(text, message):
    with pytest.raises(PackError, match=None) as error:
        _recipe(text)
    assert message in str(error.value)


# --- output kinds from the graph -----------------------------------------------------------------

GRAPH = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 8, 6] x, float[1, 7, 20] h) => (float[1, 8, 6] probs, float[8, 1, 6] tb, float[1, 8, 6] logits, int64[1, 8] labels, float[1, 7, 20] head, float[1, 8, 6] plain) {
  probs = Softmax <axis = -1> (x)
  soft = Softmax <axis = 2> (x)
  tb = Transpose <perm = [1, 0, 2]> (soft)
  logits = Identity (x)
  labels = ArgMax <axis = 2, keepdims = 0> (logits)
  box = Slice (h, starts, ends, axes)
  raw = Slice (h, ends, stop, axes)
  cls = Sigmoid (raw)
  head = Concat <axis = 1> (box, cls)
  plain = Relu (x)
}
"""


@pytest.fixture(scope="module")
def graph() -> onnx.ModelProto:
    model = onnx.parser.parse_model(GRAPH)
    constants = {"starts": [0], "ends": [4], "stop": [7], "axes": [1]}
    model.graph.initializer.extend(onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in constants.items())
    onnx.checker.check_model(model)
    return model


def test_the_graph_shows_class_axes_and_stacked_parts(graph):
    found = read_output_kinds(graph)
    assert found["probs"].kind == "probabilities" and found["probs"].options["axis"] == 2 and "Softmax" in found["probs"].found
    assert found["tb"].options["axis"] == 2  # a Transpose that keeps the class axis last
    assert found["logits"].kind == "logits" and found["logits"].options["axis"] == 2 and "ArgMax" in found["logits"].found
    assert found["head"].kind == "tensor" and found["head"].parts == [[0, 4], [4, 7]] and found["head"].options["axis"] == 1
    assert "labels" not in found and "plain" not in found  # integer labels compare exactly; a Relu shows nothing


def test_the_recipe_wins_over_the_graph(graph):
    recipe = _recipe('[outputs.probs]\nkind = "ctc"\nblank = 5\n[outputs.head]\nkind = "tensor"\n')
    with_graph_kinds(graph, recipe)
    assert recipe.outputs["probs"].kind == "ctc" and recipe.outputs["probs"].found == "recipe"
    assert recipe.outputs["head"].parts == [[0, 4], [4, 7]]  # a declared plain tensor takes the parts the graph shows
    assert recipe.outputs["logits"].kind == "logits" and recipe.outputs["logits"].found.startswith("graph: ")
