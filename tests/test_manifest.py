"""pipeline/manifest.py: the schema-2 validator, verification runs and the refusal rule."""

from __future__ import annotations

import copy
from pathlib import Path
import json
from importlib import resources

import pytest

from pipeline.manifest import make_manifest, measurements_from, read_manifest, refused, runs_from_checks, validate
from pipeline.errors import PackError


def _file(cache: str = "immutable") -> dict:
    return {"sha256": "0" * 64, "integrity": "sha256-" + "A" * 43 + "=", "size": 1, "mediaType": "application/octet-stream", "encodings": {}, "cache": cache}


def _manifest(runs: list[dict] | None = None) -> dict:
    return make_manifest(
        name="m",
        files={"model.fp16.0123456789abcdef.onnx": _file(), "model.fp32.0123456789abcdef.onnx": _file(),
               "sample.0123456789abcdef.bin": _file(), "ort/a.0123456789abcdef.mjs": _file(), "ort/a.0123456789abcdef.wasm": _file(),
               "loader.js": _file("short")},
        variants={"fp16": {"precision": "fp16", "model": "model.fp16.0123456789abcdef.onnx", "requires": ["shader-f16"]},
                  "fp32": {"precision": "fp32", "model": "model.fp32.0123456789abcdef.onnx", "requires": []}},
        variant_for={"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        inputs=[{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        outputs=[{"name": "y", "shape": [1, 4], "dtype": "float32", "kind": "tensor"}],
        sample={"file": "sample.0123456789abcdef.bin", "tensors": {"x": {"dtype": "float32", "dims": [1, 4], "offset": 0, "length": 16}},
                "outputs": {"y": {"dtype": "float32", "dims": [1, 4], "offset": 16, "length": 16}}},
        runtime={"package": "onnxruntime-web", "version": "1.30.0",
                 "bundles": {"webgpu": {"entry": "onnxruntime-web/webgpu", "module": "ort/a.0123456789abcdef.mjs", "wasm": "ort/a.0123456789abcdef.wasm"}}},
        execution_providers={"desktop": ["webgpu", "wasm"]},
        loader={"watchdogMs": 60000, "prewarm": True, "select": "chain"},
        verification={"browser": True, "passed": not any(r["status"] == "failed" for r in runs or []), "runs": runs or []},
    )


def test_the_schema_ships_inside_the_package():
    schema = json.loads(resources.files("pipeline").joinpath("manifest.schema.json").read_text())
    assert schema["properties"]["schema"] == {"const": 2}


def test_refusal_rule_matches_wildcards_and_only_failed_runs():
    host = {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "failed", "detail": "y: rel_l2 0.5 > 0.01"}
    browser = {"stage": "browser", "bundle": "webgpu", "ep": "wasm", "variant": "fp32", "status": "failed", "detail": "y: max_abs 1 > 0.001"}
    kernels = {"stage": "webgpu-kernels", "bundle": "*", "ep": "webgpu", "variant": "fp32", "status": "failed", "detail": "y: rel_l2 1 > 0.001"}
    unverifiable = {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp16", "status": "not-verifiable", "detail": "no shader-f16"}
    manifest = _manifest([browser, unverifiable, host])
    assert refused(manifest, "webgpu", "webgpu", "fp16") == host  # not-verifiable alone refuses nothing
    assert refused(manifest, "wasm", "wasm", "fp16") == host
    assert refused(manifest, "webgpu", "wasm", "fp32") == browser
    assert refused(manifest, "wasm", "wasm", "fp32") is None  # the failure was on the other bundle
    assert refused(manifest, "webgpu", "webgpu", "fp32") is None
    manifest = _manifest([kernels])
    assert refused(manifest, "webgpu", "webgpu", "fp32") == kernels and refused(manifest, "wasm", "wasm", "fp32") is None


def test_runs_from_checks_one_per_triple_with_the_first_failure():
    checks = [
        {"stage": "host", "ep": "cpu", "variant": "fp16", "output": "a", "status": "passed"},
        {"stage": "host", "ep": "cpu", "variant": "fp16", "output": "b", "status": "failed", "detail": "rel_l2 0.5 > 0.01"},
        {"stage": "browser", "ep": "webgpu", "variant": "fp16", "bundle": "webgpu", "output": "a", "status": "not-verifiable", "detail": "no shader-f16"},
        {"stage": "browser", "ep": "wasm", "variant": "fp32", "bundle": "wasm", "output": "a", "status": "passed"},
    ]
    assert runs_from_checks(checks, "host") == [{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "failed", "detail": "b: rel_l2 0.5 > 0.01"}]
    assert runs_from_checks(checks, "browser") == [
        {"stage": "browser", "bundle": "wasm", "ep": "wasm", "variant": "fp32", "status": "passed"},
        {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp16", "status": "not-verifiable", "detail": "a: no shader-f16"},
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("thresholds"), 'key "thresholds": missing'),
        (lambda m: m["loader"].update(select="fastest"), 'key "loader.select": \'fastest\' is not one of'),
        (lambda m: m["files"]["loader.js"].update(cache="forever"), 'key "files["loader.js"].cache"'),
        (lambda m: m["verification"]["runs"].append({"stage": "host", "bundle": "*", "ep": "*", "variant": "fp32", "status": "failed"}), 'key "verification.runs[0].detail": missing'),
        (lambda m: m["variantFor"]["webgpu"].append("int8"), 'key "variantFor.webgpu[2]": unknown variant \'int8\''),
        (lambda m: m["executionProviders"].update(apple=["wasm"]), 'key "executionProviders.apple": needs the \'wasm\' runtime bundle'),
        (lambda m: m["files"].pop("sample.0123456789abcdef.bin"), 'key "sample.file": \'sample.0123456789abcdef.bin\' is not listed in \'files\''),
        (lambda m: m["sample"]["outputs"].update(z=m["sample"]["outputs"]["y"]), 'key "sample.outputs.z": not a model output'),
        (lambda m: m["files"]["loader.js"].update(stored="br"), 'key "files["loader.js"].stored": \'br\', but \'encodings\' has no such body'),
        (lambda m: m["files"]["loader.js"].update(stored="gzip"), 'key "files["loader.js"].stored": \'gzip\' is not one of'),
        (lambda m: m["files"].update({"manifest.json": m["files"]["loader.js"]}), 'key "files["manifest.json"]": the manifest does not list itself'),
        (lambda m: m["sample"]["tensors"]["x"].update(values=[1, 2, 3]), 'key "sample.tensors.x.values": 3 values for dims [1, 4]'),
        (lambda m: m["sample"]["tensors"]["x"].update(values=list(range(65))), 'key "sample.tensors.x.values"'),
        (lambda m: m.update(extra=1), 'key "extra": not a key of schema 2'),
        (lambda m: m["loader"].update(watchdog=1), 'key "loader.watchdog": not a key of schema 2'),
    ],
)
def test_validate_names_the_key(change, message):
    manifest = copy.deepcopy(_manifest())
    change(manifest)
    with pytest.raises(PackError) as raised:
        validate(manifest, "dist/m/manifest.json")
    text = str(raised.value)
    assert text.startswith("dist/m/manifest.json: ") and message in text and text.endswith("rebuild the package with this version of pack")
    assert "\n" not in text


def test_read_manifest_of_a_file_or_a_folder_without_one(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"x")
    for where in (tmp_path, tmp_path / "model.onnx"):
        with pytest.raises(PackError, match="manifest.json: not found; point at a folder made by `pack build`"):
            read_manifest(where)


def test_measurements_come_from_passed_runs_with_times():
    report = {
        "chromium": "150.0.7871.100",
        "adapter": {"available": True, "vendor": "google", "architecture": "swiftshader", "description": "SwiftShader", "features": []},
        "runs": [
            {"bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "status": "passed",
             "timings_ms": {"session_create_ms": 40.0, "first_run_ms": 12.5, "steady_run_ms": 9.0}},
            {"bundle": "wasm", "ep": "wasm", "variant": "fp32", "status": "passed", "timings_ms": {"session_create_ms": 5.0, "first_run_ms": 3.0}},
            {"bundle": "webgpu", "ep": "webgpu", "variant": "fp16", "status": "not-verifiable", "timings_ms": {}},
        ],
    }
    assert measurements_from(report) == [
        {"source": "build", "browser": "Chromium/150.0.7871.100", "adapter": None, "bundle": "wasm", "ep": "wasm", "variant": "fp32",
         "createMs": 5.0, "firstMs": 3.0, "steadyMs": None},
        {"source": "build", "browser": "Chromium/150.0.7871.100",
         "adapter": {"vendor": "google", "architecture": "swiftshader", "description": "SwiftShader"},
         "bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "createMs": 40.0, "firstMs": 12.5, "steadyMs": 9.0},
    ]
    assert measurements_from(None) == []


def test_the_loaders_required_keys_are_generated_from_the_schema():
    """web_template/loader/manifest_keys.js is what the loader checks a fetched manifest against."""
    from pipeline.manifest import loader_keys_module, required_keys

    shipped = Path(__file__).resolve().parent.parent / "web_template" / "loader" / "manifest_keys.js"
    assert shipped.read_text(encoding="utf-8") == loader_keys_module(), (
        "manifest_keys.js is stale: python -c 'from pipeline.manifest import loader_keys_module as m; "
        "open(\"web_template/loader/manifest_keys.js\", \"w\").write(m())'")
    keys = required_keys()
    assert {"files", "variants", "runtime", "sample"} <= set(keys[""]) and keys["variants.*"] == ["precision", "model", "requires"]


def test_small_sample_inputs_carry_their_values_for_the_prewarm():
    """Scalars, selectors and vectors of at most 64 elements: their values in the manifest (the
    loader's pre-warm feeds them without the sample file); bigger inputs, or values JSON cannot
    carry exactly, none."""
    import numpy as np

    from pipeline.sample_file import PREWARM_VALUES_MAX_ELEMENTS, prewarm_values, sample_bytes

    _, tensors, _ = sample_bytes({
        "x": np.zeros((1, 1600), np.float32),
        "sr": np.array(16000, np.int64),
        "mode": np.array([True, False]),
        "gain": np.array([0.5, -2.0], np.float32),
        "row": np.arange(PREWARM_VALUES_MAX_ELEMENTS, dtype=np.int32),
        "too_long": np.arange(PREWARM_VALUES_MAX_ELEMENTS + 1, dtype=np.int32),
    })
    assert tensors["sr"]["values"] == [16000] and tensors["sr"]["dims"] == []
    assert tensors["mode"]["values"] == [1, 0] and tensors["gain"]["values"] == [0.5, -2.0]
    assert tensors["row"]["values"] == list(range(PREWARM_VALUES_MAX_ELEMENTS))
    assert "values" not in tensors["x"] and "values" not in tensors["too_long"]
    assert prewarm_values(np.array([np.nan], np.float32)) is None
    assert prewarm_values(np.array([2**60], np.int64)) is None
    manifest = _manifest()
    manifest["sample"]["tensors"]["x"]["values"] = [0.0, 1.0, 2.0, 3.0]
    validate(manifest, "m")
