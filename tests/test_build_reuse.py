"""An unchanged rebuild reuses the stored package of the build with the same inputs: byte-identical
files (manifest and report included), no stage re-run; any input that changes the result builds again."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnx.numpy_helper
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from build_helpers import conv_model, save

runner = CliRunner()


def build(*args: str):
    return runner.invoke(app, ["build", *args])


def files_of(package: Path) -> dict[str, bytes]:
    return {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


def reused_model():
    return conv_model(channels=5)  # no other test builds these bytes: the stored builds are this file's


@pytest.fixture
def model_file(tmp_path) -> Path:
    return save(reused_model(), tmp_path / "reused-conv.onnx")


def _must_not_run(*args, **kwargs):
    raise AssertionError("a stage ran although the stored build has the same inputs")


def test_an_unchanged_rebuild_links_the_stored_package_byte_for_byte(model_file, tmp_path, monkeypatch):
    import pipeline.build

    first = build(str(model_file), "--no-browser", "--out", str(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    for stage in ("make_variants", "write_models", "_host_verify", "webgpu_kernel_stage", "make_feeds"):
        monkeypatch.setattr(pipeline.build, stage, _must_not_run)
    again = build(str(model_file), "--no-browser", "--out", str(tmp_path / "b"))
    assert again.exit_code == 0, again.output
    assert "unchanged: the inputs match the stored build" in again.output
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")
    # in place, over the same package: still the same bytes, and nothing left beside it
    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["reused-conv"]
    # --json prints the stored report
    as_json = build(str(model_file), "--no-browser", "--json", "--out", str(tmp_path / "c"))
    assert json.loads(as_json.stdout) == json.loads((tmp_path / "a" / "reused-conv" / "report.json").read_text())


@pytest.mark.parametrize("change", ["source bytes", "recipe key", "pack setting", "option", "--no-reuse"])
def test_any_input_that_changes_the_result_builds_again(model_file, tmp_path, monkeypatch, change):
    import pipeline.build

    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    ran = []
    real = pipeline.build.make_variants
    monkeypatch.setattr(pipeline.build, "make_variants", lambda *a, **k: ran.append(1) or real(*a, **k))
    args = [str(model_file), "--no-browser", "--out", str(tmp_path / "b")]
    if change == "source bytes":
        model = reused_model()
        weights = model.graph.initializer[0]  # halved: zeros would make the reference degenerate (not-verifiable)
        weights.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weights) / 2, weights.name))
        save(model, model_file)
    elif change == "recipe key":
        recipe = tmp_path / "reused-conv.toml"
        recipe.write_text(f'source.uri = "{model_file.name}"\nvariants = ["fp32"]\n')
        args[0] = str(recipe)
    elif change == "pack setting":
        monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    elif change == "option":
        args += ["--input", "x=1x3x16x16"]
    else:
        args.append("--no-reuse")
    result = build(*args)
    assert result.exit_code == 0, result.output
    assert ran == [1] and "unchanged:" not in result.output


def test_a_failed_build_is_never_reused(model_file, tmp_path):
    recipe = tmp_path / "strict.toml"
    # fp16 refused and required: the package fails (a refused variant alone would not fail it)
    recipe.write_text(f'source.uri = "{model_file.name}"\n[outputs.y.fp16]\nmax_abs = 0.0\n[verify]\nrequire = ["fp16"]\n')
    for out in ("a", "b"):
        result = build(str(recipe), "--no-browser", "--out", str(tmp_path / out))
        assert result.exit_code == 1 and "unchanged:" not in result.output
