"""report.html of real builds, read in headless Chromium as a person would: an image model and an
audio model built by `pack build` (browser checks on SwiftShader), their reports opened at 400 px
and 1100 px, every check present, the pictures drawn and not blank, the WAV players playable.
Screenshots go to .cache/report-screenshots/ (git-ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loader_helpers import audio_model, image_model
from pipeline.cli import app
from report_helpers import check_report_page
from tests.build_helpers import save

pytestmark = pytest.mark.browser
runner = CliRunner()

# Every platform on the webgpu bundle: 4 browser runs per package instead of 6 (the wasm bundle's
# two runs add nothing the report draws differently).
RECIPE = """
name = "{name}"
description = "{description}"
license = "MIT"
variants = ["fp16", "fp32"]

[source]
uri = "{name}.onnx"

[inputs.x]
pattern = "{pattern}"
{extra}

[outputs.y]
kind = "{kind}"

[execution_providers]
desktop = ["webgpu", "wasm"]
apple-mobile = ["webgpu", "wasm"]
android = ["webgpu", "wasm"]
"""


def _build(root: Path, name: str, model, kind: str, pattern: str, description: str, extra: str = "") -> Path:
    save(model, root / f"{name}.onnx")
    recipe = root / f"{name}.toml"
    recipe.write_text(RECIPE.format(name=name, description=description, pattern=pattern, kind=kind, extra=extra))
    result = runner.invoke(app, ["build", str(recipe), "--out", str(root / "dist"), "--json"])
    assert result.exit_code == 0, result.output[-3000:]
    return root / "dist" / name


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report")
    return {
        "image": _build(root, "report-image", image_model(), "image", "image", "3x3 box blur of a 64x64 picture"),
        "audio": _build(root, "report-audio", audio_model(), "audio", "speech", "soft clipper tanh(3x), one second of speech-like sound",
                        extra="sample_rate = 16000"),
    }


@pytest.fixture(scope="module")
def browser():
    from pipeline.verify.browser.chromium import launch_browser

    with launch_browser() as launched:
        yield launched


def test_image_report_shows_input_reference_each_run_and_error_maps(packages, browser) -> None:
    package = packages["image"]
    facts = check_report_page(browser, package)
    assert facts["sections"] == [{"output": "y", "drawnAs": "image"}]
    assert facts["audio"] == []
    text = facts["text"]
    # what the browser produced, beside the host's fp16: runs with identical outputs share a row
    assert "cpu/fp16 (host)" in text and "wasm/fp32" in text and "webgpu/fp32" in text
    assert "3x3 box blur of a 64x64 picture" in text and "MIT" in text
    assert "PSNR" in text  # each run's figure in its caption
    # the fp16 variant on WebGPU cannot run here (no shader-f16): the check says so
    assert any(row["status"] == "not-verifiable" and row["run"] == "webgpu/fp16" for row in facts["rows"])


def test_audio_report_plays_the_reference_and_each_run(packages, browser) -> None:
    package = packages["audio"]
    facts = check_report_page(browser, package)
    assert facts["sections"] == [{"output": "y", "drawnAs": "waveform"}]
    labels = [a["label"] for a in facts["audio"]]
    assert labels[0] == "fp32 reference (host)" and len(labels) >= 2, labels
    assert all(abs(a["duration"] - 1.0) < 0.01 for a in facts["audio"])  # one second at the recipe's 16 kHz
    assert "SNR" in facts["text"]
    assert json.loads((package / "report.json").read_text())["sample_rate"] == 16000


def test_pack_report_rerenders_and_pack_verify_rewrites_the_report(packages, browser) -> None:
    package = packages["audio"]
    (package / "report.html").unlink()
    result = runner.invoke(app, ["report", str(package), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"report": str(package / "report.html")}
    assert "verified by</dt><dd>pack build" in (package / "report.html").read_text()
    result = runner.invoke(app, ["verify", str(package), "--json"])
    assert result.exit_code == 0, result.output
    html = (package / "report.html").read_text()
    assert "verified by</dt><dd>pack verify" in html
    # the browser outputs it compared are kept, and the published files are untouched
    manifest = json.loads((package / "manifest.json").read_text())
    assert "report.html" not in manifest["files"] and "report.data.npz" not in manifest["files"]
    facts = check_report_page(browser, package)
    assert len(facts["audio"]) >= 2
