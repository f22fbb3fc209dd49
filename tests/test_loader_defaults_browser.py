"""The loader's defaults cannot break a model: a tiny model whose scalar `sr` input
(a sample rate) makes zeros fail, built with `pack build` and loaded in headless Chromium with
the loader's defaults; and a page where webgpu/fp16 fails, which lands on webgpu/fp32, not wasm.

The model: n = sr / 1000 samples per frame; y = mean over each frame of 0.75 x, x reshaped to
[-1, n] (Reshape allowzero=1). With sr = 0 the shape is [-1, 0], which onnxruntime refuses (it
cannot hold 1600 samples): the pre-warm on zeros fails on every EP, as the VAD of the issue did.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, decode_output
from pipeline.cli import app
from pipeline.package_server import running_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # one `pack build` with its browser stage: ~1 min

SAMPLE_RATE = 16000


def sr_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Div", ["sr", "per"], ["n"], name="frame_length"),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"], name="as_vector"),
        helper.make_node("Concat", ["minus_one", "n1"], ["shape"], axis=0, name="frame_shape"),
        helper.make_node("Reshape", ["x", "shape"], ["frames"], allowzero=1, name="frames"),
        helper.make_node("Mul", ["frames", "gain"], ["scaled"], name="gain"),
        helper.make_node("ReduceMean", ["scaled"], ["y"], axes=[1], keepdims=0, name="mean"),
    ]
    initializers = [
        numpy_helper.from_array(np.array(1000, np.int64), "per"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array(0.75, np.float32), "gain"),
    ]
    graph = helper.make_graph(
        nodes, "sr",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1600]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["frames"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def sample() -> dict[str, np.ndarray]:
    return {"x": np.sin(np.arange(1600, dtype=np.float32) / 7)[None], "sr": np.array(SAMPLE_RATE, np.int64)}


def reference(feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(sr_model().SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sr")
    onnx.save(sr_model(), str(folder / "sr_model.onnx"))
    np.savez(folder / "sample.npz", **sample())
    result = CliRunner().invoke(app, ["build", str(folder / "sr_model.onnx"), "--inputs", str(folder / "sample.npz"), "--out", str(folder / "dist"), "--json"])
    assert result.exit_code == 0, result.output
    return folder / "dist" / "sr_model"


def test_zeros_break_the_model_and_the_sample_rate_does_not():
    import onnxruntime

    session = onnxruntime.InferenceSession(sr_model().SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="cannot be reshaped"):
        session.run(None, {"x": np.zeros((1, 1600), np.float32), "sr": np.array(0, np.int64)})
    assert reference(sample()).shape == (100,)


def _load(browser, package: Path, pages: Path, options: dict, *, manifest: bytes | None = None, init_script: str | None = None) -> tuple[dict, list[str]]:
    """LOAD_AND_RUN on the package (served like production), and the paths served before the run."""
    with running_server(package, {TEST_PREFIX: pages}, manifest=manifest) as server:
        context = browser.new_context()
        if init_script:
            context.add_init_script(init_script)
        page = context.new_page()
        try:
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            loaded = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {**options, "cache": False}, "run": False})
            before_run = [r.path for r in server.requests if r.status == 200]
            assert loaded["ok"], loaded
            ran = page.evaluate(
                """async () => { const model = window.__packModel;
                     const out = await model.run(await model.sampleFeeds());
                     return { y: Array.from(out.y.data), info: model.info }; }"""
            )
        finally:
            context.close()
    return {**loaded, **ran}, before_run


def unmeasured(package: Path) -> dict:
    """The manifest as a device the build did not measure sees it: no priors (SwiftShader's
    measurements put wasm first here and select 'measured' trials fetch the sample), so the
    chain decides: webgpu, then wasm."""
    manifest = json.loads((package / "manifest.json").read_text())
    return {**manifest, "measurements": [], "loader": {**manifest["loader"], "select": "chain"}}


def test_default_load_prewarms_on_the_sample_rate_and_matches_the_reference(built, browser, pages):
    manifest = json.loads((built / "manifest.json").read_text())
    # the sample rate travels in the manifest; the 1600-sample signal does not
    assert manifest["sample"]["tensors"]["sr"]["values"] == [SAMPLE_RATE]
    assert "values" not in manifest["sample"]["tensors"]["x"]
    result, _ = _load(browser, built, pages, {})  # the loader's defaults: pre-warm on, the manifest's chain and selection
    info = result["info"]
    assert result["firstInfo"]["prewarmError"] is None and result["firstInfo"]["fallbacks"] == [], result["firstInfo"]
    prewarms = [e for e in result["events"] if e["type"] == "prewarm"]
    assert prewarms and "error" not in prewarms[0], prewarms
    np.testing.assert_allclose(np.array(result["y"], np.float32), reference(sample()), atol=1e-3)
    assert info["ep"] in ("webgpu", "wasm")


def test_first_visit_fetches_no_sample_file_for_the_prewarm(built, browser, pages):
    _, before_run = _load(browser, built, pages, {}, manifest=json.dumps(unmeasured(built)).encode())
    assert not any(path.lstrip("/").startswith("sample.") for path in before_run), before_run


def test_without_the_values_the_prewarm_fails_and_the_sample_run_keeps_the_provider(built, browser, pages):
    """A package built before the values (zeros on `sr`): the pre-warm error is not the
    provider's, because the sample runs on it; the load keeps its first choice."""
    manifest = unmeasured(built)
    del manifest["sample"]["tensors"]["sr"]["values"]
    result, _ = _load(browser, built, pages, {}, manifest=json.dumps(manifest).encode())
    first = result["firstInfo"]
    assert first["fallbacks"] == [], first["fallbacks"]
    assert first["prewarmError"] and "reshape" in first["prewarmError"]["error"].lower(), first["prewarmError"]
    assert first["prewarmError"]["verdict"] == "the sample ran: not a provider failure"
    assert (first["ep"], first["variant"]) == ("webgpu", "fp32")  # SwiftShader: no shader-f16
    np.testing.assert_allclose(np.array(result["y"], np.float32), reference(sample()), atol=1e-3)


# The adapter says shader-f16 (so the chain starts on webgpu/fp16) but the device onnxruntime gets
# has no f16: webgpu/fp16 fails on this device as Firefox's fp16 Pad shader did.
FAKE_F16_ADAPTER = """
(() => {
  const request = GPU.prototype.requestAdapter;
  GPU.prototype.requestAdapter = async function (...args) {
    const adapter = await request.apply(this, args);
    if (!adapter) return adapter;
    const features = new Set([...adapter.features, 'shader-f16']);
    Object.defineProperty(adapter, 'features', { get: () => features });
    const requestDevice = adapter.requestDevice.bind(adapter);
    adapter.requestDevice = (descriptor = {}) =>
      requestDevice({ ...descriptor, requiredFeatures: [...(descriptor.requiredFeatures || [])].filter((f) => f !== 'shader-f16') });
    return adapter;
  };
})();
"""


def test_a_failing_webgpu_fp16_falls_to_webgpu_fp32_before_wasm(built, browser, pages):
    served = json.dumps(unmeasured(built)).encode()
    result, _ = _load(browser, built, pages, {}, manifest=served, init_script=FAKE_F16_ADAPTER)
    first = result["firstInfo"]
    assert [(f["ep"], f["variant"]) for f in first["fallbacks"]] == [("webgpu", "fp16")], first["fallbacks"]
    assert "f16" in first["fallbacks"][0]["error"], first["fallbacks"]
    assert (first["ep"], first["variant"]) == ("webgpu", "fp32"), first
    fallback = next(e for e in result["events"] if e["type"] == "fallback")
    assert fallback["to"] == {"ep": "webgpu", "variant": "fp32"}
    np.testing.assert_allclose(np.array(result["y"], np.float32), reference(sample()), atol=1e-3)
