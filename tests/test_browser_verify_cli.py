"""`pack verify DIST/NAME` through the CLI on a tiny package."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from browser_helpers import Variant, negative_step_slice_model, write_package
from pipeline.cli import app
from pipeline.verify.engines import webgpu_kernels

runner = CliRunner()


@pytest.fixture(scope="module")
def slice_package(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("verify-cli")
    feeds = {"x": np.linspace(-1, 1, 31, dtype=np.float32).reshape(1, 1, 1, 31)}
    return write_package(tmp / "slice", {"fp32": Variant(negative_step_slice_model())}, feeds)


@pytest.mark.browser
def test_verify_passes_and_prints_json(slice_package: Path) -> None:
    result = runner.invoke(app, ["verify", str(slice_package), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["passed"] is True and document["reference"] == "fp32"
    assert [(c["ep"], c["status"]) for c in document["checks"] if c["stage"] == "browser"] == [("webgpu", "passed"), ("wasm", "passed")]
    # and the webgpu-kernels stage, where installed, on the same package
    assert [(c["variant"], c["status"]) for c in document["checks"] if c["stage"] == "webgpu-kernels"] in ([("fp32", "passed")], [("fp32", "skipped")])
    assert set(document["browser"]["eps"]) == {"webgpu/fp32", "wasm/fp32"}


@pytest.mark.browser
def test_verify_on_the_root_bundle_exits_1_and_says_why(slice_package: Path) -> None:
    result = runner.invoke(app, ["verify", str(slice_package), "--bundle", "root"])
    assert result.exit_code == 1, result.output
    assert "FAIL browser webgpu/fp32 [root (override of webgpu) bundle]" in result.stdout
    assert "does not match actual shape of {1,1,1,30}" in result.stdout
    # wasm passed, and the webgpu-kernels check of fp32 where the stage is installed
    kernels = webgpu_kernels.unavailable_reason() is None
    assert f"FAILED: {2 if kernels else 1} passed, 1 failed, 0 not verifiable" in result.stdout


def test_verify_a_folder_without_manifest_is_bad_input(tmp_path: Path) -> None:
    result = runner.invoke(app, ["verify", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a package (no manifest.json); `pack verify` takes a package folder made by `pack build`" in result.output


def test_verify_an_unknown_bundle_is_bad_input(slice_package: Path) -> None:
    result = runner.invoke(app, ["verify", str(slice_package), "--bundle", "jspi2"])
    assert result.exit_code == 2
    assert "--bundle jspi2: unknown; choose one of root, wasm, webgpu" in result.output


@pytest.mark.browser
def test_verify_two_runtimes_side_by_side(slice_package: Path, tmp_path: Path) -> None:
    from test_browser_runtime import _local_build

    local = _local_build(tmp_path)
    result = runner.invoke(app, ["verify", str(slice_package), "--runtime", "1.30.0", "--runtime", str(local)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # one line per check per runtime, then the speed table with a column per runtime
    assert sum("[1.30.0        ]  ok   browser webgpu/fp32" in line for line in lines) == 1
    assert sum("[1.30.0 (local)]  ok   browser wasm/fp32" in line for line in lines) == 1
    header = next(index for index, line in enumerate(lines) if line.startswith("speed (ms, production settings"))
    assert lines[header + 1].split()[:4] == ["run", "1.30.0", "1.30.0", "(local)"]
    assert [line.split()[0] for line in lines[header + 2: header + 4]] == ["webgpu/fp32", "wasm/fp32"]
    assert lines[-1] == "1.30.0: PASSED (2 passed, 0 failed, 0 not verifiable); 1.30.0 (local): PASSED (2 passed, 0 failed, 0 not verifiable)"
    document = json.loads(runner.invoke(app, ["verify", str(slice_package), "--runtime", str(local), "--json"]).stdout)
    assert [r["runtime"] for r in document["runtimes"]] == ["1.30.0 (local)"]
    assert document["runtimes"][0]["browser"]["runtime"] == {"version": "1.30.0", "shipped": False, "packageRuntime": "1.30.0", "path": str(local.resolve())}


def test_verify_refuses_a_bad_or_repeated_runtime(slice_package: Path) -> None:
    result = runner.invoke(app, ["verify", str(slice_package), "--runtime", "latest"])
    assert result.exit_code == 2
    assert "--runtime 'latest': neither an exact onnxruntime-web version" in result.output
    result = runner.invoke(app, ["verify", str(slice_package), "--runtime", "1.30.0", "--runtime", "1.30.0"])
    assert result.exit_code == 2 and "--runtime: the same runtime twice" in result.output


def test_verify_checks_against_the_bounds_in_the_manifest(slice_package: Path, tmp_path: Path) -> None:
    import shutil

    package = shutil.copytree(slice_package, tmp_path / "strict")
    manifest = json.loads((package / "manifest.json").read_text())
    impossible = {"max_abs": -1.0}  # no figure is below zero: the wasm check must fail on it
    manifest["thresholds"] = {"wasm": {"fp32": {"y": impossible}}}
    (package / "manifest.json").write_text(json.dumps(manifest))
    assert not (package / "report.json").exists()  # nothing but the manifest carries the bounds
    result = runner.invoke(app, ["verify", str(package), "--json"])
    assert result.exit_code == 1, result.output
    wasm = next(c for c in json.loads(result.stdout)["checks"] if c["ep"] == "wasm")
    assert wasm["threshold"] == impossible and wasm["status"] == "failed" and "max_abs" in wasm["detail"]



@pytest.mark.browser
def test_verify_marks_a_failure_the_build_refused_and_exits_0(slice_package: Path, tmp_path: Path) -> None:
    """A (bundle, EP, variant) that the build's runs refuse fails nothing in `pack verify`: the
    loader never runs it. Its failure is marked `refused`, naming the build's run (issue 28)."""
    import shutil

    package = shutil.copytree(slice_package, tmp_path / "refused")
    manifest = json.loads((package / "manifest.json").read_text())
    # both browser runs (they share the recorded bound) fail again here, as they failed in the build
    manifest["thresholds"] = {"wasm": {"fp32": {"y": {"max_abs": -1.0}}}}
    bundle = "webgpu"  # the desktop chain's bundle, which both runs load
    manifest["verification"]["runs"] += [{"stage": "browser", "bundle": bundle, "ep": ep, "variant": "fp32", "status": "failed", "detail": "y: max_abs 0 > -1"}
                                         for ep in ("webgpu", "wasm")]
    (package / "manifest.json").write_text(json.dumps(manifest))
    # the build's record said FAILED: the badge must show this verify's verdict, not the build's
    (package / "report.json").write_text(json.dumps({"name": manifest["name"], "passed": False, "checks": [], "source": {"uri": "slice.onnx", "sha256": None}}))
    result = runner.invoke(app, ["verify", str(package)])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if "wasm/fp32" in line and line.lstrip().startswith("refd"))
    assert f"refused by the build (browser fp32 ({bundle} bundle, wasm): failed: y: max_abs 0 > -1)" in line and "here: max_abs" in line
    assert result.stdout.splitlines()[-1].startswith("PASSED") and ", 0 failed," in result.stdout and "2 refused by the build" in result.stdout
    assert 'id="verdict">PASSED<' in (package / "report.html").read_text()  # the badge follows the exit code
