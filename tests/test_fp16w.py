"""fp16w: the fp32 graph with its float32 initializers stored as fp16, widened by the loader.

Which initializers narrow (and which stay float32, with the reason); the JS widening
(web_template/loader/widen.js) gives byte-identical output to the Python one the host checks run,
on real models; `pack build` ships the variant with its manifest key, half the bytes and its own
bounds; in headless Chromium the loader widens it in a Worker, its outputs are within the bounds on
both EPs, and the measured choice picks it (not fp32 beside it)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, decode_output, image_sample, make_package, read_manifest, reference
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.graph.model_io import model_bytes
from pipeline.precision.fp16w import FLOAT16, WIDEN, keeps_fp32, narrow_initializers, widen_model_bytes, widened_model_file
from pipeline.precision.variants import FP16W_MIN_SAVED_BYTES, fp16w_by_default, make_variants
from pipeline.recipe import parse_recipe
from pipeline.verify.judgement.metrics import compare, judge
from pipeline.verify.judgement.thresholds import threshold_for

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIP = ROOT / "tests" / "data" / "flagship"
FIXTURE = ROOT / "tests" / "data" / "fp16w"
WIDEN_JS = ROOT / "web_template" / "loader" / "widen.js"
runner = CliRunner()


def test_which_initializers_stay_float32():
    assert keeps_fp32(np.array([0.5, -3.0, 1e-9, 0.0], np.float32)) is None  # 1e-9 flushes harmlessly beside 3.0
    assert keeps_fp32(np.array(0.0, np.float32)) is None
    assert keeps_fp32(np.array([2.0**-20], np.float32)) is None  # an exact fp16 subnormal
    assert "> fp16 max 65504" in keeps_fp32(np.array([1.0, 70000.0], np.float32))
    assert keeps_fp32(np.array([1.0, np.inf], np.float32)) == "holds inf or NaN"
    assert "below fp16's normal range" in keeps_fp32(np.array(1e-8, np.float32))  # an epsilon keeps its digits


def _scaled_conv() -> onnx.ModelProto:
    """Conv 3->16->3 on [1,3,32,32] with an int64 initializer and a scale beyond fp16's range."""
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((16, 3, 3, 3)) / 5).astype(np.float32)
    w2 = (rng.standard_normal((3, 16, 3, 3)) / 12).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], name="c1"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w2"], ["c"], pads=[1, 1, 1, 1], name="c2"),
            helper.make_node("Mul", ["c", "big"], ["m"], name="up"),
            helper.make_node("Div", ["m", "big"], ["d"], name="down"),
            helper.make_node("Reshape", ["d", "shape"], ["y"], name="same"),
        ],
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 32, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.array(1e5, np.float32), "big"),
         numpy_helper.from_array(np.array([1, 3, 32, 32], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_narrowing_stores_weights_as_fp16_and_lists_what_stays():
    model = _scaled_conv()
    narrowed = narrow_initializers(model)
    types = {t.name: t.data_type for t in narrowed.model.graph.initializer}
    assert types == {"w1": FLOAT16, "w2": FLOAT16, "big": TensorProto.FLOAT, "shape": TensorProto.INT64}
    assert narrowed.narrowed == 2 and narrowed.kept == [{"initializer": "big", "why": "|value| up to 100000 > fp16 max 65504"}]
    assert narrowed.bytes_saved == 2 * (16 * 3 * 9 + 3 * 16 * 9)
    widened, count = widen_model_bytes(model_bytes(narrowed.model))
    assert count == 2
    back = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(widened).graph.initializer}
    for name in ("w1", "w2"):
        original = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))
        assert back[name].dtype == np.float32 and np.array_equal(back[name], original.astype(np.float16).astype(np.float32))
    assert back["big"] == np.float32(1e5) and back["shape"].tolist() == [1, 3, 32, 32]
    # A graph with FLOAT16 initializers of its own: the loader could not tell which to widen.
    assert "FLOAT16 initializers of its own" in narrow_initializers(narrowed.model)


def test_committed_fixture_is_what_the_build_makes():
    """tests/js/widen.test.mjs widens this file and expects this hash: both stay in step with the Python side."""
    narrowed = model_bytes(narrow_initializers(onnx.load(str(FLAGSHIP / "lama.onnx"))).model)
    assert (FIXTURE / "lama.fp16w.onnx").read_bytes() == narrowed
    assert (FIXTURE / "lama.fp16w.widened.sha256").read_text().strip() == hashlib.sha256(widen_model_bytes(narrowed)[0]).hexdigest()


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_js_widening_is_byte_identical_to_the_host_checks(tmp_path):
    paths, expected = [], []
    for name in ("htdemucs", "vocos", "wavtokenizer", "mpsenet", "scnet"):
        narrowed = model_bytes(narrow_initializers(onnx.load(str(FLAGSHIP / f"{name}.onnx"))).model)
        path = tmp_path / f"{name}.fp16w.onnx"
        path.write_bytes(narrowed)
        paths.append(str(path))
        widened, count = widen_model_bytes(narrowed)
        expected.append({"sha256": hashlib.sha256(widened).hexdigest(), "tensors": count, "size": len(widened)})
    script = (
        f"import {{ widenFp16Initializers }} from {json.dumps(WIDEN_JS.as_uri())};\n"
        "import { readFileSync } from 'node:fs';\nimport { createHash } from 'node:crypto';\n"
        "const out = JSON.parse(process.argv[1]).map((p) => { const r = widenFp16Initializers(new Uint8Array(readFileSync(p)));\n"
        "  return { sha256: createHash('sha256').update(r.bytes).digest('hex'), tensors: r.tensors, size: r.bytes.byteLength }; });\n"
        "console.log(JSON.stringify(out));\n"
    )
    result = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(paths)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected
    assert all(e["tensors"] > 10 for e in expected)


CHUNKS_JS = ROOT / "web_template" / "loader" / "chunks.js"


def _mixed_model() -> onnx.ModelProto:
    """Weights of three widths: int64 indices (8 KiB) and a float32 table fp16 cannot hold (kept
    float32, 16 KiB) before the narrowed weights in the external data, so widening starts past 0."""
    rng = np.random.default_rng(5)
    table = (rng.standard_normal((1024, 4)) * 1e5).astype(np.float32)
    ids = rng.integers(0, 1024, 1024).astype(np.int64)
    w = (rng.standard_normal((8, 4096)) / 3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Gather", ["table", "ids"], ["g"], name="gather")],
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096]), helper.make_tensor_value_info("g", TensorProto.FLOAT, [1024, 4])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(ids, "ids"), numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_chunked_fp16w_widens_in_js_to_the_bytes_the_host_checks_run(tmp_path):
    """Each model's fp16w weights cut into 16 KiB chunks (pipeline/assets/chunks.py): the loader's
    variantModel (chunks widened into place as they arrive, the graph widened with the layout) gives
    the graph and external data the host checks run, byte for byte; and those hold, initializer by
    initializer, the float32 bytes the one-file widening gives."""
    from pipeline.assets.chunks import runnable_model, write_chunked
    from pipeline.progress import Progress

    cases, expected, tails = [], [], {}
    for name in ("mixed", "htdemucs", "vocos", "wavtokenizer", "mpsenet", "scnet", "lama"):
        narrowed = narrow_initializers(_mixed_model() if name == "mixed" else onnx.load(str(FLAGSHIP / f"{name}.onnx"))).model
        folder = tmp_path / name
        folder.mkdir()
        chunked = write_chunked(folder, "model.fp16w", narrowed, 16 << 10, Progress.quiet(), widen=True)
        if name == "mpsenet":  # every initializer under 1 KiB: nothing to move out, it stays one file
            assert chunked is None and narrowed.ByteSize() > 16 << 10
            continue
        variant = {"precision": "fp16w", "model": chunked.graph.path, "requires": [], "widen": WIDEN, "externalData": chunked.external}
        files = {f.path: {"size": (folder / f.path).stat().st_size} for f in (chunked.graph, *chunked.chunks)}
        manifest = {"files": files, "variants": {"fp16w": variant}}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        cases.append(str(folder))
        runnable = runnable_model(folder, variant, "fp16w")
        assert runnable == chunked.verify_path  # what the build's host checks ran
        graph, data = runnable.read_bytes(), (runnable.parent / chunked.external["path"]).read_bytes()
        expected.append({"graph": hashlib.sha256(graph).hexdigest(), "data": hashlib.sha256(data).hexdigest(), "path": chunked.external["path"], "chunks": len(chunked.chunks)})
        assert chunked.external["widened"]["sha256"] == expected[-1]["data"]
        if name == "mixed":  # the int64 and float32 groups, then the fp16 values to widen
            assert chunked.external["widened"]["offset"] == (8 + 16) << 10
            assert {c["coding"]["planes"] for c in chunked.external["chunks"] if c["offset"] >= chunked.external["widened"]["offset"]} == {2}
            x = np.random.default_rng(6).standard_normal((1, 8)).astype(np.float32)
            import onnxruntime as ort

            got = ort.InferenceSession(str(runnable)).run(None, {"x": x})
            want = ort.InferenceSession(widen_model_bytes(model_bytes(narrowed))[0]).run(None, {"x": x})
            assert all(np.array_equal(a, b) for a, b in zip(got, want)) and np.abs(got[1]).max() > 65504
        # initializer by initializer, the one-file widening's float32 bytes
        one_file = onnx.load_from_string(widen_model_bytes(model_bytes(narrowed))[0])
        ours = onnx.load(str(runnable))
        assert [(t.name, t.data_type, t.raw_data) for t in ours.graph.initializer] == [(t.name, t.data_type, t.raw_data) for t in one_file.graph.initializer], name
        tails[name] = sum(1 for t in onnx.load(str(folder / chunked.graph.path), load_external_data=False).graph.initializer if t.data_type == FLOAT16 and t.data_location == TensorProto.EXTERNAL)
    script = (
        f"import {{ variantModel }} from {json.dumps(CHUNKS_JS.as_uri())};\n"
        "import { readFileSync } from 'node:fs';\nimport { join } from 'node:path';\nimport { createHash } from 'node:crypto';\n"
        "const sha = (b) => createHash('sha256').update(b).digest('hex');\nconst out = [];\n"
        "for (const folder of JSON.parse(process.argv[1])) {\n"
        "  const manifest = JSON.parse(readFileSync(join(folder, 'manifest.json'), 'utf8'));\n  const events = [];\n"
        "  const files = { get: async (p) => new Uint8Array(readFileSync(join(folder, p))), emit: (e) => events.push(e) };\n"
        "  const model = await variantModel(files, manifest, 'fp16w', null);\n"
        "  out.push({ graph: sha(model.bytes), data: sha(model.externalData[0].data), path: model.externalData[0].path, chunks: manifest.variants.fp16w.externalData.chunks.length,\n"
        "    events: events.map((e) => ({ type: e.type, where: e.where, tensors: e.tensors })) });\n}\n"
        "console.log(JSON.stringify(out));\n"
    )
    result = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps(cases)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert [{k: v for k, v in g.items() if k != "events"} for g in got] == expected
    assert all(g["events"] and g["events"][0]["type"] == "widen" and g["events"][0]["where"] == "this thread" and g["events"][0]["tensors"] >= 1 for g in got), got
    assert all(count > 3 for name, count in tails.items() if name != "mixed") and sum(e["chunks"] > 1 for e in expected) >= 3, (tails, [e["chunks"] for e in expected])


def test_recipe_key_variants_takes_fp16w_and_its_bounds(tmp_path):
    recipe = parse_recipe({"source": {"uri": "m.onnx"}, "variants": ["fp16w", "fp32"], "outputs": {"y": {"fp16w": {"rel_l2": 0.002}}}}, tmp_path / "m.toml")
    assert recipe.variants == ["fp16w", "fp32"] and recipe.outputs["y"].thresholds == {"fp16w": {"rel_l2": 0.002}}
    with pytest.raises(PackError, match="key 'variants'.*fp16w"):
        parse_recipe({"source": {"uri": "m.onnx"}, "variants": ["fp16x"]}, tmp_path / "m.toml")


def test_bounds_sit_between_fp32_and_fp16_and_do_not_widen_on_webgpu():
    for kind in ("tensor", "image", "audio"):
        bounds = threshold_for(kind, "fp16w", "cpu")
        assert bounds == threshold_for(kind, "fp16w", "webgpu") == threshold_for(kind, "fp16w", "wasm")
        for key, bound in bounds.items():
            tight, loose = threshold_for(kind, "fp32", "cpu")[key], threshold_for(kind, "fp16", "cpu")[key]
            assert min(tight, loose) < bound < max(tight, loose), (kind, key)


def test_build_ships_fp16w_with_half_the_bytes_and_checks_the_widened_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    onnx.save(_scaled_conv(), str(tmp_path / "scaled.onnx"))
    (tmp_path / "scaled.toml").write_text('variants = ["fp16w", "fp32"]\n[source]\nuri = "scaled.onnx"\n')
    result = runner.invoke(app, ["build", str(tmp_path / "scaled.toml"), "--no-browser", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    package = tmp_path / "dist" / "scaled"
    manifest = read_manifest(package)
    spec = manifest["variants"]["fp16w"]
    assert spec == {"precision": "fp16w", "model": spec["model"], "requires": [], "widen": WIDEN}
    sizes = {name: manifest["files"][v["model"]]["size"] for name, v in manifest["variants"].items()}
    assert sizes["fp32"] - sizes["fp16w"] == 2 * (16 * 3 * 9 + 3 * 16 * 9), sizes  # 2 of each narrowed weight's 4 bytes
    assert manifest["variantFor"] == {"webgpu": ["fp16w", "fp32"], "wasm": ["fp16w", "fp32"]}
    assert manifest["thresholds"]["cpu"]["fp16w"]["y"] == manifest["thresholds"]["webgpu"]["fp16w"]["y"] == threshold_for("tensor", "fp16w", "cpu")
    report = json.loads((package / "report.json").read_text())
    [check] = [c for c in report["checks"] if c["stage"] == "host" and c["variant"] == "fp16w"]
    assert check["status"] == "passed" and 0 < check["metrics"]["rel_l2"] < 5e-3, check
    # what the host check ran: the widened model, all float32 again
    widened = onnx.load(str(widened_model_file(package / spec["model"])))
    assert {t.data_type for t in widened.graph.initializer} == {TensorProto.FLOAT, TensorProto.INT64}
    [step] = [s for s in report["steps"] if s["name"] == "fp16w_narrow"]
    assert step["records"][0]["kept"] == [{"initializer": "big", "why": "|value| up to 100000 > fp16 max 65504"}]
    assert "  step fp16w_narrow: fp32 graph, 2 initializers stored as fp16, 1 kept float32" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.startswith("  fp16w "))
    assert f"of fp32's {sizes['fp32'] / 1e6:.3f} MB raw; host y: max_abs_of_range" in line and "(<= 0.005)" in line, line


def _dense(inner: int, outer: int) -> onnx.ModelProto:
    """y = x @ W, W [inner, outer] float32: a model whose bytes are its weights."""
    w = (np.random.default_rng(5).standard_normal((inner, outer)) / np.sqrt(inner)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inner])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, outer])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_default_rule_wants_dominant_weights_and_a_meaningful_saving():
    mib = FP16W_MIN_SAVED_BYTES
    assert fp16w_by_default(3 * mib, 3 * mib // 2 - 1000) == "by default: weights 100% of the fp32 model, 1.5 MiB saved"
    assert fp16w_by_default(4 * mib, mib) is not None  # weights exactly half the model
    assert fp16w_by_default(4 * mib + 4, mib) is None  # weights just under half: a graph of many small ops
    assert fp16w_by_default(2 * mib, mib - 1) is None  # all weights, but under 1 MiB saved
    assert fp16w_by_default(0, 0) is None


def test_a_recipe_without_variants_ships_fp16w_where_weights_dominate_and_a_listed_set_turns_it_off(tmp_path, monkeypatch):
    """2.6 MB of MatMul weights: fp16w by default, checked on the host like any variant and put
    ahead of fp32 for wasm and WebGPU; `variants` without fp16w turns it off; the 4 kB conv gets
    none (under the rule's 1 MiB), and its step says why."""
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    onnx.save(_dense(1024, 640), str(tmp_path / "dense.onnx"))
    (tmp_path / "dense.toml").write_text('[source]\nuri = "dense.onnx"\n')
    result = runner.invoke(app, ["build", str(tmp_path / "dense.toml"), "--no-browser", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    package = tmp_path / "dist" / "dense"
    manifest = read_manifest(package)
    assert sorted(manifest["variants"]) == ["fp16", "fp16w", "fp32"] and manifest["variants"]["fp16w"]["widen"] == WIDEN
    assert manifest["variantFor"] == {"webgpu": ["fp16", "fp16w", "fp32"], "wasm": ["fp16w", "fp32"]}
    report = json.loads((package / "report.json").read_text())
    host = {c["variant"]: c["status"] for c in report["checks"] if c["stage"] == "host"}
    assert host == {"fp16": "passed", "fp16w": "passed", "fp32": "passed"}, report["checks"]
    assert {(r["stage"], r["variant"]): r["status"] for r in manifest["verification"]["runs"]}[("host", "fp16w")] == "passed"
    [step] = [s for s in report["steps"] if s["name"] == "fp16w_narrow"]
    assert step["records"][0]["default"] == "by default: weights 100% of the fp32 model, 1.3 MiB saved", step
    visits = report["delivery"]["first_visit"]
    assert visits["apple-mobile"]["variant"] == "fp16w" and visits["desktop"]["variant"] == "fp16"

    recipe = parse_recipe({"source": {"uri": "dense.onnx"}}, tmp_path / "dense.toml")
    assert not recipe.variants_stated and recipe.ships() == "fp16+fp32 (+fp16w)"
    stated = parse_recipe({"source": {"uri": "dense.onnx"}, "variants": ["fp16", "fp32"]}, tmp_path / "dense.toml")
    assert stated.variants_stated and stated.ships() == "fp16+fp32"
    assert [v.name for v in make_variants(_dense(1024, 640), stated, "dense-stated").variants] == ["fp16", "fp32"]
    small = make_variants(_scaled_conv(), recipe, "scaled-default")
    assert [v.name for v in small.variants] == ["fp16", "fp32"] and "fp16w" not in small.refused
    [step] = [s for s in small.steps if s["name"] == "fp16w_narrow"]
    assert step["records"][0]["default"].startswith("not shipped: saves 1,728 B of "), step


# ---------------------------------------------------------------------------------------------
# In the browser


@pytest.fixture(scope="module")
def fp16w_package(tmp_path_factory) -> Path:
    return make_package(
        tmp_path_factory.mktemp("pkg") / "loader-test-image", "image", select="measured", prewarm=False, fp16w=True,
        variant_for={"webgpu": ["fp16", "fp16w", "fp32"], "wasm": ["fp16w", "fp32"]},
    )


@pytest.mark.browser
def test_loader_widens_in_a_worker_runs_within_bounds_on_both_eps_and_the_measured_choice_picks_it(browser, fp16w_package, pages):
    from pipeline.package_server import running_server

    manifest = read_manifest(fp16w_package)
    files = {name: manifest["files"][v["model"]] for name, v in manifest["variants"].items()}
    assert files["fp32"]["size"] - files["fp16w"]["size"] >= 2 * (27 + 1), files  # 2 of each weight's 4 bytes (the ratio: tests above)
    with running_server(fp16w_package, {TEST_PREFIX: pages}) as server:
        page = browser.new_context().new_page()
        try:
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            measured = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"cache": False, "storage": None, "selectBudgetMs": 60000}, "run": True})  # no 'budget' skips on a loaded machine
        finally:
            page.context.close()
    assert measured["ok"], measured
    selection = measured["info"]["selection"]
    # fp16 needs shader-f16 (SwiftShader has none); fp32 is not timed beside fp16w: same kernels
    assert {(c["ep"], c["variant"]) for c in selection["candidates"]} == {("webgpu", "fp16w"), ("wasm", "fp16w")}, selection
    assert selection["choice"]["variant"] == "fp16w" == measured["info"]["variant"]
    # each trial compared its outputs with the reference against manifest.thresholds[ep].fp16w: both EPs within bounds
    assert all(c["result"] == "ok" and c["comparison"].startswith("y: psnr_db ") for c in selection["candidates"]), selection["candidates"]
    for ep in ("webgpu", "wasm"):
        assert manifest["thresholds"][ep]["fp16w"]["y"] == threshold_for("image", "fp16w", ep)
    widen = [e for e in measured["events"] if e["type"] == "widen"]
    assert widen and {e["where"] for e in widen} == {"worker"} and {e["tensors"] for e in widen} == {2}, widen
    # only the fp16w model crossed the wire
    downloads = {e["file"] for e in measured["events"] if e["type"] == "download"}
    assert manifest["variants"]["fp16w"]["model"] in downloads and manifest["variants"]["fp32"]["model"] not in downloads
    # and the chosen session's run, judged here by the Python metrics
    metrics = compare(reference("image", image_sample()), decode_output(measured["outputs"]["y"]), "image")
    passed, why = judge(metrics, threshold_for("image", "fp16w", measured["info"]["ep"]))
    assert passed and metrics["max_abs"] > 0, (why, metrics)  # weight rounding shows, within bounds
