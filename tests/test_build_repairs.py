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


def test_build_repairs_the_negative_step_slice_so_even_the_root_bundle_is_right(tmp_path):
    package, report = _build(tmp_path, auto=True)
    repair = next(step for step in report["steps"] if step["name"] == "neg_step_slice")
    assert repair["changed"] and repair["records"]
    assert {c["status"] for c in report["checks"] if c["stage"] == "browser"} == {"passed"}
    code, verified = _verify_on_root(package)
    assert code == 0, [c for c in verified["checks"] if c["status"] != "passed"]


def test_without_the_repair_the_root_bundle_is_wrong_on_webgpu(tmp_path):
    """The control: the shipped webgpu bundle is right either way; the root (JSEP) build is not."""
    package, report = _build(tmp_path, auto=False)
    assert not any(step["name"] == "neg_step_slice" for step in report["steps"])
    code, verified = _verify_on_root(package)
    failed = [c for c in verified["checks"] if c["status"] == "failed"]
    assert code == 1 and failed and all(c["ep"] == "webgpu" for c in failed)
