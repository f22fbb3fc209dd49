"""`pack inspect` (host side) and the argument errors of `pack inspect` / `pack diagnose`."""

from __future__ import annotations

import json

import onnx
from typer.testing import CliRunner

from graph_helpers import FFC_FLIP_MODEL, decoder_head_model, shape_if_model
from pipeline.cli import app

runner = CliRunner()


def test_inspect_json_reports_model_facts_hazards_and_repairs(tmp_path):
    path = tmp_path / "head.onnx"
    onnx.save(decoder_head_model(), path)
    result = runner.invoke(app, ["inspect", str(path), "--no-browser", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["ir_version"] == 8 and document["opsets"] == {"ai.onnx": 17}
    assert document["file_bytes"] == path.stat().st_size
    assert document["ops"] == {"ConvTranspose": 1, "Div": 1, "Greater": 1, "Mul": 1, "Squeeze": 1, "Where": 1}
    assert document["inputs"] == [{"name": "frames_in", "shape": [1, 8, 6], "dtype": "float32"}]
    assert document["outputs"] == [{"name": "audio", "shape": [36], "dtype": "float32"}]
    assert document["initializers"]["parameters"] == 8 * 16 + 36 + 2 + 3
    assert [(h["node"], h["hazard"], h["repair"]) for h in document["hazards"]] == [("Squeeze#1", "stale-shape", "stale_shapes")]
    assert document["repairs"] == ["stale_shapes"]
    assert document["webgpu_preferred_layout"] == {"as_is": "NCHW", "after_repairs": None}
    assert document["cpu_fallback"] is None


def test_inspect_human_output_has_one_line_per_finding(tmp_path):
    path = tmp_path / "branchy.onnx"
    onnx.save(shape_if_model(batch=1), path)
    result = runner.invoke(app, ["inspect", str(path), "--no-browser"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("branchy.onnx: IR 8, opset ai.onnx 17")
    assert "hazard if-known-condition at 'If#4' (If) on fp16-conversion" in next(l for l in lines if l.startswith("hazard "))
    assert "automatic repairs: fold_if" in lines
    assert "CPU fallback: not measured (--no-browser)" in lines


def test_inspect_the_exported_ffc_block(tmp_path):
    result = runner.invoke(app, ["inspect", str(FFC_FLIP_MODEL), "--no-browser", "--json"])
    document = json.loads(result.stdout)
    assert document["ops"]["DFT"] == 4 and document["repairs"] == ["neg_step_slice"]
    assert document["hazards"][0]["node"] == "node_flip"


def test_inspect_refuses_a_missing_or_broken_file_with_exit_2(tmp_path):
    result = runner.invoke(app, ["inspect", str(tmp_path / "nope.onnx"), "--no-browser"])
    assert result.exit_code == 2 and "no such file" in result.stderr
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    result = runner.invoke(app, ["inspect", str(broken), "--no-browser"])
    assert result.exit_code == 2 and "broken.onnx" in result.stderr


def test_diagnose_refuses_bad_arguments_before_starting_a_browser(tmp_path):
    path = tmp_path / "head.onnx"
    onnx.save(decoder_head_model(), path)
    for args, message in (
        (["--bundle", "all"], "--bundle all: unknown"),
        (["--ep", "webgl"], "--ep webgl: unknown"),
        (["--dim", "N"], "--dim 'N': expected NAME=SIZE"),
        (["--inputs", str(tmp_path / "missing.npz")], "no such file"),
    ):
        result = runner.invoke(app, ["diagnose", str(path), *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr


def test_diagnose_refuses_inputs_without_the_model_input(tmp_path):
    import numpy as np

    path = tmp_path / "head.onnx"
    onnx.save(decoder_head_model(), path)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, wrong=np.zeros(3, np.float32))
    result = runner.invoke(app, ["diagnose", str(path), "--inputs", str(npz)])
    assert result.exit_code == 2 and "frames_in" in result.stderr
