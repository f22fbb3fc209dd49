"""Every onnxruntime-web release from 1.20 to the newest: its files and the IR versions it loads are
read from the release itself (npm, then a probe under Node that creates a wasm session on a model
stamped with each IR version), never from a table. The newest patch of each minor release npm
lists is installed and read; 1.22.0 (emscripten's glue module apart from the wasm bundle, the JSEP
WebGPU build, IR 10) is built and verified in the browser through its own package. The default
release is built and verified by every other browser test."""

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
from pipeline.manifest import file_parts
from pipeline.runtime import max_ir_version, resolve_runtime
from build_helpers import conv_model, save

pytestmark = [pytest.mark.network_registry]
runner = CliRunner()
# A release of the older layout, built and verified in the browser (each build of a new release
# brotli-compresses its runtime files once: about 2 minutes, so one release, not all of them).
IN_BROWSER = "1.22.0"


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


def test_every_release_is_read_from_its_package_with_its_measured_ir_ceiling(releases):
    for version in releases:
        runtime = resolve_runtime(version)
        assert set(runtime.bundles) == {"webgpu", "wasm", "root"}, version
        older_layout = tuple(map(int, version.split(".")[:2])) <= (1, 22)
        assert (runtime.bundles["wasm"].glue is not None) == older_layout, version
        for bundle in runtime.bundles.values():
            assert bundle.wasm.is_file() and bundle.wasm.parent == bundle.module.parent, (version, bundle)


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


@pytest.mark.slow
def test_an_older_layout_release_builds_and_verifies_in_the_browser(releases, tmp_path):
    model = conv_model(channels=3)
    for node in model.graph.node:  # as exporters write them: 1.20's WebGPU Conv needs explicit dilations
        if node.op_type == "Conv":
            node.attribute.extend([onnx.helper.make_attribute("dilations", [1, 1]), onnx.helper.make_attribute("strides", [1, 1])])
    model.ir_version = 14  # newer than the release reads: the build caps it to the release's ceiling
    model_file = save(model, tmp_path / "m.onnx")
    version, ceiling = IN_BROWSER, releases[IN_BROWSER]
    report = _build(model_file, version, tmp_path / "dist", browser=True)
    package = tmp_path / "dist" / report["name"]
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["runtime"]["version"] == version
    for variant in manifest["variants"].values():
        assert _ir_of(package / variant["model"]) == ceiling, variant
    installed = resolve_runtime(version)
    for key, bundle in manifest["runtime"]["bundles"].items():  # a .wasm over [assets] max_file_mib ships in parts
        assert b"".join((package / part).read_bytes() for part in file_parts(manifest, bundle["wasm"])) == installed.bundles[key].wasm.read_bytes()
        assert ("glue" in bundle) == (installed.bundles[key].glue is not None), key
    browser = [c for c in report["checks"] if c["stage"] == "browser"]
    passed = {(c["ep"], c["variant"], c["bundle"]) for c in browser if c["status"] == "passed"}
    # both bundles (the webgpu bundle's wasm EP too), both precisions on wasm, fp32 on WebGPU
    assert passed >= {("wasm", "fp32", "wasm"), ("wasm", "fp16", "wasm"), ("wasm", "fp32", "webgpu"), ("webgpu", "fp32", "webgpu")}, browser


def _ir_of(path: Path) -> int:
    return onnx.load(str(path), load_external_data=False).ir_version
