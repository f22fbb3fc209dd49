"""A model pinned whole: the graph and each external data file it names (Optimum-style exports),
by --sha256, a recipe's source.data_sha256 or the lock; --name for bare model files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from build_helpers import conv_model
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.lockfile import LockFile
from pipeline.progress import Progress
from pipeline.recipe import load_recipe_file
from pipeline.source import SourceRequest, fetch_source


def build(*args: str):
    return CliRunner().invoke(app, ["build", *args])


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def export(tmp_path) -> Path:
    """`model.onnx` + `model.onnx.data`, as Optimum writes them (onnx.save with external data)."""
    folder = tmp_path / "export"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(conv_model(), str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    assert (folder / "model.onnx.data").stat().st_size > 0
    return path


def change_data(model: Path) -> None:
    """Another weight, same size: what a re-export or a bad copy leaves beside an unchanged graph."""
    data = model.parent / "model.onnx.data"
    values = np.frombuffer(data.read_bytes(), dtype=np.float32).copy()
    values[0] += 1.0
    data.write_bytes(values.tobytes())


def test_sha256_pins_the_graph_and_each_data_file_and_name_names_the_package(export, tmp_path):
    out = tmp_path / "d"
    graph, data = sha(export), sha(export.parent / "model.onnx.data")
    # the graph's hash alone no longer passes for the whole model
    alone = build(str(export), "--sha256", graph, "--no-browser", "--out", str(out))
    assert alone.exit_code == 2
    assert f"model.onnx: its external data file model.onnx.data (sha256 {data}) is not pinned by --sha256; add --sha256 model.onnx.data={data}" in alone.output
    assert not out.exists() or not any(out.iterdir())
    whole = build(str(export), "--sha256", graph, "--sha256", f"model.onnx.data={data}", "--name", "tiny-conv", "--no-browser", "--out", str(out))
    assert whole.exit_code == 0, whole.output
    assert json.loads((out / "tiny-conv" / "report.json").read_text())["source"]["checked"] == "--sha256"
    assert not (out / "model").exists()
    change_data(export)
    changed = build(str(export), "--sha256", graph, "--sha256", f"model.onnx.data={data}", "--name", "tiny-conv", "--no-browser", "--out", str(tmp_path / "e"))
    assert changed.exit_code == 2
    assert f"error: {export.parent / 'model.onnx.data'}: external data of model.onnx has sha256 {sha(export.parent / 'model.onnx.data')}, --sha256 expects {data}" in changed.output
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())


@pytest.mark.parametrize(("args", "message"), [
    (["--sha256", "model.onnx.data=" + "a" * 64], "--sha256 model.onnx.data=HEX pins an external data file beside the graph; give the graph's --sha256 HEX with it"),
    (["--sha256", "a" * 64, "--sha256", "b" * 64], "the graph file's sha256 is given twice"),
    (["--sha256", "sub/model.onnx.data=" + "a" * 64, "--sha256", "a" * 64], "FILE must be the data file's name as the model names it"),
    (["--sha256", "x=abc"], "expected 64 hex digits, or FILE=<64 hex digits>"),
    (["--name", "Bad Name"], "--name 'Bad Name': expected a package name"),
])
def test_bad_pins_and_names_exit_2_naming_the_option(export, tmp_path, args, message):
    result = build(str(export), *args, "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_data_file_the_model_does_not_name_is_refused(export, tmp_path):
    result = build(str(export), "--sha256", sha(export), "--sha256", "weights.bin=" + "a" * 64, "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 2
    assert "--sha256: model.onnx names no external data file weights.bin; the files it names: model.onnx.data" in result.output


def test_name_is_for_bare_models(tmp_path):
    result = build("gtcrn", "--name", "other", "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 2 and "--name names the package of a bare model" in result.output


def _request(export: Path, **facts) -> SourceRequest:
    # a recipe whose file is remote and unpinned, built from a copy downloaded by other means: the
    # lock pins it (pipeline/source fetch_source), the data beside it too
    return SourceRequest(recipe_name="optimum", rebuild="pack build optimum.toml", uri=str(export), published_uri="https://example.invalid/model.onnx",
                         published_sha256=None, base_dir=export.parent, **facts)


def test_the_lock_pins_every_file_and_a_changed_data_file_exits_naming_it(export, tmp_path):
    lock = LockFile(tmp_path / "optimum.lock.json")
    first = fetch_source(_request(export), lock, Progress.quiet())
    assert first.checked_against == "pinned now"
    pin = json.loads(lock.path.read_text())["optimum"]["source"]
    data = export.parent / "model.onnx.data"
    assert pin["sha256"] == sha(export) and pin["data"] == {"model.onnx.data": {"sha256": sha(data), "size": data.stat().st_size}}
    assert fetch_source(_request(export), lock, Progress.quiet()).checked_against == "lock"
    change_data(export)
    with pytest.raises(PackError, match=f"{data}: external data of model.onnx has sha256 {sha(data)}, {lock.path} expects {pin['data']['model.onnx.data']['sha256']}"):
        fetch_source(_request(export), lock, Progress.quiet())


def test_a_lock_pin_from_before_data_pins_gains_them(export, tmp_path):
    lock = LockFile(tmp_path / "optimum.lock.json")
    lock.put("optimum", "source", {"uri": "https://example.invalid/model.onnx", "sha256": sha(export), "size": export.stat().st_size})
    assert fetch_source(_request(export), lock, Progress.quiet()).checked_against == "lock"
    assert set(json.loads(lock.path.read_text())["optimum"]["source"]["data"]) == {"model.onnx.data"}


def _recipe(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "optimum.toml"
    path.write_text(f'name = "optimum"\n[source]\n{source}\n')
    return path


def test_a_recipe_lists_its_data_files(export, tmp_path):
    data = export.parent / "model.onnx.data"
    recipe = load_recipe_file(_recipe(tmp_path, f'uri = "{export}"\nsha256 = "{sha(export)}"\ndata_sha256 = {{ "model.onnx.data" = "{sha(data)}" }}'))
    request = SourceRequest(recipe_name="optimum", rebuild="", uri=str(export), published_uri=str(export), published_sha256=recipe.source_sha256,
                            published_data_sha256=recipe.source_data_sha256)
    assert fetch_source(request, LockFile(None), Progress.quiet()).checked_against == "recipe"
    change_data(export)
    with pytest.raises(PackError, match="recipe key 'source.data_sha256' expects"):
        fetch_source(request, LockFile(None), Progress.quiet())


@pytest.mark.parametrize(("source", "message"), [
    ('uri = "m.onnx"\ndata_sha256 = { "m.onnx.data" = "' + "a" * 64 + '" }', "key 'source.data_sha256' pins the data beside the graph; set key 'source.sha256'"),
    ('uri = "m.onnx"\nsha256 = "' + "a" * 64 + '"\ndata_sha256 = { "m.onnx.data" = "xyz" }', "key 'source.data_sha256.m.onnx.data': expected 64 lowercase hex digits"),
    ('uri = "m.onnx"\nsha256 = "' + "a" * 64 + '"\ndata_sha256 = "abc"', "key 'source.data_sha256': expected a table"),
])
def test_recipe_data_pins_are_validated_naming_the_key(tmp_path, source, message):
    with pytest.raises(PackError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_recipe_file(_recipe(tmp_path, source))
