"""Every onnxruntime-web release from 1.20 to the newest builds and verifies: its files and the IR
versions it loads are read from the release itself (npm, then a probe under Node), never from a
table. One small model per release (the newest patch of each minor release npm lists)."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.runtime import max_ir_version, resolve_runtime
from tests.build_helpers import conv_model, save

pytestmark = [pytest.mark.network_registry]
runner = CliRunner()
# The releases up to 1.22 keep emscripten's glue module apart from the wasm bundle; these three
# also run through the package's loader in the browser (the newest is proven by every other test).
IN_BROWSER = ("1.20.1", "1.22.0", "1.23.2")


def releases_from_npm() -> list[str]:
    listed = json.loads(subprocess.run(["npm", "view", "onnxruntime-web", "versions", "--json"], capture_output=True, text=True, timeout=120, check=True).stdout)
    newest_patch: dict[tuple[int, int], tuple[int, str]] = {}
    for version in listed:
        match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
        if match and (int(match[1]), int(match[2])) >= (1, 20):
            minor, patch = (int(match[1]), int(match[2])), int(match[3])
            if patch >= newest_patch.get(minor, (-1, ""))[0]:
                newest_patch[minor] = (patch, version)
    return [version for _, version in sorted(newest_patch.values(), key=lambda item: tuple(map(int, item[1].split("."))))]


@pytest.fixture(scope="module")
def releases() -> dict[str, int]:
    """release -> the newest IR version it loads, installed (in parallel: mostly download time)."""
    versions = releases_from_npm()
    assert versions[0] == "1.20.1" and len(versions) >= 10, versions
    with ThreadPoolExecutor(max_workers=4) as pool:
        runtimes = list(pool.map(resolve_runtime, versions))
    return {runtime.version: max_ir_version(runtime) for runtime in runtimes}


def test_the_ir_ceiling_is_measured_per_release_and_never_falls(releases):
    ceilings = list(releases.values())
    assert ceilings == sorted(ceilings), releases
    # what the releases said when measured (also the onnxruntime-web release notes' IR support)
    assert releases["1.20.1"] == releases["1.22.0"] == 10 and releases["1.23.2"] == 11 and releases["1.30.0"] == 13


def _build(model_file: Path, version: str, out: Path, browser: bool) -> dict:
    recipe = model_file.with_name(f"release-{version}.toml")
    recipe.write_text(f'name = "release-{version.replace(".", "-")}"\nsource.uri = "{model_file.name}"\n[runtime]\nversion = "{version}"\n')
    args = ["build", str(recipe), "--out", str(out), "--json"] + ([] if browser else ["--no-browser"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, f"{version}: {result.output[-1500:]}"
    return json.loads(result.stdout)


def test_every_release_builds_with_its_own_files_and_ir_ceiling(releases, tmp_path):
    model = conv_model(channels=3)
    for node in model.graph.node:  # as exporters write them: 1.20's WebGPU Conv needs explicit dilations
        if node.op_type == "Conv":
            node.attribute.extend([onnx.helper.make_attribute("dilations", [1, 1]), onnx.helper.make_attribute("strides", [1, 1])])
    model.ir_version = 14  # newer than every release reads: each build caps it to its release's ceiling
    model_file = save(model, tmp_path / "m.onnx")
    for version, ceiling in releases.items():
        report = _build(model_file, version, tmp_path / "dist", browser=version in IN_BROWSER)
        package = tmp_path / "dist" / report["name"]
        manifest = json.loads((package / "manifest.json").read_text())
        assert manifest["runtime"]["version"] == version
        for variant in manifest["variants"].values():
            assert _ir_of(package / variant["model"]) == ceiling, (version, variant)
        installed = resolve_runtime(version)
        for key, bundle in manifest["runtime"]["bundles"].items():
            shipped = installed.bundles[key]
            assert (package / bundle["wasm"]).read_bytes() == shipped.wasm.read_bytes()
            assert ("glue" in bundle) == (shipped.glue is not None), (version, key)
        if version in IN_BROWSER:
            browser = [c for c in report["checks"] if c["stage"] == "browser"]
            assert {(c["ep"], c["variant"]) for c in browser if c["status"] == "passed"} >= {("wasm", "fp32"), ("webgpu", "fp32"), ("wasm", "fp16")}, (version, browser)


def _ir_of(path: Path) -> int:
    return onnx.load(str(path), load_external_data=False).ir_version
