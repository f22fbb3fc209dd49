"""Repairs inside `pack build`, proven in the browser: an FFC block exported from PyTorch the way
LaMa ports mirror the spectrum (a negative-step Slice with the exporters' INT64_MIN end)."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

pytestmark = pytest.mark.browser
runner = CliRunner()
FFC_FLIP = Path(__file__).resolve().parent / "data" / "ffc_block_flip.onnx"


def _build(tmp_path: Path, auto: bool) -> tuple[Path, dict]:
    source = tmp_path / "ffc.onnx"
    shutil.copyfile(FFC_FLIP, source)
    recipe = tmp_path / f"ffc-{'auto' if auto else 'raw'}.toml"
    recipe.write_text(f'source.uri = "ffc.onnx"\nvariants = ["fp32"]\n[repairs]\nauto = {str(auto).lower()}\n')
    result = runner.invoke(app, ["build", str(recipe), "--json", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 0, result.output
    return tmp_path / "dist" / recipe.stem, json.loads(result.stdout)


def _verify_on_root(package: Path) -> tuple[int, dict]:
    result = runner.invoke(app, ["verify", str(package), "--bundle", "root", "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
def test_build_repairs_the_negative_step_slice_so_even_the_root_bundle_is_right(tmp_path):
    package, report = _build(tmp_path, auto=True)
    repair = next(step for step in report["steps"] if step["name"] == "neg_step_slice")
    assert repair["changed"] and repair["records"]
    assert {c["status"] for c in report["checks"] if c["stage"] == "browser"} == {"passed"}
    code, verified = _verify_on_root(package)
    assert code == 0, [c for c in verified["checks"] if c["status"] != "passed"]


@pytest.mark.slow
def test_without_the_repair_the_root_bundle_is_wrong_on_webgpu(tmp_path):
    """The control: the shipped webgpu bundle is right either way; the root (JSEP) build is not."""
    package, report = _build(tmp_path, auto=False)
    assert not any(step["name"] == "neg_step_slice" for step in report["steps"])
    code, verified = _verify_on_root(package)
    failed = [c for c in verified["checks"] if c["status"] == "failed"]
    assert code == 1 and failed and all(c["ep"] == "webgpu" for c in failed)


@pytest.mark.slow
def test_stale_shapes_in_a_decoder_head_are_repaired_before_the_browser_sees_them(tmp_path):
    """A WavTokenizer-style ISTFT head whose Squeeze carries a stale 3-D shape: every onnxruntime-web
    bundle refuses the session; the build's automatic stale_shapes repair makes it pass."""
    import onnx

    from graph_helpers import decoder_head_model

    model = decoder_head_model(stale=True)
    onnx.save(model, str(tmp_path / "head.onnx"))
    for auto in (False, True):
        recipe = tmp_path / f"head-{'auto' if auto else 'raw'}.toml"
        recipe.write_text(f'source.uri = "head.onnx"\nvariants = ["fp32"]\n[repairs]\nauto = {str(auto).lower()}\n[outputs.audio]\nkind = "audio"\n')
        result = runner.invoke(app, ["build", str(recipe), "--json", "--out", str(tmp_path / "dist")])
        report = json.loads(result.stdout)
        browser = [c for c in report["checks"] if c["stage"] == "browser"]
        if auto:
            assert result.exit_code == 0, [c.get("detail") for c in browser if c["status"] != "passed"]
            assert next(s for s in report["steps"] if s["name"] == "stale_shapes")["changed"]
        else:
            assert result.exit_code == 1
            assert browser and all(c["status"] == "failed" for c in browser)
            assert any("ShapeInferenceError" in (c.get("detail") or "") for c in browser)
