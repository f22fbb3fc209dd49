"""`pack diagnose` end to end in headless Chromium (its own browser: a separate module so no other
Playwright instance is open in this process while the command starts one)."""

from __future__ import annotations

import json

import onnx
import pytest
from typer.testing import CliRunner

from graph_helpers import neg_slice_model
from pipeline.cli import app
from pipeline.graph import repairs

pytestmark = pytest.mark.browser


def test_pack_diagnose_cli_exits_1_and_names_the_node(tmp_path):
    path = tmp_path / "reverse.onnx"
    onnx.save(neg_slice_model(), path)
    result = CliRunner().invoke(app, ["diagnose", str(path), "--bundle", "root", "--ep", "webgpu", "--json"])
    assert result.exit_code == 1, result.output
    run, = json.loads(result.stdout)["runs"]
    assert run["node"] == "Slice#0"
    repaired = tmp_path / "repaired.onnx"
    onnx.save(repairs.get("neg_step_slice")(neg_slice_model()).model, repaired)
    result = CliRunner().invoke(app, ["diagnose", str(repaired), "--bundle", "root", "--ep", "webgpu"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "root bundle, webgpu EP: agrees with onnxruntime on the host"
