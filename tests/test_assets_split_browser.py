"""`[assets] max_file_mib`: no file a package lists is larger. A sample over the cap ships in parts
(manifest `split`) that the real loader in Chromium fetches only when the sample is asked for (or
trials run), joins and checks; a file that cannot be split fails the build with one line."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, browser, pages  # noqa: F401 (fixtures)
from pipeline.assets.chunks import MIB
from pipeline.cli import app
from pipeline.package_server import running_server

pytestmark = pytest.mark.browser

CAP_MIB = 14  # over the sample (32 MiB: 16 in, 16 out), under the wasm bundle's .wasm (13.6 MiB in 1.30)
SHAPE = [1, 4, 1024, 1024]


def doubling_model() -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["x", "two"], ["y"], name="double")],
        "double",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, SHAPE)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, SHAPE)],
        [onnx.numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_recipe(folder: Path, name: str, model: onnx.ModelProto, max_file_mib: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / f"{name}.onnx"))
    recipe = folder / f"{name}.toml"
    recipe.write_text(
        f'name = "{name}"\nvariants = ["fp32"]\n\n[source]\nuri = "{name}.onnx"\n\n'
        '[inputs.x]\nrange = [-1.0, 1.0]\n\n'
        '[execution_providers]\ndesktop = ["wasm"]\napple-mobile = ["wasm"]\nandroid = ["wasm"]\n\n'
        f"[assets]\nmax_file_mib = {max_file_mib}\n"
    )
    return recipe


@pytest.fixture(scope="module")
def split_package(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("split")
    recipe = write_recipe(folder, "doubling", doubling_model(), CAP_MIB)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACK_WEBGPU_KERNELS", "off")
        result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--out", str(folder / "dist")])
    assert result.exit_code == 0, result.output[-3000:]
    return folder / "dist" / "doubling"


def test_no_listed_file_exceeds_the_cap_and_the_sample_ships_in_parts(split_package):
    manifest = json.loads((split_package / "manifest.json").read_text())
    assert max(entry["size"] for entry in manifest["files"].values()) <= CAP_MIB * MIB
    whole = manifest["sample"]["file"]
    split = manifest["split"][whole]
    assert whole not in manifest["files"] and len(split["parts"]) == 3 and split["size"] == 2 * 4 * np.prod(SHAPE)
    assert not (split_package / whole).exists() and all((split_package / part).is_file() for part in split["parts"])
    # npm and export list the parts, never the whole
    assert set(split["parts"]) <= set(json.loads((split_package / "package.json").read_text())["files"])
    # pack verify reads the joined sample back (host and browser: the runner page joins the parts too)
    result = CliRunner().invoke(app, ["verify", str(split_package), "--json"])
    assert result.exit_code == 0, result.output[-2000:]


SAMPLE_THEN_RUN = r"""
async () => {
  const model = window.__packModel;
  const { feeds, reference } = await model.sample();
  const outputs = await model.run(feeds);
  const y = outputs.y.data, want = reference.y.data;
  let differ = 0;
  for (let i = 0; i < want.length; i++) if (y[i] !== want[i]) differ++;
  return { x: feeds.x.data.length, y: want.length, differ, first: [feeds.x.data[0], y[0]] };
}
"""


def test_the_loader_fetches_the_parts_only_when_the_sample_is_asked_for(browser, pages, split_package):  # noqa: F811
    manifest = json.loads((split_package / "manifest.json").read_text())
    parts = manifest["split"][manifest["sample"]["file"]]["parts"]
    with running_server(split_package, {TEST_PREFIX: pages}) as server:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            # the measured choice too: one candidate here, so no trial and no sample (it used to be read up front)
            measured = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"prewarm": False, "select": "measured"}, "run": False})
            loaded = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"prewarm": False}, "run": False})
            assert measured["ok"] and loaded["ok"], (measured, loaded)
            assert measured["info"]["selection"]["mode"] == "measured" and measured["info"]["selection"]["note"] == "one candidate"
            fetched = [r.path.lstrip("/") for r in server.requests]
            assert not set(parts) & set(fetched), fetched  # the first result needs no sample
            ran = page.evaluate(SAMPLE_THEN_RUN)
        finally:
            context.close()
        fetched = [r.path.lstrip("/") for r in server.requests]
    assert sorted(p for p in fetched if p in parts) == sorted(parts)  # each part once, the whole never
    assert manifest["sample"]["file"] not in fetched
    assert ran["x"] == ran["y"] == np.prod(SHAPE) and ran["differ"] == 0, ran
    assert ran["first"][1] == 2 * ran["first"][0]


# npm as a CDN. jsDelivr serves an npm package's files up to 20 MB each (read as 10^6 bytes, the
# stricter reading) and packages up to 150 MB; unpkg states no per-file cap, so jsDelivr's bounds
# hold for both. Both serve a file at /npm/<name>@<version>/<path> (unpkg: /<name>@<version>/<path>)
# exactly as the tarball holds it: no .br copies, no Content-Encoding mapping of ours.
JSDELIVR_FILE_BYTES, JSDELIVR_PACKAGE_BYTES = 20_000_000, 150_000_000


def npm_tarball(package: Path) -> dict:
    """What `npm pack` puts in the tarball (npm's own reading of package.json `files`)."""
    result = subprocess.run(["npm", "pack", "--dry-run", "--json", "--ignore-scripts"], cwd=package, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(result.stdout)[0]


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm")
def test_the_npm_package_fits_the_cdns_caps_and_loads_through_base_url_from_their_path_layout(browser, pages, split_package, tmp_path):  # noqa: F811
    tarball = npm_tarball(split_package)
    files = {entry["path"]: entry["size"] for entry in tarball["files"]}
    manifest = json.loads((split_package / "manifest.json").read_text())
    assert set(manifest["files"]) | {"manifest.json", "package.json"} <= set(files) and not [path for path in files if path.endswith(".br")]
    assert max(files.values()) <= JSDELIVR_FILE_BYTES and tarball["unpackedSize"] <= JSDELIVR_PACKAGE_BYTES, (max(files.values()), tarball["unpackedSize"])
    # the CDN: the tarball's files at /npm/<name>@<version>/, nothing else
    base = f"npm/{tarball['name']}@{tarball['version']}/"
    for path in files:
        (tmp_path / base / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(split_package / path, tmp_path / base / path)
    with running_server(tmp_path, {TEST_PREFIX: pages}) as server:
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
            loaded = page.evaluate(LOAD_AND_RUN, {"base": server.url + base, "options": {"prewarm": False}, "run": False})
            assert loaded["ok"], loaded
            ran = page.evaluate(SAMPLE_THEN_RUN)
        finally:
            context.close()
        served = [r for r in server.requests if r.path.startswith("/" + base)]
    # a plain host: the loader asks once for a .br body, finds none (npm packages have none), and
    # asks for the decoded files from then on
    missed = [r.path for r in served if r.status == 404]
    with_br = [path for path, entry in manifest["files"].items() if entry.get("encodings", {}).get("br")]
    assert all(path.endswith(".br") for path in missed) and len(missed) < len(with_br), (missed, with_br)
    assert all(r.status == 200 and r.encoding is None for r in served if r.status != 404), [(r.path, r.status, r.encoding) for r in served if r.status != 200 or r.encoding]
    assert ran["x"] == ran["y"] == np.prod(SHAPE) and ran["differ"] == 0 and ran["first"][1] == 2 * ran["first"][0], ran


def many_small_constants_model() -> onnx.ModelProto:
    """x[1,250] plus 80 constants of 1000 bytes each: initializers too small to move out of the
    graph (pipeline/assets/chunks.py EXTERNAL_MIN_BYTES), so the graph alone is about 80 KB."""
    rng = np.random.default_rng(3)
    nodes, constants, previous = [], [], "x"
    for index in range(80):
        constants.append(onnx.numpy_helper.from_array(rng.normal(size=(1, 250)).astype(np.float32) / 100, f"c{index}"))
        output = "y" if index == 79 else f"a{index}"
        nodes.append(onnx.helper.make_node("Add", [previous, f"c{index}"], [output], name=f"add{index}"))
        previous = output
    graph = onnx.helper.make_graph(
        nodes, "constants",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 250])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 250])],
        constants,
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_file_that_cannot_be_split_fails_the_build_in_one_line(tmp_path):
    recipe = write_recipe(tmp_path, "constants", many_small_constants_model(), 0.0625)
    result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 2, result.output[-2000:]
    error = result.output.strip().splitlines()[-1]
    assert error.startswith("error: model.fp32.") and ".onnx: 0.08 MiB, over [assets] max_file_mib 0.0625 (the largest file a host serves: jsDelivr 20 MB" in error, error
    assert "a model's graph without its weights cannot be split" in error
    assert not (tmp_path / "dist" / "constants").exists()


@pytest.mark.parametrize("value", ["20", "0.01", "600", "true"])
def test_max_file_mib_is_validated(tmp_path, value):
    from pipeline.errors import PackError
    from pipeline.recipe import load_recipe_file

    recipe = write_recipe(tmp_path, "doubling", doubling_model(), 1)
    recipe.write_text(recipe.read_text().replace("max_file_mib = 1", f"max_file_mib = {value}"))
    if value == "20":
        assert load_recipe_file(recipe).max_file_mib == 20.0
        return
    with pytest.raises(PackError, match=r"key .assets\.max_file_mib.: expected a number of MiB"):
        load_recipe_file(recipe)
