"""report.html of a real build, read in headless Chromium as a person would: `pack build` (browser
checks on SwiftShader) of a model with an image output and an audio output (one build, both kinds
drawn: the cost of one package), its report opened at 400 px and 1100 px, every check present, the
pictures drawn and not blank, the WAV players playable. Screenshots go to .cache/report-screenshots/
(git-ignored). GTCRN's report (spectrum frames, after `pack verify`) is checked in
test_browser_gtcrn.py, on the package that module builds anyway."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from pipeline.cli import app
from report_helpers import check_report_page

pytestmark = pytest.mark.browser
runner = CliRunner()

# Every platform on the webgpu bundle: 4 browser runs instead of 6 (the wasm bundle's two runs add
# nothing the report draws differently).
RECIPE = """
name = "report-demo"
description = "3x3 box blur of a 64x64 picture, and a soft clipper tanh(3x) on one second of sound"
license = "MIT"
variants = ["fp16", "fp32"]

[source]
uri = "report-demo.onnx"

[inputs.picture]
pattern = "image"

[inputs.sound]
pattern = "speech"
sample_rate = 16000

[outputs.blurred]
kind = "image"

[outputs.clipped]
kind = "audio"

[execution_providers]
desktop = ["webgpu", "wasm"]
apple-mobile = ["webgpu", "wasm"]
android = ["webgpu", "wasm"]
"""


def image_and_audio_model() -> onnx.ModelProto:
    """blurred = box_blur3x3(picture) per channel, [1, 3, 64, 64]; clipped = tanh(3 sound), [1, 16000]."""
    kernel = np.full((3, 1, 3, 3), 1 / 9, dtype=np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["picture", "kernel"], ["blurred"], group=3, pads=[1, 1, 1, 1], name="blur"),
            helper.make_node("Mul", ["sound", "gain"], ["loud"], name="gain"),
            helper.make_node("Tanh", ["loud"], ["clipped"], name="clip"),
        ],
        "report_demo",
        [helper.make_tensor_value_info("picture", TensorProto.FLOAT, [1, 3, 64, 64]),
         helper.make_tensor_value_info("sound", TensorProto.FLOAT, [1, 16000])],
        [helper.make_tensor_value_info("blurred", TensorProto.FLOAT, [1, 3, 64, 64]),
         helper.make_tensor_value_info("clipped", TensorProto.FLOAT, [1, 16000])],
        [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(np.array(3, np.float32), "gain")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    onnx.save(image_and_audio_model(), str(root / "report-demo.onnx"))
    (root / "report-demo.toml").write_text(RECIPE)
    result = runner.invoke(app, ["build", str(root / "report-demo.toml"), "--out", str(root / "dist"), "--json"])
    assert result.exit_code == 0, result.output[-3000:]
    return root / "dist" / "report-demo"


@pytest.fixture(scope="module")
def browser():
    from pipeline.verify.browser.chromium import launch_browser

    with launch_browser() as launched:
        yield launched


def test_report_shows_every_check_pictures_of_each_output_and_plays_the_sound(package, browser) -> None:
    facts = check_report_page(browser, package)
    assert facts["sections"] == [{"output": "blurred", "drawnAs": "image"}, {"output": "clipped", "drawnAs": "waveform"}]
    text = facts["text"]
    assert "3x3 box blur of a 64x64 picture" in text and "MIT" in text
    # what the browser produced, beside the host's fp16 (runs with identical outputs share a row)
    assert "cpu/fp16 (host)" in text and "wasm/fp32" in text and "webgpu/fp32" in text
    assert "PSNR" in text and "SNR" in text  # each run's figure in its caption
    # the reference and each distinct run can be heard: one second at the recipe's 16 kHz
    labels = [a["label"] for a in facts["audio"]]
    assert labels[0] == "fp32 reference (host)" and len(labels) >= 2, labels
    assert all(abs(a["duration"] - 1.0) < 0.01 for a in facts["audio"])
    # fp16 on WebGPU cannot run here (no shader-f16): its checks say so, among the first rows
    assert any(row["status"] == "not-verifiable" and row["run"] == "webgpu/fp16" for row in facts["rows"])
    report = json.loads((package / "report.json").read_text())
    assert report["sample_rate"] == 16000
    manifest = json.loads((package / "manifest.json").read_text())
    assert not {"report.html", "report.data.npz"} & set(manifest["files"])  # never published by default
    # the players of what the browser itself produced (kept by its checks in report.data.npz)
    html = (package / "report.html").read_text()
    browser_runs = [label for label in re.findall(r'<audio [^>]*data-label="([^"]+)"', html) if "wasm/" in label or "webgpu/" in label]
    assert browser_runs, "no player for a browser run"
