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
from pipeline.verify.judgement.decisions import decide, greedy_ctc
from pipeline.verify.judgement.metrics import compare, judge
from pipeline.verify.judgement.thresholds import threshold_for


def _recipe(text: str) -> Recipe:
    return parse_recipe(tomllib.loads(text), Path("r.toml"))


# --- output kinds in recipes ---------------------------------------------------------------------

def test_a_recipe_declares_kinds_with_their_keys_and_defaults():
    recipe = _recipe('[outputs.text]\nkind = "ctc"\nblank = 6624\n[outputs.head]\nkind = "detection"\nthreshold = 0.4\nboxes = "xyxy"\n'
                     '[outputs.alpha]\nkind = "mask"\n[outputs.alpha.fp16]\nmask_agreement = 0.99\n')
    assert recipe.outputs["text"].decision() == {"kind": "ctc", "axis": -1, "blank": 6624, "time_axis": -2, "from": "recipe"}
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


# --- ranges per part -----------------------------------------------------------------------------

def test_a_score_error_diluted_by_the_boxes_range_is_caught_per_part():
    """0.02 on one score of a [1, 7, 40] head reads as 6e-5 of the whole tensor's range (0..320),
    which passes fp16's 1e-2; per part (as kind = "detection" implies) it is 2e-2 of the scores'
    range, and fails it."""
    rng = np.random.default_rng(3)
    head = np.concatenate([rng.uniform(0, 320, (1, 4, 40)), rng.uniform(0, 1, (1, 3, 40))], axis=1).astype(np.float32)
    parts = {"axis": 1, "slices": [[0, 4], [4, None]]}
    actual = head.copy()
    actual[0, 5, 7] += 0.02
    whole = compare(head, actual)
    assert whole["max_abs_of_range"] < 1e-4
    assert parts == _recipe('[outputs.head]\nkind = "detection"\n').outputs["head"].part_slices()
    per_part = compare(head, actual, parts=parts)
    assert per_part["worst_part"] == 1 and per_part["max_abs_of_range"] == pytest.approx(0.02 / float(head[0, 4:].max()), rel=1e-3)
    bounds = threshold_for("detection", "fp16", "cpu")
    assert judge(whole, bounds)[0] and judge(per_part, bounds) == (False, f"max_abs_of_range {per_part['max_abs_of_range']:.3g} > 0.01")


# --- decision checks -----------------------------------------------------------------------------

def _ctc_probabilities() -> np.ndarray:
    """[1, 6, 4] per-step probabilities decoding to 1 2 1; step 3 is a near-tie (0.4879 blank vs 0.4805 class 3)."""
    steps = [[0.1, 0.8, 0.05, 0.05], [0.9, 0.05, 0.03, 0.02], [0.05, 0.05, 0.85, 0.05], [0.4879, 0.0158, 0.0158, 0.4805], [0.1, 0.7, 0.1, 0.1], [0.97, 0.01, 0.01, 0.01]]
    return np.array([steps], np.float32)


def test_a_near_tie_flip_is_caught_and_shown_with_its_margin():
    reference = _ctc_probabilities()
    actual = reference.copy()
    actual[0, 3, 0], actual[0, 3, 3] = 0.4841, 0.4843  # within fp16's numeric error: 0.0038 off
    bounds = threshold_for("ctc", "fp16", "cpu")
    assert judge(compare(reference, actual), bounds)[0]  # the numbers pass
    figures, status, reason, shown = decide(reference, actual, {"kind": "ctc", "axis": -1, "blank": 0}, bounds)
    assert figures["near_ties"] == 1 and figures["flips"] == 0 and figures["edit_distance"] == 1
    assert status == "passed" and "step 3: fp32 0 by a margin of 0.0074" in reason and "variant 3" in reason  # shown, never hidden
    assert shown == {"reference": "1 2 1", "actual": "1 2 3 1"}  # the text the near-tie changed
    _, strict, why, _ = decide(reference, actual, {"kind": "ctc", "axis": -1, "blank": 0}, {**bounds, "near_ties": 0})
    assert strict == "failed" and why.startswith("near_ties 1 > 0")


def test_a_flip_beyond_the_allowed_error_fails_where_the_numbers_pass():
    reference = _ctc_probabilities()
    actual = reference.copy()
    actual[0, 2, 2], actual[0, 2, 1] = 0.45, 0.46  # class 2 by 0.8 in fp32, lost
    figures, status, reason, _ = decide(reference, actual, {"kind": "probabilities", "axis": -1, "top_k": 2}, threshold_for("probabilities", "fp16", "cpu"))
    assert status == "failed" and figures["flips"] == 1 and reason.startswith("flips 1 > 0")
    assert figures["top1_agreement"] == pytest.approx(5 / 6) and "top2_overlap" in figures


def test_a_ctc_flip_that_leaves_the_text_as_it_is_passes_and_an_all_blank_sample_is_not_verifiable():
    reference = _ctc_probabilities()
    actual = reference.copy()
    actual[0, 5, 0], actual[0, 5, 1] = 0.01, 0.97  # the last step repeats class 1 instead of blank: still 1 2 1
    figures, status, _, shown = decide(reference, actual, {"kind": "ctc", "axis": -1, "blank": 0}, threshold_for("ctc", "fp16", "cpu"))
    assert status == "passed" and figures["flips"] == 1 and figures["edit_distance"] == 0 and shown["actual"] == shown["reference"] == "1 2 1"
    blank = np.zeros((1, 6, 4), np.float32)
    blank[..., 0] = 0.9
    blank[..., 1:] = np.float32(0.1 / 3)
    _, status, reason, _ = decide(blank, blank, {"kind": "ctc", "axis": -1, "blank": 0}, threshold_for("ctc", "fp32", "cpu"))
    assert status == "not-verifiable" and "every one of its 6 steps is the blank 0" in reason
    assert greedy_ctc(np.array([0, 1, 1, 0, 1, 2, 2]), 0) == [1, 1, 2]
    time_first = np.concatenate([reference, reference[:, ::-1]]).transpose(1, 0, 2)  # torch's [T, N, C]: two sequences
    _, status, _, shown = decide(time_first, time_first, {"kind": "ctc", "axis": 2, "blank": 0, "time_axis": 0}, threshold_for("ctc", "fp32", "cpu"))
    assert status == "passed" and shown["reference"] == "1 2 1 | 1 2 1"


def test_a_mask_passes_despite_off_threshold_noise_and_fails_a_flipped_region():
    rng = np.random.default_rng(0)
    reference = np.where(rng.random((1, 1, 32, 32)) < 0.4, rng.uniform(0.7, 1.0, (1, 1, 32, 32)), rng.uniform(0.0, 0.3, (1, 1, 32, 32))).astype(np.float32)
    noisy = (reference + rng.choice([-0.02, 0.02], reference.shape)).astype(np.float32)
    decision, bounds = {"kind": "mask", "threshold": 0.5}, threshold_for("mask", "fp16", "cpu")
    assert not judge(compare(reference, noisy), threshold_for("tensor", "fp16", "cpu"))[0]  # 0.02 everywhere: over a tensor's max bound
    figures, status, _, _ = decide(reference, noisy, decision, bounds)
    assert status == "passed" and figures["mask_agreement"] == 1.0 and figures["flips"] == 0
    broken = reference.copy()
    broken[..., :4, :] = 1.0 - broken[..., :4, :]
    figures, status, reason, _ = decide(reference, broken, decision, bounds)
    assert status == "failed" and reason.startswith("mask_agreement") and figures["flips"] > 0
    _, status, reason, _ = decide(np.full((4, 4), 0.1), np.full((4, 4), 0.1), decision, bounds)
    assert status == "not-verifiable" and "below the threshold 0.5" in reason


def _head(boxes: list[list[float]], scores: list[list[float]]) -> np.ndarray:
    """A [1, 4 + C, N] head from N boxes (cx, cy, w, h) and their class scores."""
    return np.concatenate([np.array(boxes, np.float32).T, np.array(scores, np.float32).T])[None]


def test_detections_are_matched_one_to_one_and_a_lost_box_is_a_flip_or_a_near_tie():
    reference = _head([[50, 50, 20, 20], [200, 100, 40, 30], [300, 300, 10, 10]], [[0.9, 0.05], [0.1, 0.8], [0.253, 0.1]])
    decision, bounds = {"kind": "detection", "axis": 1, "boxes": "cxcywh", "threshold": 0.25}, threshold_for("detection", "fp16", "cpu")
    shifted = reference.copy()
    shifted[0, :, [0, 1]] = shifted[0, :, [1, 0]]  # the same boxes in another order, one moved a pixel
    shifted[0, 0, 1] += 1
    figures, status, _, shown = decide(reference, shifted, decision, bounds)
    assert status == "passed" and figures["matched"] == 3 and 0.9 < figures["min_iou"] < 1 and figures["score_diff"] == 0
    assert shown["reference"].startswith("0 0.90 [40, 40, 60, 60]")
    lost = reference.copy()
    lost[0, 4, 0] = 0.2  # a 0.9 box gone: far from the threshold
    lost[0, 4, 2] = 0.245  # a box 0.003 over the threshold dropped under it: a near-tie
    figures, status, reason, _ = decide(reference, lost, decision, bounds)
    assert status == "failed" and figures["flips"] == 1 and figures["near_ties"] == 1 and "box 2 (class 0, fp32 score 0.253) lost" in reason
    _, status, reason, _ = decide(reference * [[[1], [1], [1], [1], [0.1], [0.1]]], reference, decision, bounds)
    assert status == "not-verifiable" and "no box scores 0.25 or more" in reason


def test_embeddings_are_judged_by_their_cosine():
    rng = np.random.default_rng(2)
    reference = rng.standard_normal((3, 64)).astype(np.float32)
    close = reference + 1e-3 * rng.standard_normal((3, 64)).astype(np.float32)
    bounds = threshold_for("embedding", "fp16", "cpu")
    assert decide(reference, close, {"kind": "embedding", "axis": -1}, bounds)[1] == "passed"
    other = close.copy()
    other[1] = rng.standard_normal(64)
    figures, status, _, _ = decide(reference, other, {"kind": "embedding", "axis": -1}, bounds)
    assert status == "failed" and figures["cosine"] < 0.5
    assert decide(reference, reference[:2], {"kind": "embedding", "axis": -1}, bounds)[1] == "failed"  # a shape of its own


def test_a_decision_failure_is_a_failure_the_fp16_search_fixes_where_the_numbers_pass():
    from pipeline.verify.judgement.checks import output_checks, output_failures

    reference = {"p": _ctc_probabilities()}
    actual = reference["p"].copy()
    actual[0, 3, 0], actual[0, 3, 3] = 0.4841, 0.4843  # a near-tie that changes the text
    bounds = {"p": {**threshold_for("ctc", "fp16", "cpu"), "near_ties": 0}}
    judging = {"p": {"decision": {"kind": "ctc", "axis": -1, "blank": 0}, "parts": None}}
    assert output_failures(reference, {"p": actual}, bounds, {}) == {}  # the numbers alone pass
    assert output_failures(reference, {"p": actual}, bounds, {}, judging)["p"].startswith("ctc decision: near_ties 1 > 0; near-ties: step 3")
    numeric, decision = output_checks({"stage": "host", "ep": "cpu", "variant": "fp16"}, reference, {"p": actual}, bounds, {}, judging)
    assert numeric["status"] == "passed" and "near_ties" not in numeric["threshold"]
    assert decision["decision"] == "ctc" and decision["status"] == "failed" and decision["threshold"] == {"flips": 0, "near_ties": 0}
    assert decision["decided"] == {"reference": "1 2 1", "actual": "1 2 3 1"}


RECOGNIZER = """
<ir_version: 8, opset_import: ["" : 17]>
recognizer (float[1, 12, 16] x) => (float[1, 12, 6] probs, float[1, 12, 6] scores, float[1, 12, 6] emb) {
  logits = MatMul (x, w)
  probs = Softmax <axis = -1> (logits)
  scores = Mul (logits, two)
  small = Mul (logits, tenth)
  emb = Tanh (small)
}
"""


def test_a_build_checks_and_reports_the_decisions_of_declared_and_graph_read_kinds(tmp_path):
    """A CTC output declared in the recipe, a Softmax output read from the graph: each has a decision
    check beside its numeric one on the host, recorded in report.json with what each run decided,
    its kind in the manifest (with where it came from), one summary line each, the text in report.html.
    An embedding held to a cosine of 1 fails fp16 on its decision alone: the fp16 search takes it up
    as a failure to fix, and the variant is refused naming the decision."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app

    model = onnx.parser.parse_model(RECOGNIZER)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([onnx.numpy_helper.from_array((3 * rng.standard_normal((16, 6))).astype(np.float32), "w"),
                                    onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"), onnx.numpy_helper.from_array(np.array(0.1, np.float32), "tenth")])
    onnx.save(model, str(tmp_path / "recognizer.onnx"))
    (tmp_path / "r.toml").write_text('name = "recognizer"\nvariants = ["fp16", "fp32"]\n[source]\nuri = "recognizer.onnx"\n'
                                     '[inputs.x]\nrange = [-1.0, 1.0]\n[outputs.scores]\nkind = "ctc"\nblank = 0\n'
                                     '[outputs.emb]\nkind = "embedding"\nfp16 = { cosine = 1.0 }\n')
    result = CliRunner().invoke(app, ["build", str(tmp_path / "r.toml"), "--no-browser", "--no-reuse", "--out", str(tmp_path / "out")],
                                env={"PACK_WEBGPU_KERNELS": "off"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "recognizer" / "report.json").read_text())
    decisions = {(c["variant"], c["output"]): c for c in report["checks"] if c.get("decision")}
    assert set(decisions) == {(v, o) for v in ("fp16", "fp32") for o in ("probs", "scores", "emb")}
    emb = decisions[("fp16", "emb")]
    assert emb["status"] == "failed" and emb["detail"].startswith("cosine 0.99") and emb["detail"].endswith(" < 1")
    assert [c["status"] for c in report["checks"] if c["stage"] == "host" and c["variant"] == "fp16" and c["output"] == "emb" and not c.get("decision")] == ["passed"]
    assert any(r["by"] == "host fp16 (any bundle, any EP): failed: emb (embedding decision): " + emb["detail"] for r in report["refused"]), report["refused"]
    searched = json.dumps([s for s in report["steps"] if s["name"] == "fp16_keep_fp32"])
    assert "emb: embedding decision: cosine 0.99" in searched  # the search took the decision failure up
    ctc = decisions[("fp16", "scores")]
    assert ctc["decision"] == "ctc" and ctc["status"] == "passed" and ctc["decided"]["reference"] and ctc["decided"]["reference"] == ctc["decided"]["actual"]
    assert decisions[("fp16", "probs")]["decision"] == "probabilities" and decisions[("fp16", "probs")]["metrics"]["positions"] == 12
    manifest = json.loads((tmp_path / "out" / "recognizer" / "manifest.json").read_text())
    outputs = {o["name"]: o for o in manifest["outputs"]}
    assert outputs["scores"]["decision"] == {"kind": "ctc", "axis": -1, "blank": 0, "time_axis": -2, "from": "recipe"} and outputs["scores"]["kind"] == "tensor"
    assert outputs["probs"]["decision"]["from"].startswith("graph: Softmax node")
    assert manifest["thresholds"]["cpu"]["fp16"]["scores"]["near_ties"] == 1
    assert f"scores (ctc decision)  flips 0 (<= 0), near_ties 0 (<= 0)" not in result.output  # the bound is the default one
    lines = [line for line in result.output.splitlines() if "fp16" in line and "(ctc decision)" in line]
    assert len(lines) == 1 and "near_ties 0 (<= 1)" in lines[0] and f"reference: {ctc['decided']['reference']} (the same)" in lines[0]
    html = (tmp_path / "out" / "recognizer" / "report.html").read_text()
    assert "ctc decision" in html and f"the reference decides (ctc): {ctc['decided']['reference']}" in html  # the outputs' section too
    assert f"; decides {ctc['decided']['actual']}" in html


# --- samples that make decisions -----------------------------------------------------------------

def _gate(threshold: float) -> onnx.ModelProto:
    """x[1, 6, 1] -> CTC probabilities [1, 6, 2]: class 1 where x > threshold, else the blank 0."""
    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    gate (float[1, 6, 1] x) => (float[1, 6, 2] p) {
      shifted = Sub (x, t)
      logits = Concat <axis = 2> (zero, scaled)
      scaled = Mul (shifted, gain)
      p = Softmax <axis = -1> (logits)
    }
    """)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(np.array([threshold], np.float32), "t"),
                                    onnx.numpy_helper.from_array(np.zeros((1, 6, 1), np.float32), "zero"),
                                    onnx.numpy_helper.from_array(np.array([50.0], np.float32), "gain")])
    order = {"shifted": 0, "scaled": 1, "logits": 2, "p": 3}
    nodes = sorted(model.graph.node, key=lambda n: order[n.output[0]])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_a_generated_sample_on_which_fp32_decides_nothing_is_made_with_the_next_seed_that_decides(capsys):
    from pipeline.assets.samples import SAMPLE_SEEDS, decisive_feeds, make_feeds

    peaks = [float(np.random.default_rng(seed).uniform(-1, 1, (1, 6, 1)).max()) for seed in range(SAMPLE_SEEDS)]
    later = next(seed for seed in range(1, SAMPLE_SEEDS) if peaks[seed] > peaks[0])
    model = _gate((peaks[0] + peaks[later]) / 2)  # seed 0: every step blank; seed `later`: a step over it
    recipe = _recipe('[outputs.p]\nkind = "ctc"\nblank = 0\n')
    feeds = decisive_feeds(model, recipe, None).feeds
    assert np.array_equal(feeds["x"], make_feeds(model, recipe, None, later).feeds["x"])
    told = capsys.readouterr().err
    assert f"fp32 decides nothing on the sample of seed 0 (p: every one of its 6 steps is the blank 0); the sample is made with seed {later}" in told
    never = _gate(2.0)  # no uniform(-1, 1) value is over 2: no seed decides
    assert np.array_equal(decisive_feeds(never, recipe, None).feeds["x"], make_feeds(never, recipe, None).feeds["x"])
    assert f"fp32 decides nothing on the samples of seeds 0 to {SAMPLE_SEEDS - 1}" in capsys.readouterr().err
    given = _recipe('[inputs.x]\nvalue = 0.5\n[outputs.p]\nkind = "ctc"\nblank = 0\n')
    assert np.all(decisive_feeds(never, given, None).feeds["x"] == 0.5) and capsys.readouterr().err == ""  # a given sample is used as given


# --- exports of models that decide, by both torch exporters ---------------------------------------

EXPORTS = Path(__file__).resolve().parent / "data" / "decision_exports"  # tests/data/generators/make_decision_models.py


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_kinds_are_read_from_both_exporters_graphs(exporter):
    crnn = read_output_kinds(onnx.load(str(EXPORTS / f"crnn.{exporter}.onnx")))["log_probs"]
    assert crnn.kind == "logits" and crnn.options["axis"] == 2  # LogSoftmax over the classes, then [T, N, C]
    seg = read_output_kinds(onnx.load(str(EXPORTS / f"seg.{exporter}.onnx")))["probs"]
    assert seg.kind == "probabilities" and seg.options["axis"] == 1
    yolo = read_output_kinds(onnx.load(str(EXPORTS / f"yolo.{exporter}.onnx")))["output0"]
    assert yolo.kind == "tensor" and yolo.options["axis"] == 1 and yolo.parts == [[0, 2], [2, 4], [4, 7]]  # centres, sizes, scores


EXPORT_RECIPES = {
    "crnn": '[outputs.log_probs]\nkind = "ctc"\naxis = 2\ntime_axis = 0\nblank = 0\n',
    "yolo": '[outputs.output0]\nkind = "detection"\nthreshold = 0.5\n',
    "seg": "",  # its probabilities read from the graph
}


@pytest.mark.parametrize("name", sorted(EXPORT_RECIPES))
def test_the_decisions_of_a_torch_export_are_checked_in_a_build(name, tmp_path, monkeypatch):
    """The TorchScript export of each model built on the host: its decision checks pass on fp16 and
    fp32, each on a sample on which fp32 decides something; report.html draws a detector's boxes on
    the sample image, the reference's and each run's."""
    import json

    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.report import figures

    drawn = []
    draw = figures.boxes_figure
    monkeypatch.setattr(figures, "boxes_figure", lambda image, panels: drawn.append((image.shape, [(t, len(b)) for t, b, _, _ in panels])) or draw(image, panels))

    (tmp_path / "r.toml").write_text(f'name = "{name}"\nvariants = ["fp16", "fp32"]\n[source]\nuri = "{EXPORTS / f"{name}.torchscript.onnx"}"\n'
                                     f'[inputs.{"images" if name == "yolo" else "image"}]\nrange = [0.0, 1.0]\n{EXPORT_RECIPES[name]}')
    result = CliRunner().invoke(app, ["build", str(tmp_path / "r.toml"), "--no-browser", "--no-reuse", "--out", str(tmp_path / "out")], env={"PACK_WEBGPU_KERNELS": "off"})
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / name / "report.json").read_text())
    decisions = [c for c in report["checks"] if c.get("decision")]
    assert {c["variant"] for c in decisions} == {"fp16", "fp32"} and all(c["status"] == "passed" for c in decisions), decisions
    fp16 = next(c for c in decisions if c["variant"] == "fp16")
    assert fp16["decided"]["reference"] and fp16["metrics"]["flips"] == 0
    expected = {"crnn": ("ctc", "steps", 16), "yolo": ("detection", "matched", fp16["metrics"].get("boxes")), "seg": ("probabilities", "positions", 32 * 32)}[name]
    assert fp16["decision"] == expected[0] and fp16["metrics"][expected[1]] == expected[2]
    if name == "yolo":  # the head's centres, sizes and scores each against its own range
        numeric = next(c for c in report["checks"] if c["variant"] == "fp16" and c.get("output") == "output0" and not c.get("decision") and c["stage"] == "host")
        assert "worst_part" in numeric["metrics"]
        boxes = fp16["metrics"]["boxes"]
        assert drawn == [((1, 3, 64, 64), [("reference", boxes), ("cpu/fp16 (host)", boxes)])]
    else:
        assert drawn == []
