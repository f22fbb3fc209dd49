"""The per-(EP, variant) browser checks in Firefox and WebKit (harness.py through driven.py) on a
tiny model whose recipe requires the three engines (`[verify] engines`): each engine's runs in the
manifest (`verification.runs[].engine`), report.json and report.html; then `pack verify --engines`
on the built package, with Firefox made absent (not-verifiable with its install line)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from pipeline.cli import app

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) * 0.3, "W"),
               numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"), helper.make_node("Add", ["m", "b"], ["a"], name="add"),
             helper.make_node("Tanh", ["a"], ["y"], name="tanh")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# fp32 only, so each engine has three runs: webgpu/fp32 and wasm/fp32 on the webgpu bundle, wasm/fp32 on the wasm bundle
RECIPE = """name = "tiny"
variants = ["fp32"]
[source]
uri = "tiny.onnx"
[verify]
engines = ["chromium", "firefox", "webkit"]
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`pack build` of the recipe, no --engines: the recipe's engines run. (package folder, report.json).
    A stored build of the same key is reused: the key holds the code and each engine's version, so
    the engines run again whenever what decides their checks changes."""
    folder = tmp_path_factory.mktemp("engine-checks")
    onnx.save(tiny_model(), str(folder / "tiny.onnx"))
    (folder / "tiny.toml").write_text(RECIPE)
    result = CliRunner().invoke(app, ["build", str(folder / "tiny.toml"), "--json", "--out", str(folder / "d")])
    assert result.exit_code == 0, result.output
    return folder / "d" / "tiny", json.loads(result.stdout)


def _installed(engine: str) -> bool:
    from pipeline.verify.engines.browser.driven import driver_for

    return driver_for(engine).unavailable() is None


@pytest.mark.parametrize("engine", ["firefox", "webkit"])
def test_each_engine_runs_every_ep_and_variant_recorded_per_engine(built, engine):
    package, report = built
    runs = [r for r in json.loads((package / "manifest.json").read_text())["verification"]["runs"] if r.get("engine") == engine]
    checks = [c for c in report["checks"] if c["stage"] == "browser" and c.get("engine") == engine]
    triples = sorted((r["bundle"], r["ep"], r["variant"]) for r in runs)
    assert triples == [("wasm", "wasm", "fp32"), ("webgpu", "wasm", "fp32"), ("webgpu", "webgpu", "fp32")]
    assert sorted((c["bundle"], c["ep"], c["variant"]) for c in checks) == triples
    by_ep = {(r["bundle"], r["ep"]): r for r in runs}
    if not _installed(engine):
        assert all(r["status"] == "not-verifiable" and "install it: apt-get install" in r["detail"] for r in runs)
        return
    # wasm runs right in both, judged as Chromium's are (figures against the fp32 reference and its bounds)
    assert by_ep[("webgpu", "wasm")]["status"] == by_ep[("wasm", "wasm")]["status"] == "passed"
    wasm_checks = [c for c in checks if c["ep"] == "wasm"]
    assert all(c["metrics"]["rel_l2"] <= c["threshold"]["rel_l2"] for c in wasm_checks)
    # WebGPU: neither Debian's firefox-esr 140 nor WebKitGTK exposes an adapter here; the row says why, never skipped
    webgpu = by_ep[("webgpu", "webgpu")]
    assert webgpu["status"] in ("passed", "not-verifiable")
    if webgpu["status"] == "not-verifiable":
        assert webgpu["detail"].startswith("no WebGPU adapter on this browser")
    facts = report["browser"]["engines"][engine]
    assert facts["version"].startswith({"firefox": "firefox/", "webkit": "webkitgtk/"}[engine]) and facts["seconds"] > 0
    html = (package / "report.html").read_text()
    assert html.count(f'data-engine="{engine}"') >= len(checks) and f"in {engine}</span>" in html


def test_pack_verify_reruns_the_checks_in_the_engines_given(built, monkeypatch, tmp_path):
    package, _ = built
    monkeypatch.setenv("PACK_FIREFOX", str(tmp_path / "no-firefox"))  # Firefox absent: not-verifiable, named with its install line
    result = CliRunner().invoke(app, ["verify", str(package), "--engines", "chromium,firefox,webkit", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    firefox = [c for c in document["checks"] if c.get("engine") == "firefox"]
    assert len(firefox) == 3 and all(c["status"] == "not-verifiable" and c["install"] == "apt-get install firefox-esr" for c in firefox)
    webkit = [c for c in document["checks"] if c.get("engine") == "webkit"]
    assert len(webkit) == 3
    if _installed("webkit"):
        assert [c["status"] for c in webkit if c["ep"] == "wasm"] == ["passed", "passed"]
    chromium = [c for c in document["checks"] if c["stage"] == "browser" and not c.get("engine")]
    assert len(chromium) == 3 and document["browser"]["engines"]["firefox"]["unavailable"].startswith("Firefox is not installed")


def test_pack_verify_refuses_an_unknown_engine(tmp_path):
    result = CliRunner().invoke(app, ["verify", str(tmp_path), "--engines", "chromium,safari"])
    assert result.exit_code == 2 and "--engines 'chromium,safari': use a comma-separated list of chromium, firefox, webkit" in result.output


def test_a_required_engine_that_is_not_installed_fails_the_build_naming_it(tmp_path, monkeypatch):
    """The recipe requires Firefox, which is absent: the package is written, not verifiable in
    Firefox (its install line), and the build exits 1 with the engine in its headline."""
    monkeypatch.setenv("PACK_FIREFOX", str(tmp_path / "no-firefox"))
    onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    (tmp_path / "tiny.toml").write_text(RECIPE.replace('["chromium", "firefox", "webkit"]', '["firefox"]').replace('variants = ["fp32"]', 'variants = ["fp32"]\n[execution_providers]\ndesktop = ["wasm"]\nandroid = ["wasm"]'))
    result = CliRunner().invoke(app, ["build", str(tmp_path / "tiny.toml"), "--json", "--no-reuse", "--out", str(tmp_path / "d")])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["verdict"] == ["engine firefox is required ([verify] engines) but not verifiable: Firefox is not installed "
                                 f"($PACK_FIREFOX ({tmp_path / 'no-firefox'}) is not a file); install it: apt-get install firefox-esr"]
    manifest = json.loads((tmp_path / "d" / "tiny" / "manifest.json").read_text())
    assert manifest["verification"]["passed"] is False
    assert {r["status"] for r in manifest["verification"]["runs"] if r.get("engine") == "firefox"} == {"not-verifiable"}
