"""A refused variant is not a failed package (pipeline.manifest.package_verdict, used by build and
publish), a webgpu-kernels runtime error the browser contradicts is not-verifiable, the fp16
search's WebGPU evaluator applies the stage's layout retry, and a passed package's summary never
says its fp16 search failed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.commands.summary import fp16_kept_lines
from pipeline.manifest import chains_without_refused_eps, package_verdict, refused_eps
from pipeline.recipe import Recipe
from pipeline.verify.judgement.checks import contradicted_kernel_errors
from pipeline.verify.stages import _fp16_judge
from tests.test_manifest import _manifest


def _run(stage, bundle, ep, variant, status, detail="y: rel_l2 0.5 > 0.01"):
    run = {"stage": stage, "bundle": bundle, "ep": ep, "variant": variant, "status": status}
    return run if status == "passed" else {**run, "detail": detail}


HOST_FP32 = _run("host", "*", "*", "fp32", "passed")
WEBGPU_FP32 = _run("browser", "webgpu", "webgpu", "fp32", "passed")
WASM_FP32 = _run("browser", "webgpu", "wasm", "fp32", "passed")


def test_a_refused_fp16_leaves_every_chain_a_verified_variant_and_the_package_passes():
    manifest = _manifest([HOST_FP32, WEBGPU_FP32, WASM_FP32, _run("host", "*", "*", "fp16", "failed")])
    assert package_verdict(manifest) == (True, [])


def test_a_chain_left_without_a_verified_variant_on_any_ep_fails_the_package():
    wasm_failed = _run("browser", "webgpu", "wasm", "fp32", "failed", "y: max_abs 1 > 0.001")
    manifest = _manifest([HOST_FP32, _run("browser", "webgpu", "webgpu", "fp32", "failed", "y: rel_l2 1 > 0.001"), wasm_failed, _run("host", "*", "*", "fp16", "failed")])
    passed, problems = package_verdict(manifest)
    assert not passed and problems[0].startswith("platform desktop: no verified variant left on webgpu or wasm") and "max_abs 1" in problems[0]


KERNELS_FAILED = [_run("webgpu-kernels", "*", "webgpu", v, "failed", "All inputs must be tensors on WebGPU buffers") for v in ("fp16", "fp32")]


def _with_wasm_bundle(manifest: dict) -> dict:
    """The package also ships the wasm-only bundle (an Apple-mobile chain loads it)."""
    manifest["runtime"]["bundles"]["wasm"] = dict(manifest["runtime"]["bundles"]["webgpu"], entry="onnxruntime-web/wasm")
    manifest["executionProviders"]["apple-mobile"] = ["wasm"]
    return manifest


def test_an_ep_refused_for_every_variant_leaves_the_chains_and_the_package_passes():
    runs = [HOST_FP32, _run("host", "*", "*", "fp16", "passed"), *KERNELS_FAILED, _run("browser", "wasm", "wasm", "fp32", "passed"), WASM_FP32]
    manifest = _with_wasm_bundle(_manifest(runs))
    assert package_verdict(manifest) == (True, [])
    [entry] = refused_eps(manifest)
    assert entry["ep"] == "webgpu" and entry["platforms"] == ["desktop"] and "All inputs must be tensors on WebGPU buffers" in entry["evidence"]
    assert chains_without_refused_eps(manifest) == {"desktop": ["wasm"], "apple-mobile": ["wasm"]}
    # without the wasm-only bundle the chain keeps its bundle, and the loader passes the EP by
    assert chains_without_refused_eps(_manifest(runs)) == {"desktop": ["webgpu", "wasm"]}
    assert package_verdict(_manifest(runs)) == (True, [])


def test_a_required_ep_that_is_refused_fails_the_package():
    manifest = _with_wasm_bundle(_manifest([HOST_FP32, *KERNELS_FAILED, WASM_FP32, _run("browser", "wasm", "wasm", "fp32", "passed")]))
    manifest["verification"]["require"] = ["webgpu"]
    passed, problems = package_verdict(manifest)
    assert not passed and problems == ["EP webgpu is required ([verify] require) but refused on desktop: webgpu-kernels fp16 (any bundle, webgpu): failed: All inputs must be tensors on WebGPU buffers; webgpu-kernels fp32 (any bundle, webgpu): failed: All inputs must be tensors on WebGPU buffers"]


def test_a_required_variant_that_is_refused_fails_the_package():
    manifest = _manifest([HOST_FP32, WEBGPU_FP32, WASM_FP32, _run("webgpu-kernels", "*", "webgpu", "fp16", "failed")])
    assert package_verdict(manifest)[0]
    manifest["verification"]["require"] = ["fp16"]
    passed, problems = package_verdict(manifest)
    assert not passed and "variant fp16 is required ([verify] require) but refused: webgpu-kernels fp16" in problems[0]


def test_no_passed_run_is_no_verified_package():
    manifest = _manifest([_run("host", "*", "*", "fp32", "skipped", "--no-browser")])
    assert package_verdict(manifest) == (False, ["no check passed (every one failed, was skipped or was not verifiable)"])


def test_verify_require_names_recipe_variants_and_eps(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli import app

    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\nsource = { uri = "m.onnx" }\nvariants = ["fp32"]\n[verify]\nrequire = ["fp16"]\n')
    result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser"])
    assert result.exit_code == 2 and "verify.require" in result.output and "(fp32, webgpu, wasm)" in result.output


def test_a_kernel_runtime_error_the_browser_contradicts_is_not_verifiable():
    error = {"stage": "webgpu-kernels", "ep": "webgpu", "variant": "fp16", "status": "failed", "metrics": {}, "threshold": {}, "detail": "All inputs must be tensors on WebGPU buffers"}
    wrong = {**error, "variant": "fp32", "metrics": {"rel_l2": 1.0}, "detail": "y: rel_l2 1 > 0.001"}
    browser = [{"stage": "browser", "ep": "webgpu", "variant": v, "status": "passed"} for v in ("fp16", "fp32")]
    fixed = contradicted_kernel_errors([error, wrong], browser)
    assert fixed[0]["status"] == "not-verifiable" and "All inputs must be tensors" in fixed[0]["detail"] and "browser" in fixed[0]["detail"]
    assert fixed[1] == wrong  # a wrong figure stays a failure
    assert contradicted_kernel_errors([error], [])[0] == error  # no browser run: nothing contradicts it


def test_the_webgpu_evaluator_passes_a_candidate_that_the_layout_retry_fixes():
    reference = {"y": np.arange(8, dtype=np.float32)}
    good = SimpleNamespace(outputs=reference, error=None, not_verifiable=None)
    bad = SimpleNamespace(outputs={"y": np.zeros(8, np.float32)}, error=None, not_verifiable=None)
    judge = _fp16_judge(lambda path, feeds: bad, "webgpu", lambda: reference, {}, Recipe(name="m"), retry=lambda path, feeds: good)
    assert judge(Path("m.onnx")) == (True, "passed")
    assert judge.failures(Path("m.onnx")) == {}
    assert not _fp16_judge(lambda path, feeds: bad, "webgpu", lambda: reference, {}, Recipe(name="m"), retry=lambda path, feeds: bad)(Path("m.onnx"))[0]


@pytest.mark.parametrize("passed, refused, says_failed", [(True, None, False), (False, None, True), (True, [{"variant": "fp16", "ep": "webgpu", "bundle": "webgpu", "by": "x"}], True)])
def test_the_summary_of_a_passed_package_never_says_its_search_failed(passed, refused, says_failed):
    search = {"trials": 1, "seconds": 2.0, "candidates": 7, "evaluators": ["host cpu", "webgpu-kernels"], "minimal": False,
              "failed": "keeping all 7 ranked candidates in fp32 still misses a threshold", "first_failure": "webgpu-kernels: enh: snr_db 3 < 15"}
    record = {"kept": [], "sizes": {"fp32_bytes": 4, "all_fp16_ideal_bytes": 2, "fp16_bytes": 2, "kept_cost_bytes": 0}, "search": search}
    report = {"passed": passed, "refused": refused, "steps": [{"name": "fp16_keep_fp32", "records": [record]}]}
    text = "\n".join(fp16_kept_lines(report))
    assert ("failed" in text) == says_failed
    if not says_failed:
        assert "none was needed" in text and "snr_db 3 < 15" in text


def test_reductions_over_65520_values_are_kept_without_a_trial_at_the_sample_shapes():
    """HTDemucs-style standardisation: mean over a whole stereo chunk. The length comes from the
    sample's shape (the model's time axis is symbolic)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision.kernel_hazards import known_kernel_hazards

    nodes = [
        helper.make_node("ReduceMean", ["x", "all"], ["mean"], name="chunk_mean", keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
        helper.make_node("LayerNormalization", ["centred", "g", "b"], ["y"], name="frame_norm", axis=-1),
        helper.make_node("ReduceSum", ["y", "last"], ["s"], name="frame_sum", keepdims=1),
    ]
    graph = helper.make_graph(nodes, "std", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "t"])],
                              [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1, 2], np.int64), "all"), numpy_helper.from_array(np.array([2], np.int64), "last"),
                               numpy_helper.from_array(np.ones(1, np.float32), "g"), numpy_helper.from_array(np.zeros(1, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert known_kernel_hazards(model, {"x": (1, 2, 32759)}) == {}  # 65518 values: the kernel is right
    found = known_kernel_hazards(model, {"x": (1, 2, 32760)})
    assert list(found) == ["chunk_mean"] and "over 65520 values" in found["chunk_mean"] and "without a trial" in found["chunk_mean"]
    found = known_kernel_hazards(model, {"x": (1, 2, 343980)})  # HTDemucs' 7.8 s chunk at 44.1 kHz
    assert set(found) == {"chunk_mean", "frame_norm", "frame_sum"} and "687960 values" in found["chunk_mean"]


def test_conv_transposes_counting_past_2048_positions_are_kept_without_a_trial():
    """onnxruntime's WebGPU fp16 ConvTranspose counts positions in fp16, exact up to 2048
    (tests/test_verify_node_audit.py measures it): HTDemucs' time decoder goes to 344064."""
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision.kernel_hazards import known_kernel_hazards

    nodes = [
        helper.make_node("ConvTranspose", ["x", "w"], ["up"], name="up_time", strides=[2], pads=[1, 1], kernel_shape=[4]),
        helper.make_node("ConvTranspose", ["img", "w2"], ["up2"], name="up_image", strides=[2, 2], kernel_shape=[2, 2]),
    ]
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, "t"]),
                                                 helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 8, "h", "w"])],
                              [helper.make_tensor_value_info("up", TensorProto.FLOAT, None), helper.make_tensor_value_info("up2", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones((8, 4, 4), np.float32), "w"), numpy_helper.from_array(np.ones((8, 4, 2, 2), np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert known_kernel_hazards(model, {"x": (1, 8, 1024), "img": (1, 8, 256, 1024)}) == {}  # counts to 2046
    found = known_kernel_hazards(model, {"x": (1, 8, 1030), "img": (1, 8, 256, 1536)})
    assert set(found) == {"up_time", "up_image"}
    assert "over 1030 input positions at stride 2, counting to 2058" in found["up_time"] and "without a trial" in found["up_time"]
    assert "over 1536 input positions at stride 2" in found["up_image"]  # MDX's 3072-bin upsampling


def test_the_producers_of_a_discrete_op_rank_first():
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.precision.ranking import rank_nodes
    from pipeline.verify.engines.host import run_model

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="encoder"),
        helper.make_node("Exp", ["h"], ["d"], name="duration"),
        helper.make_node("Ceil", ["d"], ["frames"], name="frames_ceil"),
        helper.make_node("Sub", ["h", "big"], ["z"], name="far_from_ceil"),
        helper.make_node("Sub", ["z", "big"], ["y"], name="cancel"),
    ]
    rng = np.random.default_rng(0)
    graph = helper.make_graph(nodes, "tts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("frames", TensorProto.FLOAT, [1, 8]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float32), "w"), numpy_helper.from_array(np.array(-300.0, np.float32), "big")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ranked = rank_nodes(model, {"x": rng.uniform(-1, 1, (1, 8)).astype(np.float32)}, lambda path, feeds: run_model(path, feeds).outputs)
    # the discrete op's producers, and the discrete op itself (a candidate since it reads floats), before the rest
    names = [s.node for s in ranked]
    assert names[0] == "duration" and set(names[:3]) == {"duration", "frames_ceil", "encoder"}, names
    encoder = next(s for s in ranked if s.node == "encoder")
    assert "discrete Ceil 'frames_ceil' directly" in ranked[0].why and "1 nodes up" in encoder.why


def test_one_search_per_failing_output_over_the_nodes_it_depends_on():
    """Two independent failures: each output's search only tries the nodes it depends on, and an
    output the budget does not reach keeps its whole cone, marked not minimal."""
    from onnx import TensorProto, helper

    from pipeline.precision.kept_nodes import _search_per_output

    chain = lambda tag: [helper.make_node("Relu", ["x" if i == 0 else f"{tag}{i - 1}"], [f"{tag}{i}"], name=f"{tag}{i}") for i in range(4)]  # noqa: E731
    graph = helper.make_graph(chain("a") + chain("b"), "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("a3", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("b3", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    needed = {"a3": {"a1"}, "b3": {"b2", "b0"}}
    seen: list[list[str]] = []

    def counting(tried):
        def failures_of(nodes):
            seen.append(sorted(nodes))
            tried[0] += 1
            return {("host cpu", out): "off" for out, need in needed.items() if not need <= set(nodes)}
        return failures_of

    ranked = ["b2", "a1", "a0", "b0", "a2", "b1", "a3", "b3"]
    never_hopeless = lambda nodes: None  # noqa: E731  (the early stop has its own tests)
    tried = [0]
    result = _search_per_output(model, ranked, counting(tried), {}, Recipe(name="m", fp16_search_trials=40), tried, never_hopeless)
    assert result.passed and result.minimal and sorted(result.kept) == ["a1", "b0", "b2"]
    assert all(not (set(nodes) & {"b0", "b1", "b2", "b3"}) for nodes in seen[1:4])  # a3's search stays in its cone
    tried = [0]
    tight = _search_per_output(model, ranked, counting(tried), {}, Recipe(name="m", fp16_search_trials=5), tried, never_hopeless)
    assert tight.passed and not tight.minimal and "budget" in tight.stopped and {"a1", "b0", "b2"} <= set(tight.kept)


def test_a_failed_headline_names_the_check_that_failed_and_why():
    manifest = _manifest([_run("host", "*", "*", "quantized", "failed", "y: shape [24, 1, 10] vs declared [1, 'seqlen']"),
                          _run("browser", "webgpu", "webgpu", "quantized", "skipped", "--no-browser")])
    assert package_verdict(manifest) == (False, ["no check passed (every one failed, was skipped or was not verifiable): "
                                                 "host quantized (any bundle, any EP): failed: y: shape [24, 1, 10] vs declared [1, 'seqlen']"])
