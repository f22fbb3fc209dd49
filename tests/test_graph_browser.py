"""The repairs and `pack diagnose` against onnxruntime-web in headless Chromium (SwiftShader WebGPU).

One browser for the module (BrowserModelRunner keeps one page per bundle/EP).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from graph_helpers import FFC_FLIP_MODEL, FFC_MODEL, decoder_head_model, neg_slice_model, random_inputs, run_host
from pipeline.graph import repairs
from pipeline.verify.engines.browser.models import BrowserModelRunner, measure_cpu_fallback
from pipeline.verify.diagnose import diagnose, random_feeds
from pipeline.runtime import resolve_runtime

pytestmark = pytest.mark.browser
RUNTIME_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def runner():
    with BrowserModelRunner(resolve_runtime(RUNTIME_VERSION)) as launched:
        yield launched


def _repair(model: onnx.ModelProto) -> onnx.ModelProto:
    return repairs.run_passes(model, repairs.auto_repairs(model), finish=False)[0]


def test_negative_step_slice_returns_31_elements_on_the_root_bundle_only_after_the_repair(runner):
    model = neg_slice_model()
    feeds = random_inputs(model)
    before = runner.run(model, feeds, "root", "webgpu")
    assert before.ok and before.outputs["y"].shape == (1, 1, 1, 30)
    after = runner.run(_repair(model), feeds, "root", "webgpu")
    assert after.ok and after.outputs["y"].shape == (1, 1, 1, 31)
    np.testing.assert_array_equal(after.outputs["y"], feeds["x"][..., ::-1])


def test_repaired_slice_with_a_dynamic_length_is_right_on_the_root_bundle(runner):
    repaired = repairs.get("neg_step_slice")(neg_slice_model(length="N")).model
    feeds = random_inputs(repaired, {"N": 17})
    run = runner.run(repaired, feeds, "root", "webgpu")
    assert run.ok, run.why()
    np.testing.assert_array_equal(run.outputs["y"], feeds["x"][..., ::-1])


def test_decoder_head_with_stale_squeeze_shape_fails_on_webgpu_until_repaired(runner):
    model = decoder_head_model(stale=True)
    feeds = random_inputs(model)
    before = runner.run(model, feeds, "webgpu", "webgpu")
    assert not before.ok and "inferred=1 declared=3" in before.error
    after = runner.run(_repair(model), feeds, "webgpu", "webgpu")
    assert after.ok, after.why()
    expected, = run_host(model, feeds)
    np.testing.assert_allclose(after.outputs["audio"], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("path", [FFC_MODEL, FFC_FLIP_MODEL], ids=["irfftn", "flip"])
@pytest.mark.parametrize("bundle", ["root", "webgpu"])
def test_ffc_block_passes_on_both_bundles_after_the_repair(runner, path, bundle):
    model = _repair(onnx.load(path))
    feeds = random_inputs(model)
    run = runner.run(model, feeds, bundle, "webgpu")
    assert run.ok and not run.signals, run.why()
    expected, = run_host(onnx.load(path), feeds)
    np.testing.assert_allclose(run.outputs["y"], expected, rtol=1e-3, atol=1e-4)


def test_diagnose_names_the_slice_on_the_root_bundle(runner):
    model = neg_slice_model()
    document = diagnose(model, random_feeds(model, {}), runner, (("root", "webgpu"), ("webgpu", "webgpu")))
    parted, agreed = document["runs"]
    assert (parted["status"], parted["node"], parted["op"]) == ("parts", "Slice#0", "Slice")
    assert parted["host"]["shape"] == [1, 1, 1, 31] and parted["browser"]["shape"] == [1, 1, 1, 30]
    assert parted["hazard"]["repair"] == "neg_step_slice"
    assert agreed["status"] == "agrees"


def test_diagnose_names_the_flip_inside_the_ffc_block(runner):
    model = onnx.load(FFC_FLIP_MODEL)
    outcome, = diagnose(model, random_feeds(model, {}), runner, (("root", "webgpu"),))["runs"]
    assert (outcome["status"], outcome["node"], outcome["output"]) == ("parts", "node_flip", "flip")


def test_diagnose_names_the_squeeze_with_the_stale_shape(runner):
    model = decoder_head_model(stale=True)
    outcome, = diagnose(model, random_feeds(model, {}), runner, (("webgpu", "webgpu"),))["runs"]
    assert (outcome["status"], outcome["node"], outcome["op"]) == ("parts", "Squeeze#1", "Squeeze")
    assert "declared=3" in outcome["error"] and outcome["how"] == "bisection"


def test_inspect_measures_the_ops_without_a_webgpu_kernel(runner):
    from browser_helpers import cpu_fallback_model

    measured = measure_cpu_fallback(cpu_fallback_model(), runner)
    assert measured["ops_without_webgpu_kernel"] == ["Det"]
    assert [n["op"] for n in measured["cpu_nodes"]] == ["Det"]
    clean = measure_cpu_fallback(onnx.load(FFC_MODEL), runner)
    assert clean["ops_without_webgpu_kernel"] == [] and "error" not in clean
